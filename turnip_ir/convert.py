"""Conversions between the Python graphs (`TaskGraph`, `MemGraph`) and `turnip` IR modules.

Passes convert a module once on entry and once on exit, never text. Identity survives the trip:
a taskgraph id is the value's name when it is a valid SSA name (`%x`), and a `task` property
otherwise. A memgraph reads like its taskgraph: a node is named after its task (`%y`), an offload
or reload after the task it copies (`%y.offload1`, `%y.reload1`, `%y.reload2`), and the op carries
`task` only where its name cannot say it. Node N is the N-th vertex op (from 0), so ids map to
values by position; an op whose id is not its position carries `node = N`.
The module's attributes hold `turnip.devices` and, for a memgraph, `turnip.budget`.
"""

from __future__ import annotations

import re

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp, StringAttr, f64, i1, i64
from xdsl.ir import Block, Operation, Region, SSAValue

from turnip_ir.dialect import (
    KERNEL_OPS,
    InputOp,
    KernelOp,
    MemLocAttr,
    MoveOp,
    OffloadOp,
    OutputOp,
    ReloadOp,
    StorageAttr,
    TokenType,
    TurnipOp,
    shape_and_dtype,
    tensor_type,
)
from turnip_ir.errors import InputError
from turnip_ir.kernels import attribute_types
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.memgraph_types import check_types
from turnip_ir.taskgraph import TaskGraph, TaskNode

DEVICES_ATTR = "turnip.devices"
BUDGET_ATTR = "turnip.budget"
_PLAIN_NAME = re.compile(r"[A-Za-z_$.-][\w$.-]*", re.ASCII)  # MLIR value names are ASCII
_SUFFIX = re.compile(r"_\d+$")


def _safe_hint(text: str) -> str:
    hint = _SUFFIX.sub(lambda m: "." + m.group(0)[1:], re.sub(r"[^\w$.-]", ".", text, flags=re.ASCII))
    return hint if _PLAIN_NAME.fullmatch(hint) else f"v{hint}"


def _module(devices: int, budget: int | None, ops: list[Operation]) -> ModuleOp:
    attrs = {DEVICES_ATTR: IntegerAttr(devices, i64)}
    if budget is not None:
        attrs[BUDGET_ATTR] = IntegerAttr(budget, i64)
    return ModuleOp(Region(Block(ops)), attributes=attrs)


def _kernel_props(attrs: dict) -> dict:
    """IR properties for kernel attributes, typed by the kernel table (a bool is not an int here)."""
    kinds = attribute_types()
    props = {}
    for key, value in attrs.items():
        kind = kinds.get(key, type(value))
        if kind is str:
            props[key] = StringAttr(value)
        elif kind is bool:
            props[key] = IntegerAttr(int(value), i1)
        elif kind is int:
            props[key] = IntegerAttr(value, i64)
        else:
            props[key] = FloatAttr(float(value), f64)
    return props


def _vertex_op(op: str, kernel: str | None, inputs, deps, redundant, result_type, props, token: bool) -> TurnipOp:
    """Build one vertex op; `props` holds already-made attributes (device, loc, storage, task, ...).
    A memgraph op yields a token beside its tensor, a taskgraph op its tensor alone."""
    results = [result_type, [TokenType()] if token else []]
    if op == "input":
        return InputOp.build(result_types=results, properties=props)
    segments = [list(inputs), list(deps), list(redundant)]
    cls = {"move": MoveOp, "offload": OffloadOp, "reload": ReloadOp}.get(op) or KERNEL_OPS[kernel]
    return cls.build(operands=segments, result_types=results, properties=props)


def _name(op: TurnipOp, hint: str) -> None:
    op.result.name_hint = hint
    if op.token is not None:
        op.token.name_hint = f"{hint}t"


# ----- taskgraph ----------------------------------------------------------------------------------------


def taskgraph_to_ir(graph: TaskGraph) -> ModuleOp:
    values: dict[str, SSAValue] = {}
    ops: list[Operation] = []
    for node in graph.nodes.values():
        props: dict = {}
        if node.device is not None:
            props["device"] = IntegerAttr(node.device, i64)
        plain = _PLAIN_NAME.fullmatch(node.id) and not _SUFFIX.search(node.id)
        if not plain:
            props["task"] = StringAttr(node.id)
        props.update(_kernel_props(node.attrs))
        kind = node.op if node.op in ("input", "move") else "kernel"
        op = _vertex_op(kind, node.op, [values[i] for i in node.inputs], [], [], tensor_type(node.shape, node.dtype), props, False)
        _name(op, node.id if plain else _safe_hint(node.id))
        values[node.id] = op.results[0]
        ops.append(op)
    if graph.outputs:
        ops.append(OutputOp.build(operands=[[values[i] for i in graph.outputs]]))
    return _module(graph.devices, None, ops)


def _module_int(module: ModuleOp, name: str, required: bool = True) -> int | None:
    attr = module.attributes.get(name)
    if attr is None:
        if required:
            raise InputError(f"module needs the attribute {name}")
        return None
    if not isinstance(attr, IntegerAttr):
        raise InputError(f"module attribute {name} must be an integer")
    return attr.value.data


def module_devices(module: ModuleOp) -> int:
    """`turnip.devices`, or one more than the highest device any op names when the attribute is absent."""
    if DEVICES_ATTR in module.attributes:
        return _module_int(module, DEVICES_ATTR)
    used = [0]
    for op in module.ops:
        if isinstance(op, TurnipOp):
            used.append(op.loc.device.data if op.loc is not None else op.device.value.data if op.device is not None else 0)
    return max(used) + 1


def is_memgraph(module: ModuleOp) -> bool:
    return BUDGET_ATTR in module.attributes


def _task_ids(module: ModuleOp) -> dict[SSAValue, str]:
    """The taskgraph id of each vertex value: its `task` property, else its name, else a fresh one."""
    ids: dict[SSAValue, str] = {}
    taken: set[str] = set()
    for index, op in enumerate(module.ops):
        if not isinstance(op, TurnipOp):
            continue
        if op.task is not None:
            ident = op.task.data
        else:
            base = op.result.name_hint or f"t{index}"
            ident, k = base, 0
            while ident in taken:  # the printer wrote a repeated name as name_1, name_2, ...
                k += 1
                ident = f"{base}_{k}"
        if ident in taken:
            raise InputError(f"{op.name}: duplicate task id '{ident}'")
        taken.add(ident)
        ids[op.result] = ident
    return ids


def taskgraph_from_ir(module: ModuleOp) -> TaskGraph:
    graph = TaskGraph(module_devices(module))
    ids = _task_ids(module)
    for op in module.ops:
        if isinstance(op, OutputOp):
            graph.output(*[ids[v] for v in op.values])
        elif isinstance(op, TurnipOp) and (op.holds_memory() or op.COPY or op.node is not None):
            raise InputError(
                f"{op.label()}: a taskgraph has no locations, storage, offloads, reloads or node ids"
                " (a memgraph does: give the module a turnip.budget)"
            )
        elif isinstance(op, TurnipOp):
            shape, dtype = shape_and_dtype(op.result.type)
            if shape is None:
                raise InputError(f"{op.label()}: a taskgraph tensor needs a float element type, not {op.result.type}")
            device = op.device.value.data if op.device is not None else None
            inputs = tuple(ids[v] for v in _data_operands(op))
            kind = "input" if isinstance(op, InputOp) else "move" if isinstance(op, MoveOp) else op.KERNEL
            attrs = op.kernel_attrs() if isinstance(op, KernelOp) else {}
            graph.nodes[ids[op.result]] = TaskNode(ids[op.result], kind, inputs, shape, dtype, device, attrs)
    return graph


def _data_operands(op: TurnipOp) -> list[SSAValue]:
    if isinstance(op, KernelOp):
        return list(op.ins)
    if isinstance(op, InputOp):
        return []
    return [op.input]


# ----- memgraph -----------------------------------------------------------------------------------------


def memgraph_to_ir(graph: MemGraph) -> ModuleOp:
    ops: dict[int, TurnipOp] = {}
    names = _MemNames()
    for position, node in enumerate(graph.nodes):
        hint, says_task = names.name(node)
        props = _mem_props(node, says_task)
        if node.id != position:
            props["node"] = IntegerAttr(node.id, i64)
        op = _vertex_op(
            node.op,
            node.kernel,
            [ops[i].result for i in node.inputs],
            [ops[i].token for i in node.mem_deps],
            [ops[i].token for i in node.redundant_deps],
            _mem_type(node, ops),
            props,
            True,
        )
        _name(op, hint)
        ops[node.id] = op
    body: list[Operation] = list(ops.values())
    if graph.outputs:
        body.append(OutputOp.build(operands=[[ops[i].result for i in graph.outputs.values()]]))
    return _module(graph.devices, graph.budget, body)


class _MemNames:
    """Value names for memgraph nodes: the task's (`y`), or a copy's (`y.offload1`, `y.reload2`)."""

    def __init__(self) -> None:
        self.copies: dict[tuple[str, str], int] = {}
        self.taken: set[str] = set()

    def name(self, node: MemNode) -> tuple[str, bool]:
        """The node's value name, and whether reading the name back gives its task. It does not when
        the task is no plain SSA name, or when an earlier value took the name: the printer then writes
        `y_1`, and the op carries `task`."""
        plain = bool(_PLAIN_NAME.fullmatch(node.task)) and not _SUFFIX.search(node.task)
        hint = node.task if plain else _safe_hint(node.task)
        if node.op in ("offload", "reload"):
            count = self.copies.get((node.task, node.op), 0) + 1
            self.copies[(node.task, node.op)] = count
            hint = f"{hint}.{node.op}{count}"
        says_task = plain and hint not in self.taken
        self.taken.update((hint, f"{hint}t"))  # the token's name too: a task may be called `yt`
        return hint, says_task


def _mem_type(node: MemNode, ops: dict[int, TurnipOp]):
    """The node's tensor type; an untyped node (no shape in the JSON) is `tensor<Nxi8>` of its region."""
    typed = node.shape is not None and node.dtype is not None
    if node.op in ("move", "offload", "reload"):
        source = ops[node.inputs[0]].result.type  # a copy has its source's type
        if typed and source != tensor_type(node.shape, node.dtype):
            raise InputError(
                f"{node.label()}: type {tensor_type(node.shape, node.dtype)} differs from its input "
                f"node {node.inputs[0]}'s {source} (give both the same shape and dtype)"
            )
        return source
    if typed:
        return tensor_type(node.shape, node.dtype)
    region = node.loc or node.storage
    return tensor_type(None, None, region[1] if region else 0)


def _mem_props(node: MemNode, says_task: bool) -> dict:
    props: dict = {} if says_task else {"task": StringAttr(node.task)}
    if node.loc is not None:
        props["loc"] = MemLocAttr.get(node.device, *node.loc)
    if node.storage is not None:
        props["storage"] = StorageAttr.get(*node.storage)
    if node.device is not None and (node.loc is None or node.op == "move"):
        props["device"] = IntegerAttr(node.device, i64)
    props.update(_kernel_props(node.attrs))
    return props


def _node_ids(module: ModuleOp) -> dict[SSAValue, int]:
    """Each vertex value's node id: the op's `node` property, else its position among the vertex ops."""
    ids: dict[SSAValue, int] = {}
    owners: dict[int, TurnipOp] = {}
    for position, op in enumerate(op for op in module.ops if isinstance(op, TurnipOp)):
        node = op.node.value.data if op.node is not None else position
        if node in owners:
            raise InputError(f"{op.label()}: node id {node} is also {owners[node].label()}'s (give each op its own `node`)")
        owners[node] = op
        ids[op.result] = node
    return ids


def _mem_tasks(module: ModuleOp) -> dict[SSAValue, str]:
    """Each vertex value's task: the op's `task` property, else from its name, else a fresh `tN`."""
    ops = [op for op in module.ops if isinstance(op, TurnipOp)]
    return {op.result: op.task_id() or f"t{index}" for index, op in enumerate(ops)}


def memgraph_from_ir(module: ModuleOp) -> MemGraph:
    graph = MemGraph(module_devices(module), _module_int(module, BUDGET_ATTR))
    ids = _node_ids(module)
    tasks = _mem_tasks(module)
    token_ids = {op.token: ids[op.result] for op in module.ops if isinstance(op, TurnipOp) and op.token is not None}
    made: dict[int, MemNode] = {}
    for op in module.ops:
        if isinstance(op, OutputOp):
            for v in op.values:
                graph.outputs[made[ids[v]].task] = ids[v]
        elif isinstance(op, TurnipOp):
            node = graph.add(_mem_node(op, ids, tasks, token_ids, made))
            made[node.id] = node
    check_types(graph)  # the dialect's verifiers check typed ops already; this is the path every reader shares
    return graph


def _mem_node(op: TurnipOp, ids, tasks, token_ids, made: dict[int, MemNode]) -> MemNode:
    shape, dtype = shape_and_dtype(op.result.type)
    loc = (op.loc.offset.data, op.loc.size.data) if op.loc is not None else None
    device = op.loc.device.data if op.loc is not None else op.device.value.data if op.device is not None else None
    inputs = tuple(ids[v] for v in _data_operands(op))
    if isinstance(op, OffloadOp) and device is None:
        device = made[inputs[0]].device
    storage = getattr(op, "storage", None)
    kind = {InputOp: "input", MoveOp: "move", OffloadOp: "offload", ReloadOp: "reload"}.get(type(op), "kernel")
    return MemNode(
        id=ids[op.result],
        op=kind,
        task=tasks[op.result],
        device=device,
        loc=loc,
        storage=(storage.offset.data, storage.size.data) if storage is not None else None,
        inputs=inputs,
        mem_deps=tuple(token_ids[t] for t in getattr(op, "deps", ())),
        kernel=op.KERNEL if isinstance(op, KernelOp) else None,
        shape=shape,
        dtype=dtype,
        attrs=op.kernel_attrs() if isinstance(op, KernelOp) else {},
        redundant_deps=tuple(token_ids[t] for t in getattr(op, "redundant", ())),
    )


def replace_module(module: ModuleOp, new: ModuleOp) -> None:
    """Swap `module`'s body and attributes for `new`'s, in place (a pass's single write-back)."""
    block = module.body.block
    for op in reversed(list(block.ops)):
        op.detach()
        op.erase(safe_erase=False)
    new_block = new.body.block
    for op in list(new_block.ops):
        op.detach()
        block.add_op(op)
    module.attributes.clear()
    module.attributes.update(new.attributes)

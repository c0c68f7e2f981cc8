"""Reading the `turnip.taskgraph/1` JSON format: field checks, any node order, cycle detection.

Every error is an `InputError` whose message names the node and the field at fault.
"""

from __future__ import annotations

from turnip_ir.errors import InputError
from turnip_ir.kernels import KERNELS, accepts
from turnip_ir.limits import MAX_RANK, int_in_range, ints_in_range, shorten
from turnip_ir.taskgraph import TASKGRAPH_FORMAT, TaskGraph


def _field(node: dict, name: str, kind, where: str, required: bool = True):
    value = node.get(name, _ABSENT)
    if type(value) is kind and kind is not int:  # JSON gives exact types: the common case in one test
        return value
    if value is _ABSENT:
        if required:
            raise InputError(f"{where}: missing field '{name}'")
        return None
    ok = int_in_range(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise InputError(f"{where}: field '{name}' must be {getattr(kind, '__name__', kind)}, got {shorten(repr(value))}")
    return value


_ABSENT = object()


def _node_label(raw, index: int) -> str:
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        return f"node '{raw['id']}'"
    return f"node #{index}"


def topo_order(deps: dict[str, list[str]]) -> list[str]:
    """Ids in an order where every node follows its deps (stable for already-ordered input).

    Raises `InputError` naming a node on a cycle.
    """
    seen: set[str] = set()
    for node_id, srcs in deps.items():  # the writers' order: one set test per node, no search
        if not seen.issuperset(srcs):
            return _depth_first_order(deps)
        seen.add(node_id)
    return list(deps)


def _depth_first_order(deps: dict[str, list[str]]) -> list[str]:
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in deps:
        if root in state:
            continue
        stack = [(root, iter(deps[root]))]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                state[node] = 2
                order.append(node)
            elif state.get(child) == 1:
                raise InputError(f"node '{child}': taskgraph has a cycle through it")
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(deps[child])))
    return order


def taskgraph_from_json(doc) -> TaskGraph:
    if not isinstance(doc, dict):
        raise InputError("taskgraph JSON must be an object")
    if doc.get("format") != TASKGRAPH_FORMAT:
        raise InputError(f"field 'format' must be '{TASKGRAPH_FORMAT}', got {doc.get('format')!r}")
    devices = _field(doc, "devices", int, "taskgraph")
    nodes = _field(doc, "nodes", list, "taskgraph")
    outputs = _field(doc, "outputs", list, "taskgraph", required=False) or []
    raw: dict[str, dict] = {}
    for index, node in enumerate(nodes):
        where = _node_label(node, index)
        if not isinstance(node, dict):
            raise InputError(f"{where}: must be an object")
        node_id = _field(node, "id", str, where)
        if node_id in raw:
            raise InputError(f"node '{node_id}': duplicate id")
        raw[node_id] = node
    deps = {node_id: _inputs(node, raw, f"node '{node_id}'") for node_id, node in raw.items()}
    graph = TaskGraph(devices)
    for node_id in topo_order(deps):
        _add_node(graph, raw[node_id], deps[node_id], f"node '{node_id}'")
    for out in outputs:
        if not isinstance(out, str) or out not in graph.nodes:
            raise InputError(f"output {out!r} is not a node id")
    graph.output(*outputs)
    return graph


def _inputs(node: dict, raw: dict, where: str) -> list[str]:
    inputs = _field(node, "inputs", list, where, required=False) or []
    for src in inputs:
        if not isinstance(src, str):
            raise InputError(f"{where}: inputs must be node ids (strings), got {src!r}")
        if src not in raw:
            raise InputError(f"{where}: input '{src}' is not a node id")
    return inputs


def _add_node(graph: TaskGraph, node: dict, inputs: list[str], where: str) -> None:
    op = _field(node, "op", str, where)
    node_id = node["id"]
    device = _field(node, "device", int, where, required=op in ("input", "move"))
    shape = _field(node, "shape", list, where, required=op == "input")
    dtype = _field(node, "dtype", str, where, required=op == "input")
    attrs = _field(node, "attrs", dict, where, required=False) or {}
    if shape is not None and not ints_in_range(shape):
        raise InputError(f"{where}: field 'shape' must be a list of integers, got {shorten(repr(shape))}")
    if shape is not None and len(shape) > MAX_RANK:
        raise InputError(f"{where}: field 'shape' has {len(shape)} dimensions, more than the {MAX_RANK} a tensor may have")
    if op == "input":
        if inputs:
            raise InputError(f"{where}: an input takes no inputs")
        made = graph.input(shape, dtype, device, id=node_id)
    elif op == "move":
        if len(inputs) != 1:
            raise InputError(f"{where}: a move takes exactly 1 input, got {len(inputs)}")
        made = graph.move(inputs[0], device, id=node_id)
    elif op in KERNELS:
        made = graph.kernel(op, *inputs, device=device, id=node_id, **checked_attrs(op, attrs, where))
    else:
        raise InputError(f"{where}: unknown op '{op}' (known: input, move, {', '.join(KERNELS)})")
    if shape is not None and tuple(shape) != made.shape:
        raise InputError(f"{where}: field 'shape' is {shape} but the op gives {list(made.shape)}")
    if dtype is not None and dtype != made.dtype:
        raise InputError(f"{where}: field 'dtype' is '{dtype}' but the op gives '{made.dtype}'")


def checked_attrs(op: str, attrs: dict, where: str) -> dict:
    """Kernel `op`'s attributes from JSON, each of its table type (a float may be written as 1)."""
    spec = KERNELS[op]
    for name, value in attrs.items():
        kind = spec.attrs.get(name)
        if kind is None:
            raise InputError(f"{where}: {op} has no attribute '{name}'")
        if not accepts(kind, value):
            raise InputError(f"{where}: attribute '{name}' must be {KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
    return {name: spec.attrs[name](value) for name, value in attrs.items()}


KIND_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}

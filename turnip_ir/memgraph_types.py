"""A memgraph's tensor types: filled in where a hand-written memgraph leaves them out, checked where given.

`check_types` is the one check of declared shapes, dtypes and kernel attributes against the kernel
table, and every way a memgraph enters calls it: the JSON reader (so `turnip_ir.io.load_memgraph`,
`turnip run plan.json` and `turnip-opt`), the IR reader, and `runtime.execute()` for graphs built in Python. It
matters because numpy broadcasts: a node declared `[1, 8]` where its kernel computes `[8, 8]` would
run and give wrong values silently. Nodes without a shape or dtype are not checked; `fill_types`
infers them from their inputs, and `infer_types` starts from the input arrays a run is given.
"""

from __future__ import annotations

from turnip_ir.errors import InputError, TurnipError
from turnip_ir.kernels import KernelSpec, kernel
from turnip_ir.memgraph import MemGraph, MemNode

COPY_OPS = ("move", "offload", "reload")
"""Ops whose result has their input's type."""


def check_types(graph: MemGraph) -> None:
    """Raise a one-line `TurnipError` naming the first node whose type or attributes its kernel contradicts."""
    by_id = graph.by_id()
    for node in graph.nodes:
        if node.op == "kernel":
            _check_attrs(node, _spec(node))
        declared = None if node.shape is None or node.dtype is None else (tuple(node.shape), node.dtype)
        want = _inferred(node, by_id)
        if want is not None and declared is not None and declared != want:
            source = f"{node.kernel} computes" if node.op == "kernel" else f"its input node {node.inputs[0]} holds"
            raise InputError(f"{node.label()}: declared {_type(node.shape, node.dtype)} but {source} {_type(*want)}")


def infer_types(graph: MemGraph, known: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Give untyped nodes a shape and dtype: inputs from `known` (task -> (shape, dtype)), the rest
    inferred from their inputs in order. A hand-written memgraph may leave types out; running it needs
    them, and the runtime learns the inputs' types from the arrays it is given."""
    by_id = graph.by_id()
    for node in graph.nodes:
        if node.op == "input" and node.shape is None and node.task in known:
            node.shape, node.dtype = known[node.task]
        fill_types(node, by_id)


def fill_types(node: MemNode, by_id: dict[int, MemNode]) -> MemNode:
    """Fill in a missing shape or dtype from the node's inputs, when they are typed; returns the node."""
    if node.shape is not None and node.dtype is not None:
        return node
    want = _inferred(node, by_id)
    if want is not None:
        node.shape = want[0] if node.shape is None else node.shape
        node.dtype = want[1] if node.dtype is None else node.dtype
    return node


def _inferred(node: MemNode, by_id: dict[int, MemNode]) -> tuple[tuple[int, ...], str] | None:
    """The (shape, dtype) the node's inputs and kernel give it, or None when that is not known."""
    sources = [by_id[i] for i in node.inputs]
    if node.op not in ("kernel", *COPY_OPS) or not sources or any(s.shape is None or s.dtype is None for s in sources):
        return None
    if node.op != "kernel":
        return tuple(sources[0].shape), sources[0].dtype
    try:
        shape, dtype = _spec(node).infer([tuple(s.shape) for s in sources], [s.dtype for s in sources], node.attrs)
    except TurnipError as err:
        raise type(err)(f"{node.label()}: {err}") from None
    return tuple(shape), dtype


def _spec(node: MemNode) -> KernelSpec:
    try:
        return kernel(node.kernel)
    except TurnipError as err:
        raise type(err)(f"{node.label()}: {err}") from None


def _check_attrs(node: MemNode, spec: KernelSpec) -> None:
    """Attributes the kernel knows, of the types its table gives, and the required ones present."""
    for name in spec.required:
        if name not in node.attrs:
            raise InputError(f"{node.label()}: {spec.name} needs the attribute '{name}'")
    for name, value in node.attrs.items():
        kind = spec.attrs.get(name)
        if kind is None:
            raise InputError(f"{node.label()}: {spec.name} has no attribute '{name}'")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (kind is float and not number) or (kind is str and not isinstance(value, str)):
            what = "a number" if kind is float else "a string"
            raise InputError(f"{node.label()}: attribute '{name}' must be {what}, got {value!r}")


def _type(shape, dtype: str) -> str:
    return f"{list(shape)} {dtype}"


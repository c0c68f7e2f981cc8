"""The taskgraph: tensor operations placed on GPUs, as plain Python data, with a builder.

A `TaskGraph` keeps its nodes in a topological order (every node after its inputs). The builder methods
(`input`, `matmul`, `move`, ...) infer shapes through the kernel table, so a graph that builds is
well-typed. A kernel's attribute conversion and shape inference are pure, so a graph keeps their result
per signature (kernel, operand shapes and dtypes, attributes with their types: `attr_key`): a 128k-token LLaMA has
31k kernel calls but a few hundred signatures, and JSON reading goes through these same checks. `to_json` writes the `turnip.taskgraph/1` document from the graph's own fields. Reading and
the other formats sit above this module and import it, never the reverse: `turnip_ir.json_taskgraph`
(JSON), `turnip_ir.convert` (IR), `turnip_ir.io` (files).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from turnip_ir.errors import InputError, TurnipError
from turnip_ir.kernels import (
    DTYPE_BYTES,
    KERNELS,
    Shape,
    accepts,
    kernel,
    known_dtype,
    nbytes,
)

TASKGRAPH_FORMAT = "turnip.taskgraph/1"


@dataclass
class TaskNode:
    """One taskgraph vertex: an input tensor, a kernel call, or a GPU-to-GPU move."""

    id: str
    op: str
    """'input', 'move', or a kernel name."""
    inputs: tuple[str, ...]
    shape: Shape
    dtype: str
    device: int | None
    """The GPU; for a move its destination. None only for kernels not yet placed."""
    attrs: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape, self.dtype)


@dataclass(frozen=True)
class Tensor:
    """A handle the builder returns: the id of a node plus its type, for chaining calls."""

    id: str
    shape: Shape
    dtype: str
    device: int | None


TensorLike = Tensor | str


def valid_id(text: str) -> bool:
    """Printable ASCII: xDSL 0.74 prints other characters as byte escapes and parses them back as bytes."""
    return text.isascii() and text.isprintable()


class TaskGraph:
    """A taskgraph under construction or loaded from a file."""

    def __init__(self, devices: int = 1):
        if devices < 1:
            raise InputError(f"a taskgraph needs at least 1 device, got {devices}")
        self.devices = devices
        self.nodes: dict[str, TaskNode] = {}
        self.outputs: list[str] = []
        self._counter = 0
        self._signatures: dict[tuple, tuple[dict, Shape, str]] = {}

    # ----- building -------------------------------------------------------------------------------
    def input(self, shape: Sequence[int], dtype: str = "float32", device: int = 0, id: str | None = None) -> Tensor:
        """An input tensor that lives on `device` before the run starts."""
        node_id = self._fresh(id, "in")
        self._check_dtype(dtype, node_id)
        if not all(hasattr(d, "__index__") and not isinstance(d, bool) for d in shape):
            raise InputError(f"node '{node_id}': shape {list(shape)} must hold integers")
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise InputError(f"node '{node_id}': negative dimension in shape {list(shape)}")
        return self._add(TaskNode(node_id, "input", (), shape, dtype, self._check_device(device, node_id)))

    def kernel(self, name: str, *inputs: TensorLike, device: int | None = None, id: str | None = None, **attrs) -> Tensor:
        """A call of kernel `name` on `inputs`; its shape and dtype are inferred."""
        spec = kernel(name)
        node_id = self._fresh(id, name)
        ids = tuple([self._ref(x, node_id) for x in inputs])
        attrs, shape, dtype = self._typed(spec, ids, attrs, node_id)
        dev = None if device is None else self._check_device(device, node_id)
        return self._add(TaskNode(node_id, name, ids, shape, dtype, dev, attrs))

    def move(self, x: TensorLike, device: int, id: str | None = None) -> Tensor:
        """Copy `x` from its GPU to `device`."""
        node_id = self._fresh(id, "move")
        src = self.nodes[self._ref(x, node_id)]
        dev = self._check_device(device, node_id)
        return self._add(TaskNode(node_id, "move", (src.id,), src.shape, src.dtype, dev))

    def output(self, *xs: TensorLike) -> None:
        """Mark tensors as outputs of the graph: they survive to the end of the run."""
        marked = set(self.outputs)  # a set: graphs with 10k outputs made the list lookup quadratic
        for x in xs:
            ref = self._ref(x, "output")
            if ref not in marked:
                marked.add(ref)
                self.outputs.append(ref)

    def matmul(self, a: TensorLike, b: TensorLike, **kw) -> Tensor:
        return self.kernel("matmul", a, b, **kw)

    def einsum(self, equation: str, *xs: TensorLike, **kw) -> Tensor:
        return self.kernel("einsum", *xs, equation=equation, **kw)

    def add(self, a: TensorLike, b: TensorLike, **kw) -> Tensor:
        return self.kernel("add", a, b, **kw)

    def sub(self, a: TensorLike, b: TensorLike, **kw) -> Tensor:
        return self.kernel("sub", a, b, **kw)

    def mul(self, a: TensorLike, b: TensorLike, **kw) -> Tensor:
        return self.kernel("mul", a, b, **kw)

    def relu(self, x: TensorLike, **kw) -> Tensor:
        return self.kernel("relu", x, **kw)

    def gelu(self, x: TensorLike, **kw) -> Tensor:
        return self.kernel("gelu", x, **kw)

    def silu(self, x: TensorLike, **kw) -> Tensor:
        return self.kernel("silu", x, **kw)

    def exp(self, x: TensorLike, **kw) -> Tensor:
        return self.kernel("exp", x, **kw)

    def scale(self, x: TensorLike, factor: float, **kw) -> Tensor:
        return self.kernel("scale", x, factor=factor, **kw)

    def softmax(self, x: TensorLike, **kw) -> Tensor:
        return self.kernel("softmax", x, **kw)

    def rmsnorm(self, x: TensorLike, weight: TensorLike | None = None, eps: float | None = None, **kw) -> Tensor:
        extra = {} if eps is None else {"eps": eps}
        operands = (x,) if weight is None else (x, weight)
        return self.kernel("rmsnorm", *operands, **extra, **kw)

    def rope(self, x: TensorLike, cos: TensorLike, sin: TensorLike, **kw) -> Tensor:
        return self.kernel("rope", x, cos, sin, **kw)

    def swiglu(self, gate: TensorLike, up: TensorLike, **kw) -> Tensor:
        return self.kernel("swiglu", gate, up, **kw)

    def attention(
        self, q: TensorLike, k: TensorLike, v: TensorLike, prev: TensorLike | None = None, *, heads: int, kv_heads: int, **kw
    ) -> Tensor:
        """One key block of attention, merged into the packed partial `prev`; attributes `causal`,
        `final` and `softmax_scale` go in `kw` with `device` and `id`."""
        operands = (q, k, v) if prev is None else (q, k, v, prev)
        return self.kernel("attention", *operands, heads=heads, kv_heads=kv_heads, **kw)

    # ----- queries ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: str) -> TaskNode:
        return self.nodes[node_id]

    def tensor(self, node_id: str) -> Tensor:
        node = self.nodes[node_id]
        return Tensor(node.id, node.shape, node.dtype, node.device)

    def consumers(self) -> dict[str, list[str]]:
        """Node id -> ids of the nodes that read it, in graph order."""
        users: dict[str, list[str]] = {node_id: [] for node_id in self.nodes}
        for node in self.nodes.values():
            for src in node.inputs:
                users[src].append(node.id)
        return users

    def effective_outputs(self) -> list[str]:
        """The declared outputs, or every node nobody reads when none are declared."""
        if self.outputs:
            return list(self.outputs)
        users = self.consumers()
        return [node_id for node_id, readers in users.items() if not readers]

    # ----- formats ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The `turnip.taskgraph/1` document."""
        nodes = []
        for node in self.nodes.values():
            entry: dict = {"id": node.id, "op": node.op}
            if node.device is not None:
                entry["device"] = node.device
            if node.inputs:
                entry["inputs"] = list(node.inputs)
            entry["shape"] = list(node.shape)
            entry["dtype"] = node.dtype
            if node.attrs:
                entry["attrs"] = dict(node.attrs)
            nodes.append(entry)
        return {"format": TASKGRAPH_FORMAT, "devices": self.devices, "nodes": nodes, "outputs": list(self.outputs)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    # ----- internals --------------------------------------------------------------------------------
    def _add(self, node: TaskNode) -> Tensor:
        self.nodes[node.id] = node
        return Tensor(node.id, node.shape, node.dtype, node.device)

    def _fresh(self, wanted: str | None, prefix: str) -> str:
        if wanted is not None:
            if not isinstance(wanted, str) or not wanted:
                raise InputError(f"node id {wanted!r} must be a non-empty string")
            if not valid_id(wanted):
                raise InputError(f"node {wanted!r}: an id must be printable ASCII (the IR text cannot carry other characters)")
            if wanted in self.nodes:
                raise InputError(f"node '{wanted}': duplicate id")
            return wanted
        while True:
            self._counter += 1
            candidate = f"{prefix}{self._counter}"
            if candidate not in self.nodes:
                return candidate

    def _ref(self, x: TensorLike, user: str) -> str:
        ref = x.id if isinstance(x, Tensor) else x
        if ref not in self.nodes:
            raise InputError(f"node '{user}': input '{ref}' is not defined")
        return ref

    def _attr(self, kind: type | None, name: str, value, node_id: str):
        """A kernel attribute converted to its table type; unknown names are left for `infer` to reject."""
        if kind is None:
            return value
        if kind is int and hasattr(value, "__index__") and not isinstance(value, bool):
            value = operator.index(value)  # numpy integers too
        if not accepts(kind, value):
            what = {float: "a number", int: "an integer", bool: "True or False", str: "a string"}[kind]
            raise InputError(f"node '{node_id}': attribute '{name}' must be {what}, got {value!r}")
        return kind(value)

    def _typed(self, spec, ids: tuple[str, ...], attrs: dict, node_id: str) -> tuple[dict, Shape, str]:
        """The converted attributes, shape and dtype of a call, from the signature's earlier call if any
        (only successes are kept, so every error is raised as if there were no memo)."""
        operands = [self.nodes[i] for i in ids]
        try:
            types = tuple([(node.shape, node.dtype) for node in operands])
            signature = (spec.name, types, tuple([attr_key(name, value) for name, value in attrs.items()]))
            known = self._signatures.get(signature)
        except TypeError:  # an unhashable attribute: no memo, the checks below refuse or take it
            signature, known = None, None
        if known is not None:
            return dict(known[0]), known[1], known[2]
        attrs = {k: self._attr(spec.attrs.get(k), k, v, node_id) for k, v in attrs.items()}
        shape, dtype = self._infer(spec.name, ids, attrs, node_id)
        if signature is not None:
            self._signatures[signature] = (dict(attrs), shape, dtype)
        return attrs, shape, dtype

    def _check_device(self, device: int, node_id: str) -> int:
        if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < self.devices:
            raise InputError(f"node '{node_id}': device {device!r} is not in [0, {self.devices})")
        return device

    def _check_dtype(self, dtype: str, node_id: str) -> None:
        if not known_dtype(dtype):
            raise InputError(f"node '{node_id}': unknown dtype '{dtype}' (known: {', '.join(DTYPE_BYTES)})")

    def _infer(self, name: str, ids: Iterable[str], attrs: dict, node_id: str) -> tuple[Shape, str]:
        shapes = [self.nodes[i].shape for i in ids]
        dtypes = [self.nodes[i].dtype for i in ids]
        try:
            return KERNELS[name].infer(shapes, dtypes, attrs)
        except TurnipError as err:
            raise type(err)(f"node '{node_id}': {err}") from None


def attr_key(name: str, value) -> tuple:
    """An attribute as part of a signature: its type too (True == 1 == 1.0), and a float by its bits
    (-0.0 == 0.0 but is kept as written)."""
    if type(value) is float:
        return name, float, value.hex()
    return name, type(value), value


def attrs_key(attrs: dict) -> tuple:
    """A node's attributes as part of a signature, whatever their order: each `attr_key`, sorted by name."""
    return tuple(sorted(attr_key(name, value) for name, value in attrs.items()))

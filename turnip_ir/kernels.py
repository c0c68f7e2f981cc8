"""The kernel table: every kernel's arity, attributes, shape and dtype rule, and cost.

The dialect, the verifier, the planner, the sim backend and the runtime all read this table, so adding a
kernel means adding one `KernelSpec` here plus its implementation in each runtime backend.
Shape rules raise `ShapeError` with a message that starts lowercase and names the problem.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from turnip_ir.errors import KernelError, ShapeError
from turnip_ir.limits import quoted

Shape = tuple[int, ...]

DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
"""The element types a tensor may have, with their size in bytes."""


def numpy_dtype(dtype: str):
    """The numpy dtype of a host array of a `dtype` tensor: bfloat16 is `ml_dtypes.bfloat16` (the numpy
    bfloat16 JAX uses: exact to and from float32, round to nearest even from it)."""
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def known_dtype(dtype) -> bool:
    """Whether `dtype` is a tensor dtype (`DTYPE_BYTES`). A bfloat16 one registers numpy's "bfloat16" now
    (ml_dtypes, imported at the first bfloat16 met, not at every start: 0.6 s on a 2-core VM), so that
    every later `np.dtype("bfloat16")` of the process resolves."""
    if dtype not in DTYPE_BYTES:
        return False
    if dtype == "bfloat16":
        numpy_dtype(dtype)
    return True


def nbytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes of a dense tensor."""
    return math.prod(shape) * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class KernelSpec:
    """What the compiler and runtimes know about one kernel."""

    name: str
    arity: tuple[int, int]
    """Minimum and maximum number of operands."""
    infer_shape: Callable[[list[Shape], dict], Shape]
    flops: Callable[[list[Shape], Shape, dict], int]
    attrs: dict[str, type] = field(default_factory=dict)
    """Attribute name -> one of ATTR_TYPES; attributes named in `required` must be given."""
    required: tuple[str, ...] = ()
    defaults: dict[str, object] = field(default_factory=dict)
    summary: str = ""
    infer_dtype: Callable[[list[str], dict], str] | None = None
    """The result dtype from the operands' dtypes and the attributes, raising `ShapeError`; None means
    every operand has one dtype and the result has it too."""

    def infer(self, shapes: list[Shape], dtypes: list[str], attrs: dict) -> tuple[Shape, str]:
        """The output shape and dtype, or a `ShapeError`."""
        low, high = self.arity
        if not low <= len(shapes) <= high:
            want = str(low) if low == high else f"{low} to {high}"
            raise ShapeError(f"{self.name} takes {want} operands, got {len(shapes)}")
        for name in self.required:
            if name not in attrs:
                raise ShapeError(f"{self.name} needs the attribute '{name}'")
        for name in attrs:
            if name not in self.attrs:
                raise ShapeError(f"{self.name} has no attribute '{name}'")
        for name, value in attrs.items():
            if not accepts(self.attrs[name], value):
                raise ShapeError(f"{self.name} attribute '{name}' must be {self.attrs[name].__name__}, got {value!r}")
        if self.infer_dtype is not None:
            dtype = self.infer_dtype(dtypes, attrs)
        elif len(set(dtypes)) > 1:
            raise ShapeError(f"{self.name} operands have mixed dtypes {sorted(set(dtypes))}")
        else:
            dtype = dtypes[0]
        return tuple(self.infer_shape(shapes, attrs)), dtype

    def attr(self, attrs: dict, name: str):
        """An attribute's value, or its default."""
        return attrs.get(name, self.defaults.get(name))


ATTR_TYPES: tuple[type, ...] = (str, float, int, bool)
"""The types a kernel attribute may have: IR `StringAttr`, `f64`, `i64` and `i1` (`true`/`false`)."""

INT64 = (-(1 << 63), 1 << 63)
CONCAT_MAX = 1024
"""The most operands a concat takes (a decode step stacks one row per sequence of its batch)."""


def accepts(kind: type, value) -> bool:
    """Whether `value` is an attribute of type `kind`: a float takes any non-bool number, an int only
    a non-bool integer that fits 64 bits, a bool only True or False."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    if kind is int:
        return isinstance(value, int) and INT64[0] <= value < INT64[1]
    return isinstance(value, kind)


def _same(shapes: list[Shape], attrs: dict) -> Shape:
    return shapes[0]


def _broadcast(shapes: list[Shape], attrs: dict) -> Shape:
    a, b = shapes
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(reversed(out))


def _matmul(shapes: list[Shape], attrs: dict) -> Shape:
    a, b = shapes
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"matmul needs 2-D operands, got {list(a)} and {list(b)}")
    if a[1] != b[0]:
        raise ShapeError(f"matmul inner dimensions differ: {list(a)} @ {list(b)}")
    return (a[0], b[1])


_EQUATION = re.compile(r"^([a-zA-Z]*(,[a-zA-Z]*)*)->([a-zA-Z]*)$")


def parse_equation(equation: str, count: int) -> tuple[list[str], str]:
    """Split an explicit einsum equation ('ij,jk->ik') into operand and output subscripts."""
    match = _EQUATION.match(equation.replace(" ", ""))
    if match is None:
        raise ShapeError(f"einsum equation {quoted(equation)} must look like 'ij,jk->ik'")
    operands = match.group(1).split(",")
    if len(operands) != count:
        raise ShapeError(f"einsum equation {quoted(equation)} names {len(operands)} operands, got {count}")
    return operands, match.group(3)


def _einsum(shapes: list[Shape], attrs: dict) -> Shape:
    equation = attrs["equation"]
    operands, output = parse_equation(equation, len(shapes))
    sizes: dict[str, int] = {}
    for letters, shape in zip(operands, shapes):
        if len(letters) != len(shape):
            raise ShapeError(f"einsum subscripts {quoted(letters)} do not match rank of {list(shape)}")
        for letter, size in zip(letters, shape):
            if sizes.setdefault(letter, size) != size:
                raise ShapeError(f"einsum index '{letter}' has sizes {sizes[letter]} and {size}")
    for letter in output:
        if letter not in sizes:
            raise ShapeError(f"einsum output index '{letter}' is not in any operand")
    if len(set(output)) != len(output):
        raise ShapeError(f"einsum output {quoted(output)} repeats an index")
    return tuple(sizes[letter] for letter in output)


def _einsum_flops(shapes: list[Shape], out: Shape, attrs: dict) -> int:
    operands, _ = parse_equation(attrs["equation"], len(shapes))
    sizes = {l: s for letters, shape in zip(operands, shapes) for l, s in zip(letters, shape)}
    return 2 * math.prod(sizes.values())


def _rmsnorm(shapes: list[Shape], attrs: dict) -> Shape:
    if len(shapes[0]) == 0:
        raise ShapeError("rmsnorm needs an operand of rank 1 or more")
    if len(shapes) == 2 and tuple(shapes[1]) != (shapes[0][-1],):
        raise ShapeError(f"rmsnorm weight {list(shapes[1])} must be [{shapes[0][-1]}]")
    return shapes[0]


def _softmax(shapes: list[Shape], attrs: dict) -> Shape:
    if len(shapes[0]) == 0:
        raise ShapeError("softmax needs an operand of rank 1 or more")
    return shapes[0]


def _same_shape(name: str) -> Callable[[list[Shape], dict], Shape]:
    def infer(shapes: list[Shape], attrs: dict) -> Shape:
        if len(set(shapes)) > 1:
            raise ShapeError(f"{name}: operand shapes differ: {' and '.join(str(list(s)) for s in shapes)}")
        return shapes[0]

    return infer


def _rope(shapes: list[Shape], attrs: dict) -> Shape:
    x, cos, sin = shapes
    if len(x) != 2 or len(cos) != 2:
        raise ShapeError(f"rope: x {list(x)} and cos {list(cos)} must be 2-D [tokens, width]")
    if cos != sin:
        raise ShapeError(f"rope: cos {list(cos)} and sin {list(sin)} differ")
    head = cos[1]
    if cos[0] != x[0]:
        raise ShapeError(f"rope: cos has {cos[0]} rows, x has {x[0]} tokens")
    if head == 0 or head % 2:
        raise ShapeError(f"rope: head width {head} (cos columns) must be even and positive")
    if x[1] % head:
        raise ShapeError(f"rope: head width {head} does not divide x width {x[1]}")
    return x


def head_width(q: Shape, attrs: dict) -> int:
    """D of an attention op: q's width over `heads` (the shape rule has checked it divides)."""
    return q[1] // attrs["heads"]


def softmax_scale(q: Shape, attrs: dict) -> float:
    """The attention score scale: the `softmax_scale` attribute, or 1/sqrt(D)."""
    scale = attrs.get("softmax_scale")
    return 1.0 / math.sqrt(head_width(q, attrs)) if scale is None else scale


def _attention(shapes: list[Shape], attrs: dict) -> Shape:
    heads, kv_heads = attrs["heads"], attrs["kv_heads"]
    if any(len(s) != 2 for s in shapes):
        raise ShapeError(f"attention: operands must be 2-D [tokens, width], got {[list(s) for s in shapes]}")
    q, k, v = shapes[:3]
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ShapeError(f"attention: kv_heads {kv_heads} must be positive and divide heads {heads}")
    if q[1] % heads or q[1] == 0:
        raise ShapeError(f"attention: heads {heads} does not divide q width {q[1]}")
    width = q[1] // heads * kv_heads
    if k != v or k[1] != width:
        raise ShapeError(f"attention: k {list(k)} and v {list(v)} must both be [tokens, {width}] (kv_heads * D)")
    if attrs.get("causal", False) and q[0] != k[0]:
        raise ShapeError(f"attention: a causal block needs as many queries as keys, got {q[0]} and {k[0]}")
    _check_window(attrs)
    _check_segments(attrs, q[0])
    packed = (q[0], q[1] + heads)
    if len(shapes) == 4 and shapes[3] != packed:
        raise ShapeError(f"attention: prev {list(shapes[3])} must be the packed partial {list(packed)}")
    return q if attrs.get("final", True) else packed


def _check_window(attrs: dict) -> None:
    """`window` counts the keys a query may see, itself included; `offset` places k's rows against q's."""
    if "window" in attrs and attrs["window"] < 1:
        raise ShapeError(f"attention: window {attrs['window']} must be at least 1")
    if "offset" in attrs and "window" not in attrs:
        raise ShapeError("attention: offset places keys for a window, and there is no window")
    if attrs.get("causal", False) and attrs.get("offset", 0) != 0:
        raise ShapeError(f"attention: a causal block starts its keys where its queries start, got offset {attrs['offset']}")


_SEGMENTS = re.compile(r"^[0-9]+(,[0-9]+)*$")


def _check_segments(attrs: dict, rows: int) -> None:
    """`segments` cuts a causal block of `rows` rows into sequences: the rows where each one after the
    first starts, increasing, inside (0, rows)."""
    if "segments" not in attrs:
        return
    text = attrs["segments"]
    if not attrs.get("causal", False):
        raise ShapeError(f"attention: segments '{text}' cut a causal block only, and this block is not causal")
    if not _SEGMENTS.match(text):
        raise ShapeError(f"attention: segments '{text}' must be comma-separated row offsets, e.g. '128,384'")
    bounds = [0, *map(int, text.split(",")), rows]
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ShapeError(f"attention: segments '{text}' must increase strictly inside (0, {rows}), the block's rows")


def segment_rows(attrs: dict, rows: int) -> list[tuple[int, int]]:
    """The rows [start, stop) of each sequence of an attention block of `rows` rows: its `segments`
    (checked by the shape rule), or the whole block as one."""
    cuts = [int(x) for x in attrs["segments"].split(",")] if "segments" in attrs else []
    bounds = [0, *cuts, rows]
    return list(zip(bounds, bounds[1:]))


def _attention_dtype(dtypes: list[str], attrs: dict) -> str:
    if len(set(dtypes[:3])) > 1:
        raise ShapeError(f"attention: q, k and v have mixed dtypes {sorted(set(dtypes[:3]))}")
    if len(dtypes) == 4 and dtypes[3] != "float32":
        raise ShapeError(f"attention: prev must be float32 (a packed partial), got {dtypes[3]}")
    return dtypes[0] if attrs.get("final", True) else "float32"


def _attention_flops(shapes: list[Shape], out: Shape, attrs: dict) -> int:
    """4 tq tk width for a full block, half for a causal one; a segmented block is a causal block per sequence."""
    (tq, width), (tk, _) = shapes[0], shapes[1]
    if "segments" in attrs:
        return sum(4 * (stop - start) ** 2 * width // 2 for start, stop in segment_rows(attrs, tq))
    flops = 4 * tq * tk * width
    return flops // 2 if attrs.get("causal", False) else flops


def _decode_attention(shapes: list[Shape], attrs: dict) -> Shape:
    heads, kv_heads = attrs["heads"], attrs["kv_heads"]
    q, k, v, lengths = shapes[:4]
    if len(q) != 2 or q[1] == 0 or heads < 1 or kv_heads < 1 or heads % kv_heads or q[1] % heads:
        raise ShapeError(f"decode_attention: q {list(q)} must be [batch, heads*D] with kv_heads {kv_heads} dividing heads {heads}")
    batch, width = q[0], q[1] // heads * kv_heads
    block = (batch, width) if attrs.get("own", False) else None
    if k != v or (k != block and (len(k) != 3 or k[1] != batch or k[2] != width)):
        want = f"[{batch}, {width}] (own: each sequence's new key)" if block else f"[rows, {batch}, {width}]"
        raise ShapeError(f"decode_attention: k {list(k)} and v {list(v)} must both be {want}")
    if lengths != (batch,):
        raise ShapeError(f"decode_attention: lengths {list(lengths)} must be [{batch}] (each sequence's cached tokens)")
    if attrs.get("start", 0) < 0:
        raise ShapeError(f"decode_attention: start {attrs['start']} must be a position, >= 0")
    if "window" in attrs and attrs["window"] < 1:
        raise ShapeError(f"decode_attention: window {attrs['window']} must be at least 1")
    packed = (batch, q[1] + heads)
    if len(shapes) == 5 and shapes[4] != packed:
        raise ShapeError(f"decode_attention: prev {list(shapes[4])} must be the packed partial {list(packed)}")
    return q if attrs.get("final", True) else packed


def _decode_attention_dtype(dtypes: list[str], attrs: dict) -> str:
    if len(set(dtypes[:3])) > 1:
        raise ShapeError(f"decode_attention: q, k and v have mixed dtypes {sorted(set(dtypes[:3]))}")
    if dtypes[3] != "float32" or (len(dtypes) == 5 and dtypes[4] != "float32"):
        raise ShapeError(f"decode_attention: lengths and prev must be float32, got {dtypes[3:]}")
    return dtypes[0] if attrs.get("final", True) else "float32"


def _decode_attention_flops(shapes: list[Shape], out: Shape, attrs: dict) -> int:
    (batch, width), k = shapes[0], shapes[1]
    rows = 1 if len(k) == 2 else k[0]
    return 4 * batch * rows * width


def _rows(shapes: list[Shape], attrs: dict) -> Shape:
    x = shapes[0]
    start, stop = attrs["start"], attrs["stop"]
    if len(x) == 0:
        raise ShapeError("rows needs an operand of rank 1 or more")
    if not 0 <= start <= stop <= x[0]:
        raise ShapeError(f"rows: [{start}, {stop}) is not a range of the {x[0]} rows of {list(x)}")
    return (stop - start, *x[1:])


def _concat(shapes: list[Shape], attrs: dict) -> Shape:
    if any(len(s) == 0 for s in shapes):
        raise ShapeError(f"concat needs operands of rank 1 or more, got {[list(s) for s in shapes]}")
    if len({tuple(s[1:]) for s in shapes}) > 1:
        raise ShapeError(f"concat: operands differ past the first axis: {' and '.join(str(list(s)) for s in shapes)}")
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def partial_dtype(dtype: str) -> str:
    """The dtype a gradient kernel accumulates a chain's partial in: float32, or float64 for float64 operands."""
    return "float64" if dtype == "float64" else "float32"


def _rmsnorm_grad(shapes: list[Shape], attrs: dict) -> Shape:
    x, dy = shapes[0], shapes[-1]
    _rmsnorm(shapes[:-1], attrs)
    if dy != x:
        raise ShapeError(f"rmsnorm_grad: dy {list(dy)} must be x's shape {list(x)}")
    return x


def _attention_grad(shapes: list[Shape], attrs: dict) -> Shape:
    """q, k, v as attention's; packed: the forward's final partial of q's rows; d_out: q's shape."""
    q, k, v, packed, d_out = shapes[:5]
    if attrs["wrt"] not in ("q", "kv"):
        raise ShapeError(f"attention_grad: wrt '{attrs['wrt']}' must be 'q' or 'kv'")
    _attention([q, k, v], {name: value for name, value in attrs.items() if name not in ("wrt", "final")})
    if packed != (q[0], q[1] + attrs["heads"]):
        raise ShapeError(f"attention_grad: packed {list(packed)} must be the forward's partial [{q[0]}, {q[1] + attrs['heads']}]")
    if d_out != q:
        raise ShapeError(f"attention_grad: d_out {list(d_out)} must be q's shape {list(q)}")
    grad = q if attrs["wrt"] == "q" else (2 * k[0], k[1])
    if len(shapes) == 6 and shapes[5] != grad:
        raise ShapeError(f"attention_grad: prev {list(shapes[5])} must be the partial gradient {list(grad)}")
    return grad


def _attention_grad_dtype(dtypes: list[str], attrs: dict) -> str:
    if len({*dtypes[:3], dtypes[4]}) > 1:
        raise ShapeError(f"attention_grad: q, k, v and d_out have mixed dtypes {sorted({*dtypes[:3], dtypes[4]})}")
    if dtypes[3] != "float32":
        raise ShapeError(f"attention_grad: packed must be float32 (the forward's partial), got {dtypes[3]}")
    partial = partial_dtype(dtypes[0])
    if len(dtypes) == 6 and dtypes[5] != partial:
        raise ShapeError(f"attention_grad: prev must be {partial} (a partial gradient), got {dtypes[5]}")
    return dtypes[0] if attrs.get("final", True) else partial


def _attention_grad_flops(shapes: list[Shape], out: Shape, attrs: dict) -> int:
    """Recomputed scores and dO V^T, then dS K (wrt q) or P^T dO and dS^T Q (wrt kv): 3 or 4 products."""
    (tq, width), (tk, _) = shapes[0], shapes[1]
    flops = (6 if attrs["wrt"] == "q" else 8) * tq * tk * width
    return flops // 2 if attrs.get("causal", False) else flops


def _attention_unpack(shapes: list[Shape], attrs: dict) -> Shape:
    (packed,), heads = shapes, attrs["heads"]
    if len(packed) != 2 or heads < 1 or packed[1] <= heads or (packed[1] - heads) % heads:
        raise ShapeError(f"attention_unpack: packed {list(packed)} is not [tokens, {heads} heads x D + {heads}]")
    return (packed[0], packed[1] - heads)


def _to_dtype(name: str) -> Callable[[list[str], dict], str]:
    def infer(dtypes: list[str], attrs: dict) -> str:
        if not known_dtype(attrs["dtype"]):
            raise ShapeError(f"{name}: dtype '{attrs['dtype']}' is not one of {', '.join(DTYPE_BYTES)}")
        return attrs["dtype"]

    return infer


def _labels(name: str, logits: Shape, labels: Shape) -> None:
    if len(logits) != 2 or labels != (logits[0],):
        raise ShapeError(f"{name}: logits {list(logits)} must be [tokens, vocab] and labels {list(labels)} [tokens]")


def _xent(shapes: list[Shape], attrs: dict) -> Shape:
    _labels("xent", shapes[0], shapes[1])
    stats = (shapes[0][0], 3)
    if len(shapes) == 3 and shapes[2] != stats:
        raise ShapeError(f"xent: prev {list(shapes[2])} must be the running statistics {list(stats)}")
    return stats


def _xent_dtype(dtypes: list[str], attrs: dict) -> str:
    partial = partial_dtype(dtypes[0])
    if dtypes[1] != "float32" or (len(dtypes) == 3 and dtypes[2] != partial):
        raise ShapeError(f"xent: labels must be float32 and prev {partial}, got {dtypes[1:]}")
    return partial


def _xent_loss(shapes: list[Shape], attrs: dict) -> Shape:
    stats, labels = shapes
    if len(stats) != 2 or stats[1] != 3 or labels != (stats[0],):
        raise ShapeError(f"xent_loss: stats {list(stats)} must be [tokens, 3] and labels {list(labels)} [tokens]")
    return (2,)


def _xent_loss_dtype(dtypes: list[str], attrs: dict) -> str:
    if dtypes[1] != "float32" or dtypes[0] not in ("float32", "float64"):
        raise ShapeError(f"xent_loss: stats must be float32 or float64 and labels float32, got {dtypes}")
    return dtypes[0]


def _xent_grad(shapes: list[Shape], attrs: dict) -> Shape:
    logits, labels, stats, total = shapes[:4]
    _labels("xent_grad", logits, labels)
    if stats != (logits[0], 3) or total != (2,):
        raise ShapeError(f"xent_grad: stats {list(stats)} must be [{logits[0]}, 3] and total {list(total)} [2]")
    if len(shapes) == 5 and shapes[4] != (1,):
        raise ShapeError(f"xent_grad: scale {list(shapes[4])} must be [1]")
    return logits


def _xent_grad_dtype(dtypes: list[str], attrs: dict) -> str:
    partial = partial_dtype(dtypes[0])
    if dtypes[1] != "float32" or any(dtype != partial for dtype in dtypes[2:]):
        raise ShapeError(f"xent_grad: labels must be float32, stats, total and scale {partial}, got {dtypes[1:]}")
    return dtypes[0]


def _no_flops(shapes: list[Shape], out: Shape, attrs: dict) -> int:
    """A copy: its cost is the bytes it reads and writes."""
    return 0


def _elementwise(per_element: int) -> Callable[[list[Shape], Shape, dict], int]:
    return lambda shapes, out, attrs: per_element * math.prod(out)


def _unary(name: str, per_element: int, summary: str, **extra) -> KernelSpec:
    return KernelSpec(name, (1, 1), _same, _elementwise(per_element), summary=summary, **extra)


def _binary(name: str, summary: str) -> KernelSpec:
    return KernelSpec(name, (2, 2), _broadcast, _elementwise(1), summary=summary)


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in [
        KernelSpec(
            "matmul",
            (2, 2),
            _matmul,
            lambda s, out, a: 2 * s[0][0] * s[0][1] * s[1][1],
            summary="2-D matrix product a @ b",
        ),
        KernelSpec(
            "einsum",
            (1, 8),
            _einsum,
            _einsum_flops,
            attrs={"equation": str},
            required=("equation",),
            summary="explicit-output einsum, e.g. 'bij,bjk->bik'",
        ),
        _binary("add", "a + b with numpy broadcasting"),
        _binary("sub", "a - b with numpy broadcasting"),
        _binary("mul", "a * b with numpy broadcasting"),
        _unary("relu", 1, "max(x, 0)"),
        _unary("gelu", 8, "tanh-approximated GELU"),
        _unary("silu", 4, "x * sigmoid(x)"),
        _unary("exp", 1, "e ** x"),
        _unary(
            "scale",
            1,
            "factor * x",
            attrs={"factor": float},
            required=("factor",),
        ),
        KernelSpec(
            "softmax",
            (1, 1),
            _softmax,
            _elementwise(5),
            summary="softmax over the last axis",
        ),
        KernelSpec(
            "rmsnorm",
            (1, 2),
            _rmsnorm,
            _elementwise(4),
            attrs={"eps": float},
            defaults={"eps": 1e-6},
            summary="x / sqrt(mean(x*x, last axis) + eps), times an optional weight over the last axis",
        ),
        KernelSpec(
            "rope",
            (3, 3),
            _rope,
            _elementwise(3),
            summary="rotary embedding per head of width D: x*cos + rotate_half(x)*sin, cos and sin [tokens, D]",
        ),
        KernelSpec(
            "swiglu",
            (2, 2),
            _same_shape("swiglu"),
            _elementwise(5),
            summary="silu(gate) * up",
        ),
        KernelSpec(
            "attention",
            (3, 4),
            _attention,
            _attention_flops,
            attrs={"heads": int, "kv_heads": int, "causal": bool, "final": bool, "softmax_scale": float,
                   "window": int, "offset": int, "segments": str},
            required=("heads", "kv_heads"),
            defaults={"causal": False, "final": True, "offset": 0},
            infer_dtype=_attention_dtype,
            summary="one key block of grouped-query attention, merged into the packed partial prev; "
            "final: the output, else the next packed partial (float32, [tq, heads*D + heads]); window: query i "
            "sees key j only when i - (offset + j) < window (a sliding window; offset = k's first position - q's); "
            "segments: a causal block of several sequences packed end to end, the comma-separated rows where each "
            "one after the first starts (query i sees key j only within its own sequence)",
        ),
        KernelSpec(
            "decode_attention",
            (4, 5),
            _decode_attention,
            _decode_attention_flops,
            attrs={"heads": int, "kv_heads": int, "final": bool, "softmax_scale": float, "start": int, "own": bool,
                   "window": int},
            required=("heads", "kv_heads"),
            defaults={"final": True, "start": 0, "own": False},
            infer_dtype=_decode_attention_dtype,
            summary="one key block of a batch's decode attention, each query row b one sequence's new token: "
            "k, v [rows, B, kv_heads*D] hold positions start.. of each sequence's cache, of which row b sees those "
            "below lengths[b] (float32 [B], the tokens cached before this step); own: k, v [B, kv_heads*D] are "
            "the sequences' own new keys, each row seeing its own; window: only keys with lengths[b] - position "
            "< window; merged into the packed partial prev, final as in attention",
        ),
        KernelSpec(
            "rows",
            (1, 1),
            _rows,
            _no_flops,
            attrs={"start": int, "stop": int},
            required=("start", "stop"),
            summary="x[start:stop] along the first axis (a copy)",
        ),
        KernelSpec(
            "concat",
            (1, CONCAT_MAX),
            _concat,
            _no_flops,
            summary="the operands stacked along the first axis; the other axes and the dtypes agree",
        ),
        KernelSpec(
            "cast",
            (1, 1),
            _same,
            _no_flops,
            attrs={"dtype": str},
            required=("dtype",),
            infer_dtype=_to_dtype("cast"),
            summary="x converted to `dtype` (a copy)",
        ),
        KernelSpec(
            "rmsnorm_grad",
            (2, 3),
            _rmsnorm_grad,
            _elementwise(8),
            attrs={"eps": float},
            defaults={"eps": 1e-6},
            summary="the gradient of rmsnorm(x, weight) with respect to x, from (x, [weight,] dy)",
        ),
        KernelSpec(
            "swiglu_grad",
            (3, 3),
            _same_shape("swiglu_grad"),
            _elementwise(8),
            summary="the gradient of silu(gate) * up with respect to gate, from (gate, up, dy)",
        ),
        KernelSpec(
            "attention_unpack",
            (1, 1),
            _attention_unpack,
            _no_flops,
            attrs={"heads": int, "dtype": str},
            required=("heads", "dtype"),
            infer_dtype=_to_dtype("attention_unpack"),
            summary="the normalised output [t, heads*D] of a packed attention partial, in `dtype`",
        ),
        KernelSpec(
            "attention_grad",
            (5, 6),
            _attention_grad,
            _attention_grad_flops,
            attrs={"heads": int, "kv_heads": int, "wrt": str, "causal": bool, "final": bool, "softmax_scale": float,
                   "window": int, "offset": int},
            required=("heads", "kv_heads", "wrt"),
            defaults={"causal": False, "final": True, "offset": 0},
            infer_dtype=_attention_grad_dtype,
            summary="one (query block, key block) step of attention's backward from (q, k, v, packed, d_out, [prev]): "
            "the scores recomputed from the forward's log-sum-exp in packed; wrt 'q': dQ [tq, heads*D], wrt 'kv': "
            "dK over dV [2*tk, kv_heads*D], added to prev; final: in q's dtype, else a float32 (float64) partial",
        ),
        KernelSpec(
            "xent",
            (2, 3),
            _xent,
            lambda s, out, a: 4 * math.prod(s[0]),
            attrs={"start": int},
            defaults={"start": 0},
            infer_dtype=_xent_dtype,
            summary="one vocabulary block (columns start..) of a cross-entropy: per token the running max, "
            "sum of exp(logit - max) and the label's logit [t, 3], merged into prev; labels float32, -100 ignored",
        ),
        KernelSpec(
            "xent_loss",
            (2, 2),
            _xent_loss,
            lambda s, out, a: 4 * s[0][0],
            infer_dtype=_xent_loss_dtype,
            summary="(sum of the tokens' losses, count of tokens) [2] from xent's statistics, labels -100 left out",
        ),
        KernelSpec(
            "xent_grad",
            (4, 5),
            _xent_grad,
            _elementwise(5),
            attrs={"start": int, "factor": float},
            defaults={"start": 0, "factor": 1.0},
            infer_dtype=_xent_grad_dtype,
            summary="factor * scale / count * (softmax - onehot) of one vocabulary block, from (logits, labels, "
            "stats, total, [scale [1]])",
        ),
    ]
}


def attribute_types() -> dict[str, type]:
    """Every attribute name any kernel has, with its type (one name has one type across kernels)."""
    union: dict[str, type] = {}
    for spec in KERNELS.values():
        for name, kind in spec.attrs.items():
            assert kind in ATTR_TYPES, f"{spec.name}: attribute '{name}' has type {kind}"
            assert union.setdefault(name, kind) is kind, f"attribute '{name}' has two types"
    return union


def kernel(name: str) -> KernelSpec:
    """The spec of a kernel, or a `KernelError` naming it."""
    spec = KERNELS.get(name)
    if spec is None:
        raise KernelError(f"unknown kernel '{name}' (known: {', '.join(KERNELS)})")
    return spec

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

Shape = tuple[int, ...]

DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
"""The element types a tensor may have, with their size in bytes."""


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
    """Attribute name -> Python type; attributes named in `required` must be given."""
    required: tuple[str, ...] = ()
    defaults: dict[str, object] = field(default_factory=dict)
    summary: str = ""

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
        if len(set(dtypes)) > 1:
            raise ShapeError(f"{self.name} operands have mixed dtypes {sorted(set(dtypes))}")
        return tuple(self.infer_shape(shapes, attrs)), dtypes[0]

    def attr(self, attrs: dict, name: str):
        """An attribute's value, or its default."""
        return attrs.get(name, self.defaults.get(name))


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
        raise ShapeError(f"einsum equation '{equation}' must look like 'ij,jk->ik'")
    operands = match.group(1).split(",")
    if len(operands) != count:
        raise ShapeError(f"einsum equation '{equation}' names {len(operands)} operands, got {count}")
    return operands, match.group(3)


def _einsum(shapes: list[Shape], attrs: dict) -> Shape:
    equation = attrs["equation"]
    operands, output = parse_equation(equation, len(shapes))
    sizes: dict[str, int] = {}
    for letters, shape in zip(operands, shapes):
        if len(letters) != len(shape):
            raise ShapeError(f"einsum subscripts '{letters}' do not match rank of {list(shape)}")
        for letter, size in zip(letters, shape):
            if sizes.setdefault(letter, size) != size:
                raise ShapeError(f"einsum index '{letter}' has sizes {sizes[letter]} and {size}")
    for letter in output:
        if letter not in sizes:
            raise ShapeError(f"einsum output index '{letter}' is not in any operand")
    if len(set(output)) != len(output):
        raise ShapeError(f"einsum output '{output}' repeats an index")
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
    ]
}


def kernel(name: str) -> KernelSpec:
    """The spec of a kernel, or a `KernelError` naming it."""
    spec = KERNELS.get(name)
    if spec is None:
        raise KernelError(f"unknown kernel '{name}' (known: {', '.join(KERNELS)})")
    return spec

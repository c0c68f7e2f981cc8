"""Contractions as cuBLAS GEMMs on arena views: an einsum becomes one (strided batched) GEMM, no copies.

`plan_einsum(equation, shapes)` reads a two-operand einsum over C-contiguous tensors and, when it is a
(batched) matrix product in disguise, returns a `GemmPlan`: the batch, M, N and K extents and, per
operand, a row-major matrix (rows, cols, leading dimension, batch stride, transposed or not). Letters
of one class (batch, M, N, K) must sit next to each other in every operand, in one order, so that they
flatten to a single stride; one of each input's two matrix groups must be the innermost (unit stride),
since cuBLAS needs a unit stride on one side. Anything else (a letter summed in one operand only, a
diagonal, a batch letter innermost) returns None and runs on the fallback path instead.

A plan runs with `cublas_gemm` (cuBLAS `gemmEx` or `gemmStridedBatchedEx` through CuPy's bindings, on
the lane's stream, writing straight into the output's arena view) or with `numpy_gemm` (strided numpy
views: the CUDA simulator's path, and the test oracle for the plans themselves). float16 and bfloat16
GEMMs read their dtype, accumulate in float32 (CUBLAS_COMPUTE_32F; bfloat16 is CUDA_R_16BF, its operands
the uint16 words of the arena's bfloat16 views) and write their dtype or float32 (attention's backward
keeps its scores in float32). C = alpha A·B + beta C: beta 1 adds to what C holds.
Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ, so cuBLAS sees (B, A) and m = N, n = M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from turnip_ir.kernels import DTYPE_BYTES, numpy_dtype, parse_equation


@dataclass(frozen=True)
class Matrix:
    """A batch of row-major matrices inside a flat tensor: element (i, j) of batch b is at
    b*batch_stride + i*ld + j of the *stored* (rows x cols) matrix; the operand is its transpose if `trans`."""

    rows: int
    cols: int
    ld: int
    batch_stride: int
    trans: bool = False


@dataclass(frozen=True)
class GemmPlan:
    m: int
    n: int
    k: int
    batch: int
    a: Matrix
    b: Matrix
    c: Matrix
    swap: bool = False
    """True when `a` describes the einsum's second operand and `b` its first (C was column-major)."""


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return list(reversed(strides))


def _group(letters: str, order: list[str], sizes: dict[str, int], strides: dict[str, int]) -> tuple[int, int] | None:
    """(size, stride) of the letters of `order` flattened into one index of an operand, or None if they do not flatten."""
    present = [letter for letter in order if letter in letters]
    real = [letter for letter in present if sizes[letter] != 1]
    size = math.prod(sizes[letter] for letter in present)
    if not real:
        return size, 0
    positions = [letters.index(letter) for letter in real]
    if positions != sorted(positions):
        return None
    for outer, inner in zip(real, real[1:]):
        if strides[outer] != strides[inner] * sizes[inner]:
            return None
    return size, strides[real[-1]]


def _matrix(outer: tuple[int, int], inner: tuple[int, int], batch_stride: int) -> Matrix | None:
    """The operand whose effective shape is (outer size, inner size), from each group's (size, stride)."""
    (rows, row_stride), (cols, col_stride) = outer, inner
    if cols == 1 or col_stride == 1:
        return Matrix(rows, cols, max(row_stride, cols, 1) if rows > 1 else max(cols, 1), batch_stride)
    if rows == 1 or row_stride == 1:
        return Matrix(cols, rows, max(col_stride, rows, 1) if cols > 1 else max(rows, 1), batch_stride, trans=True)
    return None


def plan_einsum(equation: str, shapes: list[tuple[int, ...]]) -> GemmPlan | None:
    """The GEMM that computes a two-operand einsum over C-contiguous tensors, or None."""
    if len(shapes) != 2:
        return None
    (left, right), out = parse_equation(equation, 2)
    if any(len(set(letters)) != len(letters) for letters in (left, right, out)):
        return None
    sizes = {letter: size for letters, shape in zip((left, right), shapes) for letter, size in zip(letters, shape)}
    if any(sizes[letter] == 0 for letter in sizes):
        return None
    in_left, in_right, in_out = set(left), set(right), set(out)
    if (in_left - in_right - in_out) or (in_right - in_left - in_out):
        return None  # a letter summed inside one operand: not a GEMM
    batch = [x for x in out if x in in_left and x in in_right]
    rows = [x for x in out if x in in_left and x not in in_right]
    cols = [x for x in out if x in in_right and x not in in_left]
    inner = [x for x in left if x in in_right and x not in in_out]
    out_shape = tuple(sizes[x] for x in out)
    strides = {
        "a": dict(zip(left, _strides(shapes[0]))),
        "b": dict(zip(right, _strides(shapes[1]))),
        "c": dict(zip(out, _strides(out_shape))),
    }
    groups = {}
    for name, letters in (("a", left), ("b", right), ("c", out)):
        for kind, order in (("batch", batch), ("m", rows), ("n", cols), ("k", inner)):
            got = _group(letters, order, sizes, strides[name])
            if got is None:
                return None
            groups[name, kind] = got
    m, n, k = groups["c", "m"][0], groups["c", "n"][0], groups["a", "k"][0]
    count = groups["c", "batch"][0]
    a = _matrix(groups["a", "m"], groups["a", "k"], groups["a", "batch"][1])
    b = _matrix(groups["b", "k"], groups["b", "n"], groups["b", "batch"][1])
    c = _matrix(groups["c", "m"], groups["c", "n"], groups["c", "batch"][1])
    if a is None or b is None or c is None:
        return None
    if c.trans:  # C is stored column-major: compute Cᵀ = Bᵀ·Aᵀ instead
        flip = lambda x: Matrix(x.rows, x.cols, x.ld, x.batch_stride, not x.trans)  # noqa: E731
        return GemmPlan(n, m, k, count, flip(b), flip(a), flip(c), swap=True)
    return GemmPlan(m, n, k, count, a, b, c)


def _view(flat: np.ndarray, matrix: Matrix, batch: int) -> np.ndarray:
    item = flat.itemsize
    stored = np.lib.stride_tricks.as_strided(
        flat, shape=(batch, matrix.rows, matrix.cols), strides=(matrix.batch_stride * item, matrix.ld * item, item)
    )
    return stored.transpose(0, 2, 1) if matrix.trans else stored


def numpy_gemm(plan: GemmPlan, a: np.ndarray, b: np.ndarray, c: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> None:
    """Run the plan (C = alpha A·B + beta C) on flat numpy arrays (host memory, or the simulator's device arrays)."""
    if plan.swap:
        a, b = b, a
    left, right = _view(a.reshape(-1), plan.a, plan.batch), _view(b.reshape(-1), plan.b, plan.batch)
    out = _view(c.reshape(-1), plan.c, plan.batch)
    left, right, out = (x.view(numpy_dtype("bfloat16")) if x.dtype == np.uint16 else x for x in (left, right, out))  # bfloat16 words (memory.py)
    if left.dtype.itemsize == 2:  # accumulate in float32, as cuBLAS does for half inputs
        product = alpha * np.matmul(left.astype(np.float32), right.astype(np.float32))
        out[...] = (product + beta * out.astype(np.float32) if beta else product).astype(out.dtype)
    elif beta:
        out[...] = alpha * np.matmul(left, right) + beta * out
    else:
        np.matmul(left, right, out=out)
        if alpha != 1.0:
            out *= alpha


CUDA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0, "float64": 1}
"""cudaDataType values (CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_64F)."""
COMPUTE_32F, COMPUTE_64F = 68, 70
"""cublasComputeType_t values (CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F)."""
GEMM_DEFAULT, GEMM_DEFAULT_TENSOR_OP = -1, 99


def cublas_call(plan: GemmPlan, a_ptr: int, b_ptr: int, c_ptr: int, dtype: str, alpha: float = 1.0, beta: float = 0.0,
                in_dtype: str | None = None):
    """A closure `call(handle)` issuing the plan's GEMM on cuBLAS's current stream (set by the caller).

    `a_ptr` and `b_ptr` are the einsum's first and second operands, whatever `plan.swap` says; `dtype` is
    C's, `in_dtype` A's and B's (default C's: a half C with float32 operands is not a cuBLAS case)."""
    from cupy_backends.cuda.libs import cublas

    if plan.swap:
        a_ptr, b_ptr = b_ptr, a_ptr
    in_dtype = in_dtype or dtype
    kind, in_kind = CUDA_TYPES[dtype], CUDA_TYPES[in_dtype]
    scalar = np.float64 if dtype == "float64" else np.float32
    one, zero = np.full(1, alpha, scalar), np.full(1, beta, scalar)  # host scalars, kept alive by the closure
    compute = COMPUTE_64F if dtype == "float64" else COMPUTE_32F
    algo = GEMM_DEFAULT_TENSOR_OP if in_dtype in ("float16", "bfloat16") else GEMM_DEFAULT
    item, in_item = DTYPE_BYTES[dtype], DTYPE_BYTES[in_dtype]
    op = lambda matrix: 1 if matrix.trans else 0  # noqa: E731  (CUBLAS_OP_T, CUBLAS_OP_N)
    common = (op(plan.b), op(plan.a), plan.n, plan.m, plan.k, one.ctypes.data)
    assert a_ptr % in_item == 0 and b_ptr % in_item == 0 and c_ptr % item == 0, "GEMM operands must be element-aligned"
    if plan.batch == 1:
        args = common + (b_ptr, in_kind, plan.b.ld, a_ptr, in_kind, plan.a.ld, zero.ctypes.data, c_ptr, kind, plan.c.ld, compute, algo)
        return lambda handle, keep=(one, zero): cublas.gemmEx(handle, *args)
    args = common + (
        b_ptr, in_kind, plan.b.ld, plan.b.batch_stride, a_ptr, in_kind, plan.a.ld, plan.a.batch_stride,
        zero.ctypes.data, c_ptr, kind, plan.c.ld, plan.c.batch_stride, plan.batch, compute, algo,
    )
    return lambda handle, keep=(one, zero): cublas.gemmStridedBatchedEx(handle, *args)

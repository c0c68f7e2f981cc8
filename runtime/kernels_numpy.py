"""numpy implementations of every kernel in the kernel table, writing into a preallocated output.

Each function is `impl(inputs, out, attrs)`: `out` is a view into a GPU arena (or a fresh float64 array
for the reference), so results go straight to their planned location with `out=`. softmax and rmsnorm
allocate one small temporary of the reduced shape (a row max or a row mean), which is the only
allocation a kernel makes; elementwise kernels work in place in `out`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from turnip_ir.kernels import KERNELS

KernelImpl = Callable[[list[np.ndarray], np.ndarray, dict], None]


def _matmul(xs, out, attrs):
    np.matmul(xs[0], xs[1], out=out)


def _einsum(xs, out, attrs):
    np.einsum(attrs["equation"], *xs, out=out)


def _relu(xs, out, attrs):
    np.maximum(xs[0], 0, out=out)


def _gelu(xs, out, attrs):
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), the tanh approximation, built up in `out`.

    In float16 the inner product may overflow to inf for large |x|; tanh(+-inf) = +-1 is then exact.
    """
    x = xs[0]
    with np.errstate(over="ignore"):
        np.multiply(x, x, out=out)
        out *= 0.044715
        out += 1.0
        out *= x
    out *= math.sqrt(2.0 / math.pi)
    np.tanh(out, out=out)
    out += 1.0
    out *= x
    out *= 0.5


def _silu(xs, out, attrs):
    """x / (1 + exp(-x)), built up in `out`."""
    np.negative(xs[0], out=out)
    np.exp(out, out=out)
    out += 1.0
    np.divide(xs[0], out, out=out)


def _exp(xs, out, attrs):
    np.exp(xs[0], out=out)


def _scale(xs, out, attrs):
    np.multiply(xs[0], KERNELS["scale"].attr(attrs, "factor"), out=out)


def _softmax(xs, out, attrs):
    """Numerically stable: subtract the row max before exponentiating (-inf for an empty row)."""
    np.subtract(xs[0], xs[0].max(axis=-1, keepdims=True, initial=-np.inf), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)


def _rmsnorm(xs, out, attrs):
    """x / sqrt(mean(x^2, last axis) + eps), times the optional weight.

    float16 squares overflow past 256, so half inputs square into a float32 temporary of the full
    shape (an allocation per call, as a GPU kernel would accumulate in fp32 registers instead).
    """
    x = xs[0]
    if x.dtype == np.float16:
        scale = np.square(x, dtype=np.float32).sum(axis=-1, keepdims=True)
    else:
        np.multiply(x, x, out=out)
        scale = out.sum(axis=-1, keepdims=True)
    scale /= max(x.shape[-1], 1)  # the mean, without numpy's warning for an empty last axis
    scale += KERNELS["rmsnorm"].attr(attrs, "eps")
    np.sqrt(scale, out=scale)
    np.divide(x, scale, out=out)
    if len(xs) == 2:
        out *= xs[1]


def _binary(ufunc) -> KernelImpl:
    def impl(xs, out, attrs):
        ufunc(xs[0], xs[1], out=out)

    return impl


NUMPY_KERNELS: dict[str, KernelImpl] = {
    "matmul": _matmul,
    "einsum": _einsum,
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "relu": _relu,
    "gelu": _gelu,
    "silu": _silu,
    "exp": _exp,
    "scale": _scale,
    "softmax": _softmax,
    "rmsnorm": _rmsnorm,
}

assert set(NUMPY_KERNELS) == set(KERNELS), "every kernel in the table needs a numpy implementation"

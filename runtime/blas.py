"""Matrix products for the numpy kernels: a large one cut over threads when no other is.

`product(a, b, out)` is numpy.matmul (BLAS). BLAS itself runs on one thread (the cpu backend sets that
with threadpoolctl from the thread that prepares it, the only thread threadpoolctl lets change OpenBLAS's
pool); the parallelism is ours (`Blas`): a product of at least `PARALLEL_FLOPS` is cut into `threads`
parts along its first batch axis (whole matrices a part: attention's heads), else along the rows of `a`,
else along the columns of `b`, where there are enough of them, and the caller and `threads - 1` helper
threads each take parts until none is left, each part one single-threaded matmul into its slice of the
output. A helper that the OS has not run yet when the caller is done with its own parts leaves its parts
to the caller, so on a busy machine a product is never slower than on one thread.

Who cuts: the product that takes the helpers (a lock, never waited for). A product that finds them taken
runs whole on its own thread at once: the cpu backend runs kernels on a thread per lane, and two lanes'
products then take a core each, as a lone product takes them all; at most `threads - 1` threads more
than the lanes with a product run BLAS at once. A small product is never cut (waking a thread costs more
than it saves there: on the shared 2-core machine, OpenBLAS on two threads took 7 ms for a 64x256x128
product that takes 0.05 ms on one, while another process held the other core). Without `use` (the
float64 reference, a test calling a kernel) every product is one matmul.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

PARALLEL_FLOPS = 1 << 26
"""FLOPs from which a product is cut over the threads: about a millisecond of one core's work."""


class Blas:
    """The process's products: `use(threads)` sets how many threads a large one takes; `product` runs one.
    `lock` is held by the product that has the helpers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads = 1
        self.helpers: ThreadPoolExecutor | None = None

    def use(self, threads: int | None) -> None:
        """Cut large products over `threads` threads from now on (None or 1: never cut them). Between runs:
        never while a product runs."""
        with self.lock:
            if self.helpers is not None:
                self.helpers.shutdown()
            self.threads = max(1, threads or 1)
            self.helpers = ThreadPoolExecutor(self.threads - 1, "turnip blas") if self.threads > 1 else None

    def product(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if self.helpers is None or not self.lock.acquire(blocking=False):  # another product has the helpers
            return np.matmul(a, b, out=out)
        try:
            return self._cut(a, b, out)
        finally:
            self.lock.release()

    def _cut(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        parts = self._parts(a, b, out)
        if parts is None:
            return np.matmul(a, b, out=out)
        out, queue = parts[0], iter(parts[1])
        helping = [self.helpers.submit(_take, queue) for _ in range(self.threads - 1)]
        try:
            _take(queue)
        finally:
            for helper in helping:
                helper.result()
        return out

    def _parts(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None):
        """(the output, the (a, b, out) slices to multiply) for a product to cut; None for one matmul."""
        if a.ndim < 2 or b.ndim < 2:
            return None
        rows, inner, columns = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        if 2 * math.prod(batch) * rows * inner * columns < PARALLEL_FLOPS:
            return None
        if out is None:
            out = np.empty((*batch, rows, columns), np.result_type(a, b))
        if batch and batch[0] >= self.threads:  # attention's heads: whole matrices a part
            return out, [_batch_part(a, b, out, lo, hi) for lo, hi in _cuts(batch[0], self.threads)]
        if rows >= self.threads * 8:
            return out, [(a[..., lo:hi, :], b, out[..., lo:hi, :]) for lo, hi in _cuts(rows, self.threads)]
        if columns >= self.threads * 8:
            return out, [(a, b[..., lo:hi], out[..., lo:hi]) for lo, hi in _cuts(columns, self.threads)]
        return None


def _batch_part(a: np.ndarray, b: np.ndarray, out: np.ndarray, lo: int, hi: int):
    """The (a, b, out) of batches lo..hi along the output's first axis: an operand that broadcasts along
    that axis (it lacks it, or has length 1 there) is taken whole."""
    def part(x):
        axis = x.ndim - out.ndim  # x's axis under the output's first, when x has one there
        if axis < 0 or x.shape[axis] == 1:
            return x
        return x[(slice(None),) * axis + (slice(lo, hi),)]

    return part(a), part(b), out[lo:hi]


def _cuts(length: int, parts: int) -> list[tuple[int, int]]:
    bounds = [length * k // parts for k in range(parts + 1)]
    return list(zip(bounds, bounds[1:]))


def _take(queue) -> None:
    """Multiply parts from the shared `queue` until it is empty (a list iterator: each part goes to one taker)."""
    for a, b, out in queue:
        np.matmul(a, b, out=out)


BLAS = Blas()


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """numpy.matmul through the process's `Blas` (module docstring)."""
    return BLAS.product(a, b, out)

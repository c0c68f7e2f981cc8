"""numba-cuda kernels for everything that is not a GEMM: elementwise, broadcasting binary ops, row
reductions (softmax, rmsnorm), rope, swiglu, and the attention merge.

Each kernel reads its inputs in the tensors' own dtype, computes in `acc` (float32 for float16 and
float32 tensors, float64 for float64) and rounds once when it stores. Kernels are built by factories
per accumulator type, so one Python definition serves every dtype; numba compiles one specialisation
per array type on first use, which the backend triggers in `prepare`, before the loop.

Launch shapes: elementwise kernels use a grid-stride loop over the flattened output; row kernels use
one block per row and a shared-memory tree reduction. Shapes are passed as scalars (no small device
arrays per launch), so arguments never allocate.
"""

from __future__ import annotations

import math
from functools import lru_cache

from runtime.backends.cuda.compat import cuda, simulated

ROW_THREADS = 8 if simulated() else 256
"""Threads per row of a row kernel (a power of two). The simulator runs each thread as Python (~80 us
apiece), so its launches use few threads, each looping over more elements."""
ELEMENT_THREADS = 16 if simulated() else 256
MAX_BLOCKS = 1 if simulated() else 132 * 16
"""Enough blocks to fill an H200 (132 SMs) many times over; the grid-stride loop covers the rest."""


def _types():
    from numba.cuda import types

    return types


def acc_type(dtype: str):
    types = _types()
    return types.float64 if dtype == "float64" else types.float32


def element_grid(count: int) -> tuple[int, int]:
    blocks = max(1, min(MAX_BLOCKS, (count + ELEMENT_THREADS - 1) // ELEMENT_THREADS))
    return blocks, ELEMENT_THREADS


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


UNARY = {"relu": 0, "gelu": 1, "silu": 2, "exp": 3, "scale": 4}
BINARY = {"add": 0, "sub": 1, "mul": 2}


@lru_cache(maxsize=None)
def unary(name: str, dtype: str):
    """out[i] = f(x[i]) over flat arrays; `scale` takes its factor as a scalar argument."""
    acc = acc_type(dtype)
    kind = UNARY[name]
    zero, one, two = acc(0.0), acc(1.0), acc(2.0)
    c0, c1 = acc(SQRT_2_OVER_PI), acc(0.044715)

    @cuda.jit(fastmath=True)
    def kernel(x, out, factor):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, out.size, step):
            v = acc(x[i])
            if kind == 0:
                r = v if v > zero else zero
            elif kind == 1:  # the tanh GELU: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), one exp instead of a tanh
                r = v / (one + math.exp(-two * c0 * v * (one + c1 * v * v)))
            elif kind == 2:
                r = v / (one + math.exp(-v))
            elif kind == 3:
                r = math.exp(v)
            else:
                r = v * acc(factor)
            out[i] = r

    return kernel


@lru_cache(maxsize=None)
def binary_same(name: str, dtype: str):
    """out[i] = a[i] op b[i] for operands of the output's shape (the common, broadcast-free case)."""
    acc = acc_type(dtype)
    kind = BINARY[name]

    @cuda.jit
    def kernel(a, b, out):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, out.size, step):
            x, y = acc(a[i]), acc(b[i])
            out[i] = x + y if kind == 0 else (x - y if kind == 1 else x * y)

    return kernel


@lru_cache(maxsize=None)
def binary_broadcast(name: str, dtype: str):
    """out = a op b with numpy broadcasting, the output's shape folded to 4 dims (d0 implied) and each
    operand given by its element strides per dim (0 where it broadcasts)."""
    acc = acc_type(dtype)
    kind = BINARY[name]

    @cuda.jit
    def kernel(a, b, out, d1, d2, d3, sa0, sa1, sa2, sa3, sb0, sb1, sb2, sb3):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, out.size, step):
            c3 = i % d3
            r = i // d3
            c2 = r % d2
            r = r // d2
            c1 = r % d1
            c0 = r // d1
            x = acc(a[c0 * sa0 + c1 * sa1 + c2 * sa2 + c3 * sa3])
            y = acc(b[c0 * sb0 + c1 * sb1 + c2 * sb2 + c3 * sb3])
            out[i] = x + y if kind == 0 else (x - y if kind == 1 else x * y)

    return kernel


def broadcast_strides(out_shape, a_shape, b_shape):
    """(d1, d2, d3, a strides, b strides) for `binary_broadcast`, or None beyond 4 dims after folding."""
    rank = len(out_shape)
    dims = []
    for shape in (a_shape, b_shape):
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        strides, step = [0] * rank, 1
        for axis in range(rank - 1, -1, -1):
            strides[axis] = step if padded[axis] != 1 else 0
            step *= padded[axis]
        dims.append(strides)
    axes = _fold(list(out_shape), dims[0], dims[1])
    if len(axes) > 4:
        return None
    axes = [(1, 0, 0)] * (4 - len(axes)) + axes
    sizes = [size for size, _, _ in axes]
    return (sizes[1], sizes[2], sizes[3]), [sa for _, sa, _ in axes], [sb for _, _, sb in axes]


def _fold(shape, sa, sb):
    """Merge adjacent axes that both operands step through contiguously (or both skip), innermost first."""
    axes = []
    for size, a, b in zip(shape, sa, sb):
        if size == 1:
            continue
        if axes:
            psize, pa, pb = axes[-1]
            if pa == a * size and pb == b * size:
                axes[-1] = (psize * size, a, b)
                continue
        axes.append((size, a, b))
    return axes or [(1, 0, 0)]


@lru_cache(maxsize=None)
def swiglu(dtype: str):
    acc = acc_type(dtype)
    one = acc(1.0)

    @cuda.jit(fastmath=True)
    def kernel(gate, up, out):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, out.size, step):
            g = acc(gate[i])
            out[i] = g / (one + math.exp(-g)) * acc(up[i])

    return kernel


@lru_cache(maxsize=None)
def rope(dtype: str):
    """Hugging Face rotate_half rope on x [t, n] with cos, sin [t, d]: each head is d columns of x.

    One block per token. A thread owns a pair (j, j + d/2) of one head, so it reads each element once
    and writes both results; the block's threads cover several heads and step over the rest."""
    acc = acc_type(dtype)

    @cuda.jit(fastmath=True)
    def kernel(x, cos, sin, out):
        t = cuda.blockIdx.x
        d = cos.shape[1]
        half = d // 2
        heads = x.shape[1] // d
        tid = cuda.threadIdx.x
        span = cuda.blockDim.x // half  # heads one sweep of the block covers
        if span == 0:
            span = 1
        j = tid % half
        first = tid // half
        if first >= span:
            return
        c1, s1 = acc(cos[t, j]), acc(sin[t, j])
        c2, s2 = acc(cos[t, j + half]), acc(sin[t, j + half])
        for h in range(first, heads, span):
            base = h * d
            a = acc(x[t, base + j])
            b = acc(x[t, base + j + half])
            out[t, base + j] = a * c1 - b * s1
            out[t, base + j + half] = b * c2 + a * s2

    return kernel


def rope_grid(tokens: int, width: int) -> tuple[int, int]:
    """One block per token; threads cover whole pairs of heads' columns (at least one head's d/2 pairs)."""
    half = max(width // 2, 1)
    threads = ROW_THREADS if simulated() else 256
    return max(tokens, 1), max(half, threads // half * half)


@lru_cache(maxsize=None)
def softmax(dtype: str):
    """Softmax over the last axis of x viewed as [rows, cols]; one block per row, three passes (max, sum,
    write). An online two-pass variant measured slower on the H200 (0.17 of the HBM copy rate against 0.23)."""
    acc = acc_type(dtype)
    threads = ROW_THREADS

    @cuda.jit(fastmath=True)
    def kernel(x, out):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        cols = x.shape[1]
        shared = cuda.shared.array(ROW_THREADS, acc)
        best = -math.inf
        for j in range(tid, cols, threads):
            v = acc(x[row, j])
            if v > best:
                best = v
        shared[tid] = best
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if tid < width and shared[tid + width] > shared[tid]:
                shared[tid] = shared[tid + width]
            cuda.syncthreads()
            width //= 2
        top = shared[0]
        cuda.syncthreads()
        total = acc(0.0)
        for j in range(tid, cols, threads):
            total += math.exp(acc(x[row, j]) - top)
        shared[tid] = total
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if tid < width:
                shared[tid] += shared[tid + width]
            cuda.syncthreads()
            width //= 2
        total = shared[0]
        for j in range(tid, cols, threads):
            out[row, j] = math.exp(acc(x[row, j]) - top) / total

    return kernel


@lru_cache(maxsize=None)
def rmsnorm(dtype: str, weighted: bool):
    """x / sqrt(mean(x^2) + eps) [* w] over the last axis of x viewed as [rows, cols]; one block per row.
    The sum of squares loads four elements per step, so four loads are in flight per thread."""
    acc = acc_type(dtype)
    threads = ROW_THREADS

    @cuda.jit(fastmath=True)
    def kernel(x, w, out, eps):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        cols = x.shape[1]
        shared = cuda.shared.array(ROW_THREADS, acc)
        total = acc(0.0)
        j = tid
        while j + 3 * threads < cols:
            a = acc(x[row, j])
            b = acc(x[row, j + threads])
            c = acc(x[row, j + 2 * threads])
            d = acc(x[row, j + 3 * threads])
            total += a * a + b * b + c * c + d * d
            j += 4 * threads
        while j < cols:
            a = acc(x[row, j])
            total += a * a
            j += threads
        shared[tid] = total
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if tid < width:
                shared[tid] += shared[tid + width]
            cuda.syncthreads()
            width //= 2
        inv = acc(1.0) / math.sqrt(shared[0] / acc(cols) + acc(eps))
        for j in range(tid, cols, threads):
            v = acc(x[row, j]) * inv
            if weighted:
                v = v * acc(w[j])
            out[row, j] = v

    return kernel


@lru_cache(maxsize=None)
def attention_merge(out_dtype: str, has_prev: bool, final: bool):
    """Fold one key block's attention (o [heads, tq, d], lse [heads, tq], for heads h0..h0+heads) into
    the packed partial `prev` [tq, H*d + H] (float32), writing `out`: the normalised output [tq, H*d]
    when `final`, else the new packed partial. One block per query row; each warp takes a head at a time
    (its weights computed once) and its lanes sweep d, so nothing divides per element."""
    acc = acc_type("float32")

    @cuda.jit(fastmath=True)
    def kernel(o, lse, prev, out, h0, total_heads):
        t = cuda.blockIdx.x
        heads, d = o.shape[0], o.shape[2]
        width = total_heads * d
        lanes = 32 if cuda.blockDim.x >= 32 else cuda.blockDim.x
        lane = cuda.threadIdx.x % lanes
        warps = cuda.blockDim.x // lanes
        for h in range(cuda.threadIdx.x // lanes, heads, warps):
            base = (h0 + h) * d
            lb = acc(lse[h, t])
            wp = acc(0.0)
            wb = acc(1.0)
            merged = lb
            if has_prev:
                lp = acc(prev[t, width + h0 + h])
                top = max(lp, lb)
                wp = math.exp(lp - top)
                wb = math.exp(lb - top)
                total = wp + wb
                merged = top + math.log(total)
                wp = wp / total
                wb = wb / total
            for j in range(lane, d, lanes):
                value = acc(o[h, t, j]) * wb
                if has_prev:
                    value += acc(prev[t, base + j]) * wp
                out[t, base + j] = value
            if not final and lane == 0:
                out[t, width + h0 + h] = merged

    return kernel


def merge_grid(tq: int, heads: int, d: int) -> tuple[int, int]:
    """One block per query row: 8 warps on a GPU (one head each at a time), a few threads in the simulator."""
    return max(tq, 1), ROW_THREADS if simulated() else 256


@lru_cache(maxsize=None)
def attention_scores_softmax(dtype: str, causal: bool):
    """In place over scores s [heads, tq, tk] (already scaled): masked softmax per row, writing the row's
    log-sum-exp to lse [heads, tq]. One block per (head, row)."""
    acc = acc_type(dtype)
    threads = ROW_THREADS

    @cuda.jit(fastmath=True)
    def kernel(s, lse):
        tq, tk = s.shape[1], s.shape[2]
        h = cuda.blockIdx.x // tq
        t = cuda.blockIdx.x % tq
        tid = cuda.threadIdx.x
        limit = t + 1 if causal else tk
        shared = cuda.shared.array(ROW_THREADS, acc)
        best = -math.inf
        for j in range(tid, limit, threads):
            v = acc(s[h, t, j])
            if v > best:
                best = v
        shared[tid] = best
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if tid < width and shared[tid + width] > shared[tid]:
                shared[tid] = shared[tid + width]
            cuda.syncthreads()
            width //= 2
        top = shared[0]
        cuda.syncthreads()
        total = acc(0.0)
        for j in range(tid, limit, threads):
            total += math.exp(acc(s[h, t, j]) - top)
        shared[tid] = total
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if tid < width:
                shared[tid] += shared[tid + width]
            cuda.syncthreads()
            width //= 2
        total = shared[0]
        for j in range(tid, tk, threads):
            s[h, t, j] = math.exp(acc(s[h, t, j]) - top) / total if j < limit else acc(0.0)
        if tid == 0:
            lse[h, t] = top + math.log(total)

    return kernel

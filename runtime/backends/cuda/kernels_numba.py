"""numba-cuda kernels for everything that is not a GEMM: elementwise, broadcasting binary ops, row
reductions (softmax, rmsnorm), rope, swiglu, and the attention merge.

Each kernel reads its inputs in the tensors' own dtype, computes in `acc` (float32 for float16 and
float32 tensors, float64 for float64) and rounds once when it stores. Kernels are built by factories
per accumulator type, so one Python definition serves every dtype; numba compiles one specialisation
per array type on first use, which the backend triggers in `prepare`, before the loop.

Launch shapes: elementwise kernels use a grid-stride loop over the flattened output; row kernels use
one block per row and a shared-memory tree reduction; the attention merge uses a warp per (row, head).
Every loop loads four elements per operand before it uses any (see `_load4`): memory-bound kernels
are limited by the bytes each thread keeps in flight, not by arithmetic. Shapes are passed as scalars (no small device
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


def device(fastmath: bool = False):
    """A numba device function, inlined into its callers on a GPU (the simulator knows no `forceinline`)."""
    if simulated():
        return cuda.jit(device=True)
    return cuda.jit(device=True, forceinline=True, fastmath=fastmath)


def _types():
    from numba.cuda import types

    return types


def acc_type(dtype: str):
    types = _types()
    return types.float64 if dtype == "float64" else types.float32


def element_grid(count: int) -> tuple[int, int]:
    """Enough threads for four elements each (the unrolled step), at most MAX_BLOCKS blocks."""
    per_block = 4 * ELEMENT_THREADS
    blocks = max(1, min(MAX_BLOCKS, (count + per_block - 1) // per_block))
    return blocks, ELEMENT_THREADS


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


UNARY = {"relu": 0, "gelu": 1, "silu": 2, "exp": 3, "scale": 4}
BINARY = {"add": 0, "sub": 1, "mul": 2}


# Memory-level parallelism. A thread that loads one fp16 element, waits for it and stores it keeps two
# bytes in flight: far too few to cover HBM latency (the first versions of these kernels reached 0.23 to
# 0.54 of the copy rate that way). So every loop below issues four loads per operand before it computes or
# stores anything: `_load4` reads elements i, i + step, i + 2 step, i + 3 step (each one coalesced across a
# warp), and the loop then steps by 4 step, with a plain loop for the tail.
@device()
def _load4(x, i, step):
    return x[i], x[i + step], x[i + 2 * step], x[i + 3 * step]


@device()
def _row4(x, row, j, step):
    return x[row, j], x[row, j + step], x[row, j + 2 * step], x[row, j + 3 * step]


@device()
def _block_sum(shared, tid, value, threads):
    """The sum of `value` over the block's `threads` threads (a power of two), through `shared`."""
    shared[tid] = value
    cuda.syncthreads()
    width = threads // 2
    while width > 0:
        if tid < width:
            shared[tid] += shared[tid + width]
        cuda.syncthreads()
        width //= 2
    total = shared[0]
    cuda.syncthreads()  # everyone has read it before `shared` is reused
    return total


def _unary_op(kind: int, acc):
    zero, one, two = acc(0.0), acc(1.0), acc(2.0)
    c0, c1 = acc(SQRT_2_OVER_PI), acc(0.044715)

    @device(fastmath=True)
    def op(v, factor):
        if kind == 0:
            return v if v > zero else zero
        if kind == 1:  # the tanh GELU: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), one exp instead of a tanh
            return v / (one + math.exp(-two * c0 * v * (one + c1 * v * v)))
        if kind == 2:
            return v / (one + math.exp(-v))
        if kind == 3:
            return math.exp(v)
        return v * factor

    return op


@lru_cache(maxsize=None)
def unary(name: str, dtype: str):
    """out[i] = f(x[i]) over flat arrays; `scale` takes its factor as a scalar argument."""
    acc = acc_type(dtype)
    op = _unary_op(UNARY[name], acc)

    @cuda.jit(fastmath=True)
    def kernel(x, out, factor):
        n = out.size
        f = acc(factor)
        i, step = cuda.grid(1), cuda.gridsize(1)
        while i + 3 * step < n:
            a, b, c, d = _load4(x, i, step)
            out[i] = op(acc(a), f)
            out[i + step] = op(acc(b), f)
            out[i + 2 * step] = op(acc(c), f)
            out[i + 3 * step] = op(acc(d), f)
            i += 4 * step
        while i < n:
            out[i] = op(acc(x[i]), f)
            i += step

    return kernel


def _binary_op(kind: int):
    @device()
    def op(x, y):
        if kind == 0:
            return x + y
        if kind == 1:
            return x - y
        return x * y

    return op


@lru_cache(maxsize=None)
def binary_same(name: str, dtype: str):
    """out[i] = a[i] op b[i] for operands of the output's shape (the common, broadcast-free case)."""
    acc = acc_type(dtype)
    op = _binary_op(BINARY[name])

    @cuda.jit
    def kernel(a, b, out):
        n = out.size
        i, step = cuda.grid(1), cuda.gridsize(1)
        while i + 3 * step < n:
            a0, a1, a2, a3 = _load4(a, i, step)
            b0, b1, b2, b3 = _load4(b, i, step)
            out[i] = op(acc(a0), acc(b0))
            out[i + step] = op(acc(a1), acc(b1))
            out[i + 2 * step] = op(acc(a2), acc(b2))
            out[i + 3 * step] = op(acc(a3), acc(b3))
            i += 4 * step
        while i < n:
            out[i] = op(acc(a[i]), acc(b[i]))
            i += step

    return kernel


@lru_cache(maxsize=None)
def binary_broadcast(name: str, dtype: str):
    """out = a op b with numpy broadcasting, the output's shape folded to 4 dims (d0 implied) and each
    operand given by its element strides per dim (0 where it broadcasts)."""
    acc = acc_type(dtype)
    op = _binary_op(BINARY[name])

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
            out[i] = op(x, y)

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

    @device(fastmath=True)
    def op(g, u):
        return g / (one + math.exp(-g)) * u

    @cuda.jit(fastmath=True)
    def kernel(gate, up, out):
        n = out.size
        i, step = cuda.grid(1), cuda.gridsize(1)
        while i + 3 * step < n:
            g0, g1, g2, g3 = _load4(gate, i, step)
            u0, u1, u2, u3 = _load4(up, i, step)
            out[i] = op(acc(g0), acc(u0))
            out[i + step] = op(acc(g1), acc(u1))
            out[i + 2 * step] = op(acc(g2), acc(u2))
            out[i + 3 * step] = op(acc(g3), acc(u3))
            i += 4 * step
        while i < n:
            out[i] = op(acc(gate[i]), acc(up[i]))
            i += step

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


def lowest(acc):
    """The most negative finite value of `acc`: a running maximum's start that stays finite under fastmath."""
    types = _types()
    return acc(-1.0e308) if acc == types.float64 else acc(-3.0e38)


@lru_cache(maxsize=None)
def softmax(dtype: str):
    """Softmax over the last axis of x viewed as [rows, cols]; one block per row, two passes over the row.

    Pass one keeps each thread's running maximum m and sum s of exp(x - m), four elements at a time (one
    rescale of s per four), and the block combines the (m, s) pairs; pass two writes exp(x - M) / S. The
    second read of the row mostly hits L2. (A three-pass version loading one element per step reached 0.23
    of the HBM copy rate on the H200.)"""
    acc = acc_type(dtype)
    threads = ROW_THREADS
    start = lowest(acc)

    @cuda.jit(fastmath=True)
    def kernel(x, out):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        cols = x.shape[1]
        top = cuda.shared.array(ROW_THREADS, acc)
        sums = cuda.shared.array(ROW_THREADS, acc)
        m = start
        s = acc(0.0)
        j = tid
        while j + 3 * threads < cols:
            a, b, c, d = _row4(x, row, j, threads)
            a, b, c, d = acc(a), acc(b), acc(c), acc(d)
            chunk = max(max(a, b), max(c, d))
            if chunk > m:
                s = s * math.exp(m - chunk)
                m = chunk
            s += math.exp(a - m) + math.exp(b - m) + math.exp(c - m) + math.exp(d - m)
            j += 4 * threads
        while j < cols:
            v = acc(x[row, j])
            if v > m:
                s = s * math.exp(m - v)
                m = v
            s += math.exp(v - m)
            j += threads
        top[tid] = m
        sums[tid] = s
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if tid < width:
                m1, m2 = top[tid], top[tid + width]
                both = max(m1, m2)
                sums[tid] = sums[tid] * math.exp(m1 - both) + sums[tid + width] * math.exp(m2 - both)
                top[tid] = both
            cuda.syncthreads()
            width //= 2
        m = top[0]
        inv = acc(1.0) / sums[0]
        j = tid
        while j + 3 * threads < cols:
            a, b, c, d = _row4(x, row, j, threads)
            out[row, j] = math.exp(acc(a) - m) * inv
            out[row, j + threads] = math.exp(acc(b) - m) * inv
            out[row, j + 2 * threads] = math.exp(acc(c) - m) * inv
            out[row, j + 3 * threads] = math.exp(acc(d) - m) * inv
            j += 4 * threads
        while j < cols:
            out[row, j] = math.exp(acc(x[row, j]) - m) * inv
            j += threads

    return kernel


@lru_cache(maxsize=None)
def rmsnorm(dtype: str, weighted: bool):
    """x / sqrt(mean(x^2) + eps) [* w] over the last axis of x viewed as [rows, cols]; one block per row.
    Both passes load four elements per operand before using any (the second read of the row mostly hits
    L2); without `weighted`, w is a dummy the kernel never reads."""
    acc = acc_type(dtype)
    threads = ROW_THREADS
    one = acc(1.0)

    @cuda.jit(fastmath=True)
    def kernel(x, w, out, eps):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        cols = x.shape[1]
        shared = cuda.shared.array(ROW_THREADS, acc)
        total = acc(0.0)
        j = tid
        while j + 7 * threads < cols:
            a, b, c, d = _row4(x, row, j, threads)
            e, f, g, h = _row4(x, row, j + 4 * threads, threads)
            a, b, c, d, e, f, g, h = acc(a), acc(b), acc(c), acc(d), acc(e), acc(f), acc(g), acc(h)
            total += (a * a + b * b) + (c * c + d * d) + (e * e + f * f) + (g * g + h * h)
            j += 8 * threads
        while j < cols:
            a = acc(x[row, j])
            total += a * a
            j += threads
        inv = one / math.sqrt(_block_sum(shared, tid, total, threads) / acc(cols) + acc(eps))
        j = tid
        while j + 3 * threads < cols:
            a, b, c, d = _row4(x, row, j, threads)
            if weighted:
                wa, wb, wc, wd = _load4(w, j, threads)
                out[row, j] = acc(a) * inv * acc(wa)
                out[row, j + threads] = acc(b) * inv * acc(wb)
                out[row, j + 2 * threads] = acc(c) * inv * acc(wc)
                out[row, j + 3 * threads] = acc(d) * inv * acc(wd)
            else:
                out[row, j] = acc(a) * inv
                out[row, j + threads] = acc(b) * inv
                out[row, j + 2 * threads] = acc(c) * inv
                out[row, j + 3 * threads] = acc(d) * inv
            j += 4 * threads
        while j < cols:
            v = acc(x[row, j]) * inv
            if weighted:
                v = v * acc(w[j])
            out[row, j] = v
            j += threads

    return kernel


@lru_cache(maxsize=None)
def attention_merge(out_dtype: str, has_prev: bool, final: bool):
    """Fold one key block's attention (o [heads, tq, d], lse [heads, tq], for heads h0..h0+heads) into
    the packed partial `prev` [tq, H*d + H] (float32), writing `out`: the normalised output [tq, H*d]
    when `final`, else the new packed partial.

    One warp per (query row, head), rows outermost, so consecutive warps sweep consecutive memory of o,
    prev and out. A lane loads four elements of o and four of prev (j = lane + 32 m) before it computes,
    and computes the two weights once per warp, so nothing divides per element. (A block per query row,
    each warp sweeping its heads one element per lane at a time, merged at about 0.6 TB/s on the H200.)"""
    acc = acc_type("float32")
    zero = acc(0.0)

    @cuda.jit(fastmath=True)
    def kernel(o, lse, prev, out, h0, total_heads):
        heads, tq, d = o.shape[0], o.shape[1], o.shape[2]
        width = total_heads * d
        lanes = 32 if cuda.blockDim.x >= 32 else cuda.blockDim.x
        lane = cuda.threadIdx.x % lanes
        pair = cuda.blockIdx.x * (cuda.blockDim.x // lanes) + cuda.threadIdx.x // lanes
        if pair >= tq * heads:
            return
        t = pair // heads
        h = pair % heads
        base = (h0 + h) * d
        lb = acc(lse[h, t])
        wp = zero
        wb = acc(1.0)
        merged = lb
        if has_prev:
            lp = prev[t, width + h0 + h]
            top = max(lp, lb)
            wp = math.exp(lp - top)
            wb = math.exp(lb - top)
            total = wp + wb
            merged = top + math.log(total)
            wp = wp / total
            wb = wb / total
        for first in range(0, d, 4 * lanes):
            j = first + lane
            o0 = acc(o[h, t, j]) if j < d else zero
            o1 = acc(o[h, t, j + lanes]) if j + lanes < d else zero
            o2 = acc(o[h, t, j + 2 * lanes]) if j + 2 * lanes < d else zero
            o3 = acc(o[h, t, j + 3 * lanes]) if j + 3 * lanes < d else zero
            p0, p1, p2, p3 = zero, zero, zero, zero
            if has_prev:
                p0 = prev[t, base + j] if j < d else zero
                p1 = prev[t, base + j + lanes] if j + lanes < d else zero
                p2 = prev[t, base + j + 2 * lanes] if j + 2 * lanes < d else zero
                p3 = prev[t, base + j + 3 * lanes] if j + 3 * lanes < d else zero
            if j < d:
                out[t, base + j] = o0 * wb + p0 * wp
            if j + lanes < d:
                out[t, base + j + lanes] = o1 * wb + p1 * wp
            if j + 2 * lanes < d:
                out[t, base + j + 2 * lanes] = o2 * wb + p2 * wp
            if j + 3 * lanes < d:
                out[t, base + j + 3 * lanes] = o3 * wb + p3 * wp
        if not final and lane == 0:
            out[t, width + h0 + h] = merged

    return kernel


MERGE_THREADS = 8 if simulated() else 256


def merge_grid(tq: int, heads: int, d: int) -> tuple[int, int]:
    """A warp per (query row, head): 8 per block on a GPU; in the simulator a "warp" is the block's 8 threads."""
    per_block = MERGE_THREADS // min(32, MERGE_THREADS)
    return max(1, (tq * heads + per_block - 1) // per_block), MERGE_THREADS


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

"""numba-cuda kernels for everything that is not a GEMM: elementwise, broadcasting binary ops, row
reductions (softmax, rmsnorm), rope, swiglu, and the attention merge.

Each kernel reads its inputs in the tensors' own dtype, computes in `acc` (float32 for float16, bfloat16
and float32 tensors, float64 for float64) and rounds once when it stores: `codec(dtype)` gives the pair
(get, put) that reads an element into `acc` and writes one back (a numba cast, or for bfloat16, stored as
uint16 words, the bit conversions of bfloat16.py). Kernels are built by factories
per accumulator type, so one Python definition serves every dtype; numba compiles one specialisation
per array type on first use, which the backend triggers in `prepare`, before the loop.

Launch shapes: elementwise kernels use a grid-stride loop over the flattened output; row kernels and
the attention merge use one block per row, rows with a shared-memory tree reduction.
Memory-bound kernels are limited by the bytes each thread keeps in flight, not by arithmetic: the
elementwise and row kernels move four elements per vector instruction (see `quads`). Shapes are passed
as scalars (no small device arrays per launch), so arguments never allocate.
"""

from __future__ import annotations

import math
from functools import lru_cache

from runtime.backends.cuda import bfloat16 as BF
from runtime.backends.cuda import vector as V
from runtime.backends.cuda.compat import cached_kernel, cuda, device, simulated
from runtime.backends.cuda.vector import rows_aligned

ROW_THREADS, ELEMENT_THREADS, MAX_BLOCKS = (8, 16, 1) if simulated() else (256, 256, 132 * 16)
"""Threads per row of a row kernel (a power of two), threads per block of an elementwise kernel, and
blocks at most: enough to fill an H200 (132 SMs) many times over; the grid-stride loop covers the rest.
The simulator runs each thread as Python, so its launches use few threads, each looping over more
elements (decided at import, where the kernels are compiled: compat.py)."""


def _types():
    from numba.cuda import types

    return types


def acc_type(dtype: str):
    types = _types()
    return types.float64 if dtype == "float64" else types.float32


@device()
def _same(value):
    return value  # numba casts to the array's type on the store


def codec(dtype: str):
    """(get, put) for elements of a `dtype` tensor: get reads one into the accumulator type, put gives
    what to store (bfloat16: uint16 words converted in-kernel, bfloat16.py)."""
    if dtype == "bfloat16":
        return BF.load, BF.store
    return acc_type(dtype), _same


def element_grid(count: int) -> tuple[int, int]:
    """Enough threads for four elements each (the unrolled step), at most MAX_BLOCKS blocks."""
    per_block = 4 * ELEMENT_THREADS
    blocks = max(1, min(MAX_BLOCKS, (count + per_block - 1) // per_block))
    return blocks, ELEMENT_THREADS


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


UNARY = {"relu": 0, "gelu": 1, "silu": 2, "exp": 3, "scale": 4}
BINARY = {"add": 0, "sub": 1, "mul": 2}


# Memory-level parallelism. A thread that loads one fp16 element, waits for it and stores it keeps two
# bytes in flight: far too few to cover HBM latency (the first versions of these kernels fell far short of
# the copy rate that way: docs/benchmarks.md, "The cuda backend on the H200"). So the elementwise and row kernels work on quads, four consecutive
# elements read by one vector load (`vector.load4`: one `ld.global.v4`, 8 bytes of float16 per thread,
# 256 per warp) and written by one vector store, two quads in flight per thread; where an operand is not
# aligned to four elements the factories' `vector=False` build reads the same quads element by element.
# The rope kernel takes two heads per step, so four loads are in flight.
def quads(vector: bool):
    """(load4, store4): vector instructions, or the same four elements one at a time."""
    return (V.load4, V.store4) if vector else (V.element_load4, V.element_store4)


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
def unary(name: str, dtype: str, vector: bool = True):
    """out[i] = f(x[i]) over flat arrays; `scale` takes its factor as a scalar argument."""
    acc = acc_type(dtype)
    get, put = codec(dtype)
    op = _unary_op(UNARY[name], acc)
    ld, st = quads(vector)

    @cached_kernel(fastmath=True)
    def kernel(x, out, factor):
        n = out.size
        f = acc(factor)
        q, step = cuda.grid(1), cuda.gridsize(1)
        count = n // 4
        while q + step < count:
            a0, a1, a2, a3 = ld(x, 4 * q)
            b0, b1, b2, b3 = ld(x, 4 * (q + step))
            st(out, 4 * q, put(op(get(a0), f)), put(op(get(a1), f)), put(op(get(a2), f)), put(op(get(a3), f)))
            st(out, 4 * (q + step), put(op(get(b0), f)), put(op(get(b1), f)), put(op(get(b2), f)), put(op(get(b3), f)))
            q += 2 * step
        if q < count:
            a0, a1, a2, a3 = ld(x, 4 * q)
            st(out, 4 * q, put(op(get(a0), f)), put(op(get(a1), f)), put(op(get(a2), f)), put(op(get(a3), f)))
        i = 4 * count + cuda.grid(1)
        if i < n:
            out[i] = put(op(get(x[i]), f))

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


def _two_operand(op, dtype: str, vector: bool, fastmath: bool):
    """out[i] = op(a[i], b[i]) over flat arrays of one shape, a quad of each operand at a time."""
    get, put = codec(dtype)
    ld, st = quads(vector)

    @cached_kernel(fastmath=fastmath)
    def kernel(a, b, out):
        n = out.size
        q, step = cuda.grid(1), cuda.gridsize(1)
        count = n // 4
        while q < count:
            a0, a1, a2, a3 = ld(a, 4 * q)
            b0, b1, b2, b3 = ld(b, 4 * q)
            st(out, 4 * q, put(op(get(a0), get(b0))), put(op(get(a1), get(b1))), put(op(get(a2), get(b2))), put(op(get(a3), get(b3))))
            q += step
        i = 4 * count + cuda.grid(1)
        if i < n:
            out[i] = put(op(get(a[i]), get(b[i])))

    return kernel


@lru_cache(maxsize=None)
def binary_same(name: str, dtype: str, vector: bool = True):
    """out[i] = a[i] op b[i] for operands of the output's shape (the common, broadcast-free case)."""
    return _two_operand(_binary_op(BINARY[name]), dtype, vector, fastmath=False)


@lru_cache(maxsize=None)
def binary_broadcast(name: str, dtype: str):
    """out = a op b with numpy broadcasting, the output's shape folded to 4 dims (d0 implied) and each
    operand given by its element strides per dim (0 where it broadcasts)."""
    get, put = codec(dtype)
    op = _binary_op(BINARY[name])

    @cached_kernel()
    def kernel(a, b, out, d1, d2, d3, sa0, sa1, sa2, sa3, sb0, sb1, sb2, sb3):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, out.size, step):
            c3 = i % d3
            r = i // d3
            c2 = r % d2
            r = r // d2
            c1 = r % d1
            c0 = r // d1
            x = get(a[c0 * sa0 + c1 * sa1 + c2 * sa2 + c3 * sa3])
            y = get(b[c0 * sb0 + c1 * sb1 + c2 * sb2 + c3 * sb3])
            out[i] = put(op(x, y))

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
def swiglu(dtype: str, vector: bool = True):
    """out[i] = silu(gate[i]) * up[i]."""
    acc = acc_type(dtype)
    one = acc(1.0)

    @device(fastmath=True)
    def op(g, u):
        return g / (one + math.exp(-g)) * u

    return _two_operand(op, dtype, vector, fastmath=True)


def rope(dtype: str, vector: bool = False):
    """Hugging Face rotate_half rope on x [t, n] with cos, sin [t, d]: each head is d columns of x.

    One block per token, grid `rope_grid(tokens, d, vector)`. Element by element (`vector=False`) a thread
    owns a pair (j, j + d/2) of one head, so it reads each element once and writes both results; the
    block's threads cover several heads and step over the rest, two heads at a time. By quads (`vector`,
    for d/2 a multiple of 4 and every operand aligned to four elements: `rope_vector`) a thread owns four
    consecutive pairs and reads and writes them with one vector instruction each: four times the bytes in
    flight per load. Element by element, rope on 7b's 4096 x 4096 blocks reached 0.31 of the HBM copy
    rate (docs/runtime.md, "The cost model")."""
    return _rope_quads(dtype) if vector else _rope_elements(dtype)


@lru_cache(maxsize=None)
def _rope_elements(dtype: str):
    """`rope` element by element."""
    get, put = codec(dtype)

    @cached_kernel(fastmath=True)
    def by_elements(x, cos, sin, out):
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
        c1, s1 = get(cos[t, j]), get(sin[t, j])
        c2, s2 = get(cos[t, j + half]), get(sin[t, j + half])
        h = first
        while h + span < heads:  # two heads at a time: four loads in flight
            base, other = h * d, (h + span) * d
            a, b = get(x[t, base + j]), get(x[t, base + j + half])
            e, f = get(x[t, other + j]), get(x[t, other + j + half])
            out[t, base + j] = put(a * c1 - b * s1)
            out[t, base + j + half] = put(b * c2 + a * s2)
            out[t, other + j] = put(e * c1 - f * s1)
            out[t, other + j + half] = put(f * c2 + e * s2)
            h += 2 * span
        if h < heads:
            base = h * d
            a, b = get(x[t, base + j]), get(x[t, base + j + half])
            out[t, base + j] = put(a * c1 - b * s1)
            out[t, base + j + half] = put(b * c2 + a * s2)

    return by_elements


@lru_cache(maxsize=None)
def _rope_quads(dtype: str):
    """`rope` by quads (on the simulator `vector.load4_2` reads them element by element)."""
    get, put = codec(dtype)
    ld, st = V.load4_2, V.store4_2

    @cached_kernel(fastmath=True)
    def by_quads(x, cos, sin, out):
        t = cuda.blockIdx.x
        d = cos.shape[1]
        half = d // 2
        per_head = half // 4  # threads per head: one quad of pairs each
        heads = x.shape[1] // d
        tid = cuda.threadIdx.x
        span = cuda.blockDim.x // per_head
        if span == 0:
            span = 1
        j = (tid % per_head) * 4
        first = tid // per_head
        if first >= span:
            return
        w0, w1, w2, w3 = ld(cos, t, j)  # raw words (the codec's storage type), decoded once below
        v0, v1, v2, v3 = ld(sin, t, j)
        y0, y1, y2, y3 = ld(cos, t, j + half)
        z0, z1, z2, z3 = ld(sin, t, j + half)
        c0, c1, c2, c3 = get(w0), get(w1), get(w2), get(w3)
        s0, s1, s2, s3 = get(v0), get(v1), get(v2), get(v3)
        k0, k1, k2, k3 = get(y0), get(y1), get(y2), get(y3)
        r0, r1, r2, r3 = get(z0), get(z1), get(z2), get(z3)
        h = first
        while h < heads:
            base = h * d
            p0, p1, p2, p3 = ld(x, t, base + j)
            q0, q1, q2, q3 = ld(x, t, base + j + half)
            a0, a1, a2, a3 = get(p0), get(p1), get(p2), get(p3)
            b0, b1, b2, b3 = get(q0), get(q1), get(q2), get(q3)
            st(out, t, base + j, put(a0 * c0 - b0 * s0), put(a1 * c1 - b1 * s1), put(a2 * c2 - b2 * s2), put(a3 * c3 - b3 * s3))
            st(out, t, base + j + half, put(b0 * k0 + a0 * r0), put(b1 * k1 + a1 * r1), put(b2 * k2 + a2 * r2), put(b3 * k3 + a3 * r3))
            h += span

    return by_quads


ROPE_BUILD = "quads"
"""How rope runs where heads allow it (bench/run.py records it: the cost model's rope share depends on it)."""


def rope_vector(width: int) -> bool:
    """Whether rope may run by quads on heads of `width` columns (the operands' rows aligned to four
    elements aside, which the builder checks)."""
    return width % 8 == 0


def rope_grid(tokens: int, width: int, vector: bool = False) -> tuple[int, int]:
    """One block per token; threads cover whole heads' pairs (by quads: d/8 threads a head), at least one
    head's, ROW_THREADS where that is more."""
    per_head = max(width // 8 if vector else width // 2, 1)
    threads = ROW_THREADS
    return max(tokens, 1), max(per_head, threads // per_head * per_head)


def lowest(acc):
    """The most negative finite value of `acc`: a running maximum's start that stays finite under fastmath."""
    types = _types()
    return acc(-1.0e308) if acc == types.float64 else acc(-3.0e38)


@lru_cache(maxsize=None)
def softmax(dtype: str, vector: bool = True):
    """Softmax over rows of `cols` elements of flat x; one block per row, two passes over the row.

    Pass one keeps each thread's running maximum m and sum s of exp(x - m), a quad at a time (one
    rescale of s per quad), and the block combines the (m, s) pairs; pass two writes exp(x - M) / S. The
    second read of the row mostly hits L2. (Three passes loading one element per step were much slower:
    docs/benchmarks.md, "The cuda backend on the H200".)"""
    acc = acc_type(dtype)
    get, put = codec(dtype)
    threads = ROW_THREADS
    start = lowest(acc)
    ld, st = quads(vector)

    @cached_kernel(fastmath=True)
    def kernel(x, out, cols):
        base = cuda.blockIdx.x * cols
        tid = cuda.threadIdx.x
        count = cols // 4
        top = cuda.shared.array(ROW_THREADS, acc)
        sums = cuda.shared.array(ROW_THREADS, acc)
        m = start
        s = acc(0.0)
        for q in range(tid, count, threads):
            a, b, c, d = ld(x, base + 4 * q)
            a, b, c, d = get(a), get(b), get(c), get(d)
            chunk = max(max(a, b), max(c, d))
            if chunk > m:
                s = s * math.exp(m - chunk)
                m = chunk
            s += (math.exp(a - m) + math.exp(b - m)) + (math.exp(c - m) + math.exp(d - m))
        for j in range(4 * count + tid, cols, threads):
            v = get(x[base + j])
            if v > m:
                s = s * math.exp(m - v)
                m = v
            s += math.exp(v - m)
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
        for q in range(tid, count, threads):
            a, b, c, d = ld(x, base + 4 * q)
            st(out, base + 4 * q, put(math.exp(get(a) - m) * inv), put(math.exp(get(b) - m) * inv), put(math.exp(get(c) - m) * inv), put(math.exp(get(d) - m) * inv))
        for j in range(4 * count + tid, cols, threads):
            out[base + j] = put(math.exp(get(x[base + j]) - m) * inv)

    return kernel


@lru_cache(maxsize=None)
def rmsnorm(dtype: str, weighted: bool, vector: bool = True):
    """x / sqrt(mean(x^2) + eps) [* w] over rows of `cols` elements of flat x; one block per row. The sum
    of squares keeps two quads in flight per thread; the second read of the row mostly hits L2. Without
    `weighted`, w is a dummy the kernel never reads."""
    acc = acc_type(dtype)
    get, put = codec(dtype)
    threads = ROW_THREADS
    one = acc(1.0)
    ld, st = quads(vector)

    @cached_kernel(fastmath=True)
    def kernel(x, w, out, cols, eps):
        base = cuda.blockIdx.x * cols
        tid = cuda.threadIdx.x
        count = cols // 4
        shared = cuda.shared.array(ROW_THREADS, acc)
        total = acc(0.0)
        q = tid
        while q + threads < count:
            a, b, c, d = ld(x, base + 4 * q)
            e, f, g, h = ld(x, base + 4 * (q + threads))
            a, b, c, d, e, f, g, h = get(a), get(b), get(c), get(d), get(e), get(f), get(g), get(h)
            total += (a * a + b * b) + (c * c + d * d) + (e * e + f * f) + (g * g + h * h)
            q += 2 * threads
        if q < count:
            a, b, c, d = ld(x, base + 4 * q)
            a, b, c, d = get(a), get(b), get(c), get(d)
            total += (a * a + b * b) + (c * c + d * d)
        for j in range(4 * count + tid, cols, threads):
            a = get(x[base + j])
            total += a * a
        inv = one / math.sqrt(_block_sum(shared, tid, total, threads) / acc(cols) + acc(eps))
        for q in range(tid, count, threads):
            a, b, c, d = ld(x, base + 4 * q)
            if weighted:
                wa, wb, wc, wd = ld(w, 4 * q)
                st(out, base + 4 * q, put(get(a) * inv * get(wa)), put(get(b) * inv * get(wb)), put(get(c) * inv * get(wc)), put(get(d) * inv * get(wd)))
            else:
                st(out, base + 4 * q, put(get(a) * inv), put(get(b) * inv), put(get(c) * inv), put(get(d) * inv))
        for j in range(4 * count + tid, cols, threads):
            v = get(x[base + j]) * inv
            if weighted:
                v = v * get(w[j])
            out[base + j] = put(v)

    return kernel


@lru_cache(maxsize=None)
def attention_merge(out_dtype: str, has_prev: bool, final: bool, vector: bool = False, o_dtype: str = "float16"):
    """Fold one key block's attention (o [heads, tq, d], lse [heads, tq], for heads h0..h0+heads) into
    the packed partial `prev` [tq, H*d + H] (float32), writing `out`: the normalised output [tq, H*d]
    when `final`, else the new packed partial. One block per query row; its threads sweep the row's
    (head, quad) pairs, four consecutive elements of one head each, so a warp reads a head's 128 columns
    in one go and the next warp the next head. Each thread works out its head's two weights itself (two
    exponentials and a logarithm, far below the memory time). With `vector`, the quads are vector loads and
    stores (`vector.load4_3` and friends: every operand's last axis contiguous and its rows aligned to four
    elements, d a multiple of 4; `merge_vector_ok` checks); without, the same quads element by element.
    `out` must not alias `prev`: where a head spans several warps (d > 128), one warp writes the head's
    log-sum-exp while others still read prev's (the planner gives the two distinct tensors).
    (The block-per-row, warp-per-head kernel with one element per lane was about twice as slow, and a
    warp per (row, head) slower still: docs/benchmarks.md, "The cuda backend on the H200", from
    `bench_cuda.py merge`.)"""
    acc = acc_type("float32")
    get_o = codec(o_dtype)[0]
    put = codec(out_dtype)[1]
    if vector:
        ld3, ld2, st2 = V.load4_3, V.load4_2, V.store4_2
    else:
        ld3, ld2, st2 = V.element_load4_3, V.element_load4_2, V.element_store4_2

    @cached_kernel(fastmath=True)
    def kernel(o, lse, prev, out, h0, total_heads):
        t = cuda.blockIdx.x
        heads, d = o.shape[0], o.shape[2]
        width = total_heads * d
        per_head = (d + 3) // 4
        for item in range(cuda.threadIdx.x, heads * per_head, cuda.blockDim.x):
            h = item // per_head
            j = 4 * (item - h * per_head)
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
            if j + 4 <= d:
                o0, o1, o2, o3 = ld3(o, h, t, j)
                r0, r1, r2, r3 = get_o(o0) * wb, get_o(o1) * wb, get_o(o2) * wb, get_o(o3) * wb
                if has_prev:
                    p0, p1, p2, p3 = ld2(prev, t, base + j)
                    r0 += acc(p0) * wp
                    r1 += acc(p1) * wp
                    r2 += acc(p2) * wp
                    r3 += acc(p3) * wp
                st2(out, t, base + j, put(r0), put(r1), put(r2), put(r3))
            else:  # the tail of a head width that is not a multiple of 4 (never with `vector`)
                for c in range(j, d):
                    value = get_o(o[h, t, c]) * wb
                    if has_prev:
                        value += acc(prev[t, base + c]) * wp
                    out[t, base + c] = put(value)
            if not final and j == 0:
                out[t, width + h0 + h] = merged

    return kernel


def merge_vector_ok(d: int, *arrays) -> bool:
    """Whether `attention_merge(..., vector=True)` may run on these operands: (pointer, byte strides,
    itemsize) of o, prev and out (lse is read element-wise), d a multiple of 4."""
    return d % 4 == 0 and all(rows_aligned(pointer, strides, itemsize) for pointer, strides, itemsize in arrays)


def merge_grid(tq: int, heads: int, d: int) -> tuple[int, int]:
    """One block per query row: 8 warps on a GPU (one head each at a time), a few threads in the simulator."""
    return max(tq, 1), ROW_THREADS


@lru_cache(maxsize=None)
def attention_scores_softmax(dtype: str, causal: bool, windowed: bool = False):
    """In place over scores s [heads, tq, tk] (already scaled): masked softmax per row, writing the row's
    log-sum-exp to lse [heads, tq]. One block per (head, row).

    `windowed` (a sliding window, mistral): `launch(s, lse, offset, window)`, where offset is the key
    block's start minus the query block's; row t sees key j while t - (offset + j) < window, so the keys
    before `lo` are masked as the causal ones after the diagonal are. A row that sees no key of the
    block writes zeros and the lowest finite log-sum-exp, which the merge weighs to nothing (fastmath
    allows no infinities). Without `windowed` the two scalars are ignored."""
    acc = acc_type(dtype)
    get, put = codec(dtype)
    threads = ROW_THREADS
    floor = lowest(acc)

    @cached_kernel(fastmath=True)
    def kernel(s, lse, offset, window):
        tq, tk = s.shape[1], s.shape[2]
        h = cuda.blockIdx.x // tq
        t = cuda.blockIdx.x % tq
        tid = cuda.threadIdx.x
        limit = t + 1 if causal else tk
        lo = 0
        if windowed:
            lo = max(0, t - offset - window + 1)
            if lo >= limit:  # the window hides every key of this block from this row
                for j in range(tid, tk, threads):
                    s[h, t, j] = put(acc(0.0))
                if tid == 0:
                    lse[h, t] = floor
                return
        shared = cuda.shared.array(ROW_THREADS, acc)
        best = floor
        for j in range(lo + tid, limit, threads):
            v = get(s[h, t, j])
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
        for j in range(lo + tid, limit, threads):
            total += math.exp(get(s[h, t, j]) - top)
        total = _block_sum(shared, tid, total, threads)
        for j in range(tid, tk, threads):
            s[h, t, j] = put(math.exp(get(s[h, t, j]) - top) / total if lo <= j < limit else acc(0.0))
        if tid == 0:
            lse[h, t] = top + math.log(total)

    return kernel


DECODE_WARP = 4 if simulated() else 32
"""Threads of a warp in `decode_attention` (the simulator's stand-in warp is smaller, so its tests are fast)."""
DECODE_THREADS, DECODE_CHUNK = (8, 16) if simulated() else (256, 1024)
"""Threads per block of `decode_attention`, and the keys it scores per pass (their scores sit in shared memory)."""
DECODE_MAX_D = 256
"""The widest head `decode_attention` takes."""
DECODE_SLOTS = DECODE_MAX_D // DECODE_WARP
"""Output elements one thread of `decode_attention` accumulates (a lane's share of the widest head)."""
DECODE_WARPS = DECODE_THREADS // DECODE_WARP
"""Warps per block (a module constant: numba sizes shared arrays only from constants)."""


@device()
def _block_max(shared, tid, value, threads):
    """The maximum of `value` over the block's `threads` threads (a power of two), through `shared`."""
    shared[tid] = value
    cuda.syncthreads()
    width = threads // 2
    while width > 0:
        if tid < width and shared[tid + width] > shared[tid]:
            shared[tid] = shared[tid + width]
        cuda.syncthreads()
        width //= 2
    top = shared[0]
    cuda.syncthreads()
    return top


@device()
def _warp_sum_shuffle(shared, tid, lane, value):
    """The sum of `value` over the calling thread's warp, in every lane (butterfly shuffles; every lane calls)."""
    offset = DECODE_WARP // 2
    while offset > 0:
        value += cuda.shfl_xor_sync(0xFFFFFFFF, value, offset)
        offset //= 2
    return value


@device()
def _warp_sum_shared(shared, tid, lane, value):
    """The same through shared memory, for the simulator (no shuffles there); every thread of the block calls."""
    shared[tid] = value
    cuda.syncthreads()
    first = tid - lane
    total = shared[first]
    for x in range(1, DECODE_WARP):
        total += shared[first + x]
    cuda.syncthreads()
    return total


@lru_cache(maxsize=None)
def decode_attention(dtype: str, out_dtype: str, has_prev: bool, final: bool, own: bool, windowed: bool, vector: bool = False):
    """One key block of a batch's decode attention (the `decode_attention` kernel), in one launch: one
    block of DECODE_THREADS threads per (sequence, head), its warps sharing the work row by row so that
    every load is coalesced. The block loads its query row (scaled) into shared memory, then takes the
    sequence's visible keys in chunks of DECODE_CHUNK: each warp scores whole key rows (its lanes split
    the head width, a warp sum joins them), the block finds the chunk's maximum and the exponentials,
    and each warp accumulates the chunk's value rows it owns (lane l keeps the head elements l, l + warp,
    ... or, with `vector`, the quads 4l, 4l + 4 warp, ... read by one vector load each), rescaling the
    running sums online as flash attention does. The warps' sums are added in shared memory, merged
    with `prev` and written as the final output or the packed partial. `vector`: k and v may be read by
    quads (the head width a multiple of 4, rows aligned). No scratch, no library. k and v are
    [rows, B, width] (own: [1, B, width] views)."""
    acc = acc_type(dtype)
    get = codec(dtype)[0]
    put = codec(out_dtype)[1]
    threads, warp, chunk_max = DECODE_THREADS, DECODE_WARP, DECODE_CHUNK
    warps = threads // warp
    slots = DECODE_SLOTS
    step = 4 * warp if vector else warp
    minus_inf = -math.inf
    warp_sum = _warp_sum_shared if simulated() else _warp_sum_shuffle
    ld = V.load4_3 if vector else V.element_load4_3

    @cached_kernel()  # no fastmath: the running maximum starts at -inf
    def kernel(q, k, v, lengths, prev, out, heads, kv_heads, d, scale, start, window):
        b = cuda.blockIdx.x // heads
        h = cuda.blockIdx.x - b * heads
        base = (h // (heads // kv_heads)) * d
        tid = cuda.threadIdx.x
        lane = tid % warp
        w = tid // warp
        qs = cuda.shared.array(DECODE_MAX_D, acc)
        scores = cuda.shared.array(DECODE_CHUNK, acc)
        shared = cuda.shared.array(DECODE_THREADS, acc)
        parts = cuda.shared.array((DECODE_WARPS, DECODE_MAX_D), acc)
        for i in range(tid, d, threads):
            qs[i] = get(q[b, h * d + i]) * acc(scale)
        cuda.syncthreads()
        length = int(lengths[b])
        lo, hi = 0, 1
        if not own:
            hi = min(k.shape[0], max(0, length - start))
            lo = 0
            if windowed:
                lo = min(hi, max(0, length - window + 1 - start))
        sums = cuda.local.array(DECODE_SLOTS, acc)
        for t in range(slots):
            sums[t] = acc(0.0)
        top = acc(minus_inf)
        total = acc(0.0)
        c0 = lo
        while c0 < hi:
            n = min(chunk_max, hi - c0)
            local_top = acc(minus_inf)
            for j0 in range(0, n, warps):  # the same trip count in every warp: the simulator's warp sum has barriers
                j = j0 + w
                partial = acc(0.0)
                if j < n:
                    if vector:
                        for i in range(4 * lane, d, step):
                            x0, x1, x2, x3 = ld(k, c0 + j, b, base + i)
                            partial += qs[i] * get(x0) + qs[i + 1] * get(x1) + qs[i + 2] * get(x2) + qs[i + 3] * get(x3)
                    else:
                        for i in range(lane, d, step):
                            partial += qs[i] * get(k[c0 + j, b, base + i])
                s = warp_sum(shared, tid, lane, partial)
                if j < n and lane == 0:
                    scores[j] = s
                    if s > local_top:
                        local_top = s
            chunk_top = _block_max(shared, tid, local_top, threads)  # its barriers publish the scores
            new_top = max(top, chunk_top)
            part = acc(0.0)
            for j in range(tid, n, threads):
                p = math.exp(scores[j] - new_top)
                scores[j] = p
                part += p
            part = _block_sum(shared, tid, part, threads)  # its barriers publish the exponentials
            rescale = math.exp(top - new_top) if total > 0 else acc(0.0)
            total = total * rescale + part
            for t in range(slots):
                sums[t] = sums[t] * rescale
            for j in range(w, n, warps):
                p = scores[j]
                if vector:
                    for t in range(slots // 4):
                        i = 4 * lane + t * step
                        if i < d:
                            x0, x1, x2, x3 = ld(v, c0 + j, b, base + i)
                            sums[4 * t] += p * get(x0)
                            sums[4 * t + 1] += p * get(x1)
                            sums[4 * t + 2] += p * get(x2)
                            sums[4 * t + 3] += p * get(x3)
                else:
                    for t in range(slots):
                        i = lane + t * step
                        if i < d:
                            sums[t] += p * get(v[c0 + j, b, base + i])
            top = new_top
            cuda.syncthreads()  # every warp is done with this chunk's scores
            c0 += n
        # the warps' sums, added in shared memory
        if vector:
            for t in range(slots // 4):
                i = 4 * lane + t * step
                if i < d:
                    for c in range(4):
                        parts[w, i + c] = sums[4 * t + c]
        else:
            for t in range(slots):
                i = lane + t * step
                if i < d:
                    parts[w, i] = sums[t]
        cuda.syncthreads()
        lse = top + math.log(total) if total > 0 else acc(minus_inf)
        inv = acc(1.0) / total if total > 0 else acc(0.0)
        wp = acc(0.0)
        wb = acc(1.0)
        merged = lse
        width = heads * d
        if has_prev:
            lp = acc(prev[b, width + h])
            both = max(lp, lse)
            if both == minus_inf:
                wb = acc(0.0)
            else:
                wp = math.exp(lp - both)
                wb = math.exp(lse - both)
                merged = both + math.log(wp + wb)
                scale_both = acc(1.0) / (wp + wb)
                wp = wp * scale_both
                wb = wb * scale_both
        for i in range(tid, d, threads):
            a = acc(0.0)
            for x in range(warps):
                a += parts[x, i]
            value = a * inv * wb
            if has_prev:
                value += acc(prev[b, h * d + i]) * wp
            out[b, h * d + i] = put(value)
        if not final and tid == 0:
            out[b, width + h] = merged

    return kernel

"""numba-cuda kernels of training (docs/training.md): cast, the backward of rmsnorm and swiglu, attention_unpack,
the blocked cross-entropy (xent, xent_loss, xent_grad), and the two numba steps of attention's backward
(attention_grad.py): the scores' gradient and the finish into the arena.

The conventions are kernels_numba.py's: a kernel reads its operands in their own dtype through `codec`,
computes in float32 (float64 for float64 tensors and partials) and rounds once when it stores; factories
build one kernel per dtype and flag; elementwise kernels run a grid-stride loop over quads, row kernels one
block per row with a shared-memory reduction, both reading and writing four elements per vector instruction
where every operand allows (`quads`). The cross-entropy's statistics and partial gradients are float32
(float64 for float64 logits), as the kernel table says.

Attention's backward on the cublas path (attention_grad.py) recomputes S = scale Q K^T and dP = dO V^T by
cuBLAS into float32 scratch; `attention_grad_scores` turns them into P = exp(S - LSE) and dS = P (dP - D),
D = rowsum(dO * O) read from the packed partial, masked as the forward's block was, in the operands' dtype
for the next GEMMs. `attention_grad_finish` adds a block's float32 gradients (and, for grouped heads, the
query heads of a kv head) to the chain's partial and writes the arena's result.
"""

from __future__ import annotations

import math
from functools import lru_cache

from runtime.backends.cuda import vector as V
from runtime.backends.cuda.compat import cached_kernel, cuda, device
from runtime.backends.cuda.kernels_numba import (
    ROW_THREADS,
    _block_sum,
    _types,
    acc_type,
    codec,
    lowest,
    quads,
)

HALF = ("float16", "bfloat16")


def work_type(*dtypes: str):
    """The accumulator type of a kernel over these dtypes: float64 when one of them is, else float32."""
    return acc_type("float64" if "float64" in dtypes else "float32")


@lru_cache(maxsize=None)
def writer(dtype: str):
    """`put` for a `dtype` tensor that takes a float64 value too: halves are narrowed through float32 first
    (float16 and bfloat16 conversions are defined from float32)."""
    put = codec(dtype)[1]
    if dtype not in HALF:
        return put
    single = _types().float32

    @device()
    def narrowed(value):
        return put(single(value))

    return narrowed


@lru_cache(maxsize=None)
def cast(source: str, target: str, vector: bool = True):
    """out[i] = x[i] converted from `source` to `target` over flat arrays (grid-stride loop over quads)."""
    get = codec(source)[0]
    put = writer(target)
    ld, st = quads(vector)

    @cached_kernel()
    def kernel(x, out):
        n = out.size
        q, step = cuda.grid(1), cuda.gridsize(1)
        count = n // 4
        while q < count:
            a, b, c, d = ld(x, 4 * q)
            st(out, 4 * q, put(get(a)), put(get(b)), put(get(c)), put(get(d)))
            q += step
        i = 4 * count + cuda.grid(1)
        if i < n:
            out[i] = put(get(x[i]))

    return kernel


@lru_cache(maxsize=None)
def swiglu_grad(dtype: str, vector: bool = True):
    """out[i] = dy * up * s (1 + gate (1 - s)), s = sigmoid(gate): the gradient of silu(gate) * up wrt gate."""
    acc = acc_type(dtype)
    get, put = codec(dtype)
    one = acc(1.0)
    ld, st = quads(vector)

    @device(fastmath=True)
    def op(g, u, dy):
        s = one / (one + math.exp(-g))
        return dy * u * s * (one + g * (one - s))

    @cached_kernel(fastmath=True)
    def kernel(gate, up, dy, out):
        n = out.size
        q, step = cuda.grid(1), cuda.gridsize(1)
        count = n // 4
        while q < count:
            g0, g1, g2, g3 = ld(gate, 4 * q)
            u0, u1, u2, u3 = ld(up, 4 * q)
            d0, d1, d2, d3 = ld(dy, 4 * q)
            st(out, 4 * q, put(op(get(g0), get(u0), get(d0))), put(op(get(g1), get(u1), get(d1))),
               put(op(get(g2), get(u2), get(d2))), put(op(get(g3), get(u3), get(d3))))
            q += step
        i = 4 * count + cuda.grid(1)
        if i < n:
            out[i] = put(op(get(gate[i]), get(up[i]), get(dy[i])))

    return kernel


@lru_cache(maxsize=None)
def rmsnorm_grad(dtype: str, weighted: bool, vector: bool = True):
    """dx = r g - x r^3 mean(g x) over rows of `cols` elements of flat x and dy, g = dy [* w],
    r = 1 / sqrt(mean(x^2) + eps); one block per row, two sums over the row, then a second read of it
    (mostly from L2). Without `weighted`, w is a dummy the kernel never reads."""
    acc = acc_type(dtype)
    get, put = codec(dtype)
    threads = ROW_THREADS
    one = acc(1.0)
    ld, st = quads(vector)

    @cached_kernel(fastmath=True)
    def kernel(x, w, dy, out, cols, eps):
        base = cuda.blockIdx.x * cols
        tid = cuda.threadIdx.x
        count = cols // 4
        shared = cuda.shared.array(ROW_THREADS, acc)
        squares = acc(0.0)
        along = acc(0.0)
        for q in range(tid, count, threads):
            a, b, c, d = ld(x, base + 4 * q)
            e, f, g, h = ld(dy, base + 4 * q)
            a, b, c, d, e, f, g, h = get(a), get(b), get(c), get(d), get(e), get(f), get(g), get(h)
            if weighted:
                wa, wb, wc, wd = ld(w, 4 * q)
                e, f, g, h = e * get(wa), f * get(wb), g * get(wc), h * get(wd)
            squares += (a * a + b * b) + (c * c + d * d)
            along += (a * e + b * f) + (c * g + d * h)
        for j in range(4 * count + tid, cols, threads):
            a = get(x[base + j])
            e = get(dy[base + j])
            if weighted:
                e = e * get(w[j])
            squares += a * a
            along += a * e
        inv = one / math.sqrt(_block_sum(shared, tid, squares, threads) / acc(cols) + acc(eps))
        mean = _block_sum(shared, tid, along, threads) / acc(cols)
        k = inv * inv * inv * mean
        for q in range(tid, count, threads):
            a, b, c, d = ld(x, base + 4 * q)
            e, f, g, h = ld(dy, base + 4 * q)
            a, b, c, d, e, f, g, h = get(a), get(b), get(c), get(d), get(e), get(f), get(g), get(h)
            if weighted:
                wa, wb, wc, wd = ld(w, 4 * q)
                e, f, g, h = e * get(wa), f * get(wb), g * get(wc), h * get(wd)
            st(out, base + 4 * q, put(inv * e - a * k), put(inv * f - b * k), put(inv * g - c * k), put(inv * h - d * k))
        for j in range(4 * count + tid, cols, threads):
            e = get(dy[base + j])
            if weighted:
                e = e * get(w[j])
            out[base + j] = put(inv * e - get(x[base + j]) * k)

    return kernel


@lru_cache(maxsize=None)
def attention_unpack(dtype: str, vector: bool = True):
    """out[t, c] = packed[t, c] for c < width, in `dtype`: the normalised output of a packed partial
    [t, width + heads] (flat arrays; `stride` = width + heads). By quads where width and stride are
    multiples of 4 (a quad never crosses a row of either)."""
    put = codec(dtype)[1]
    acc = acc_type("float32")
    ld, st = quads(vector)

    @cached_kernel()
    def kernel(packed, out, width, stride):
        n = out.size
        q, step = cuda.grid(1), cuda.gridsize(1)
        if vector:
            while q < n // 4:
                t = (4 * q) // width
                a, b, c, d = ld(packed, t * stride + 4 * q - t * width)
                st(out, 4 * q, put(acc(a)), put(acc(b)), put(acc(c)), put(acc(d)))
                q += step
            return
        for i in range(q, n, step):
            t = i // width
            out[i] = put(acc(packed[t * stride + i - t * width]))

    return kernel


@lru_cache(maxsize=None)
def xent(dtype: str, work: str, has_prev: bool, vector: bool = True):
    """One vocabulary block of the cross-entropy (the `xent` kernel): per row of `cols` logits the running
    max m, sum of exp(logit - m) s and the label's logit z (labels float32, its column `start` on), merged
    with prev's (m, s, z) and written [t, 3] in `work` (flat arrays). One block per row; each thread keeps
    its own (m, s) a quad at a time, as softmax's first pass does, and the block merges them."""
    acc = acc_type(work)
    get = codec(dtype)[0]
    threads = ROW_THREADS
    start_value = lowest(acc)
    ld = quads(vector)[0]

    @cached_kernel(fastmath=True)
    def kernel(logits, labels, prev, out, cols, start):
        row = cuda.blockIdx.x
        base = row * cols
        tid = cuda.threadIdx.x
        count = cols // 4
        top = cuda.shared.array(ROW_THREADS, acc)
        sums = cuda.shared.array(ROW_THREADS, acc)
        m = start_value
        s = acc(0.0)
        for q in range(tid, count, threads):
            a, b, c, d = ld(logits, base + 4 * q)
            a, b, c, d = acc(get(a)), acc(get(b)), acc(get(c)), acc(get(d))
            chunk = max(max(a, b), max(c, d))
            if chunk > m:
                s = s * math.exp(m - chunk)
                m = chunk
            s += (math.exp(a - m) + math.exp(b - m)) + (math.exp(c - m) + math.exp(d - m))
        for j in range(4 * count + tid, cols, threads):
            v = acc(get(logits[base + j]))
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
        if tid == 0:
            m, s = top[0], sums[0]
            local = int(labels[row]) - start
            z = acc(get(logits[base + local])) if 0 <= local < cols else acc(0.0)
            if has_prev:
                m0, s0 = acc(prev[3 * row]), acc(prev[3 * row + 1])
                both = max(m0, m)
                s = s0 * math.exp(m0 - both) + s * math.exp(m - both)
                m = both
                z += acc(prev[3 * row + 2])
            out[3 * row] = m
            out[3 * row + 1] = s
            out[3 * row + 2] = z

    return kernel


@lru_cache(maxsize=None)
def xent_loss(work: str):
    """(sum over the rows whose label is not ignored of m + log(s) - z, their count) [2] from xent's
    statistics [t, 3] (flat); one block, float64 sums."""
    acc = acc_type("float64")
    threads = ROW_THREADS

    @cached_kernel()
    def kernel(stats, labels, out):
        tid = cuda.threadIdx.x
        shared = cuda.shared.array(ROW_THREADS, acc)
        loss = acc(0.0)
        count = acc(0.0)
        for t in range(tid, labels.size, threads):
            if labels[t] >= 0:
                loss += acc(stats[3 * t]) + math.log(acc(stats[3 * t + 1])) - acc(stats[3 * t + 2])
                count += acc(1.0)
        loss = _block_sum(shared, tid, loss, threads)
        count = _block_sum(shared, tid, count, threads)
        if tid == 0:
            out[0] = loss
            out[1] = count

    return kernel


@lru_cache(maxsize=None)
def xent_grad(dtype: str, work: str, has_scale: bool, vector: bool = True):
    """factor * scale / count * (softmax - onehot) of one vocabulary block (the `xent_grad` kernel) over rows
    of `cols` logits (flat arrays): softmax = exp(logit - m - log s) from the row's statistics, the onehot at
    the label's column (columns `start` on); rows whose label is ignored (< 0) get zeros. One block per row.
    Without `has_scale`, scale is a dummy the kernel never reads."""
    acc = acc_type(work)
    get = codec(dtype)[0]
    put = writer(dtype)
    threads = ROW_THREADS
    ld, st = quads(vector)
    one = acc(1.0)

    @cached_kernel(fastmath=True)
    def kernel(logits, labels, stats, total, scale, out, cols, start, factor):
        row = cuda.blockIdx.x
        base = row * cols
        tid = cuda.threadIdx.x
        count = cols // 4
        label = labels[row]
        weight = acc(0.0)
        if label >= 0:
            weight = acc(factor) / max(acc(total[1]), one)
            if has_scale:
                weight = weight * acc(scale[0])
        lse = acc(stats[3 * row]) + math.log(acc(stats[3 * row + 1]))
        local = int(label) - start
        for q in range(tid, count, threads):
            j = 4 * q
            a, b, c, d = ld(logits, base + j)
            pa = math.exp(acc(get(a)) - lse) - (one if j == local else acc(0.0))
            pb = math.exp(acc(get(b)) - lse) - (one if j + 1 == local else acc(0.0))
            pc = math.exp(acc(get(c)) - lse) - (one if j + 2 == local else acc(0.0))
            pd = math.exp(acc(get(d)) - lse) - (one if j + 3 == local else acc(0.0))
            st(out, base + j, put(pa * weight), put(pb * weight), put(pc * weight), put(pd * weight))
        for j in range(4 * count + tid, cols, threads):
            p = math.exp(acc(get(logits[base + j])) - lse) - (one if j == local else acc(0.0))
            out[base + j] = put(p * weight)

    return kernel


def row_vector_ok(vector_loads: bool, cols: int, aligned: bool) -> bool:
    """Whether a row kernel may take quads: vector loads allowed, rows of a multiple of 4, operands aligned."""
    return vector_loads and cols % 4 == 0 and aligned


@lru_cache(maxsize=None)
def attention_grad_scores(dtype: str, work: str, causal: bool, windowed: bool, need_p: bool):
    """In place over one chunk of recomputed scores: s and dp [c, rows, tk] (`work`, already scaled; a
    [c, rows, tk] view each) become p = exp(s - lse) and ds = p (dp - D) in `dtype` (p_out, ds_out: views
    over the same memory when `dtype` is `work`, each element read before it is written by the same thread),
    where lse and D = rowsum(dO * O) come from the packed partial [tq, H*d + H] and d_out [tq, H*d] at row
    `row0 + t` and head `h0 + i * h_step`. Masked as the forward's block was: causal keys after the row,
    and (`windowed`) keys with row - (offset + j) >= window, give p = ds = 0; so does a row whose lse is
    -inf (it saw no key at all). Without `need_p`, p_out is not written. One block per (head, row); no
    fastmath, so that -inf compares as it should."""
    acc = acc_type(work)
    get = codec(dtype)[0]
    put = writer(dtype)
    threads = ROW_THREADS
    minus_inf = -math.inf

    @cached_kernel()
    def kernel(s, dp, p_out, ds_out, packed, d_out, h0, h_step, d, heads, row0, offset, window):
        rows, tk = s.shape[1], s.shape[2]
        i = cuda.blockIdx.x // rows
        t = cuda.blockIdx.x - i * rows
        row = row0 + t
        h = h0 + i * h_step
        tid = cuda.threadIdx.x
        shared = cuda.shared.array(ROW_THREADS, acc)
        part = acc(0.0)
        for x in range(tid, d, threads):
            part += acc(get(d_out[row, h * d + x])) * acc(packed[row, h * d + x])
        delta = _block_sum(shared, tid, part, threads)
        lse = acc(packed[row, heads * d + h])
        limit = tk
        if causal:
            limit = min(tk, row + 1)
        lo = 0
        if windowed:
            lo = max(0, row - offset - window + 1)
        if not lse > minus_inf:
            limit = 0
        for j in range(tid, tk, threads):
            p = acc(0.0)
            ds = acc(0.0)
            if lo <= j < limit:
                p = math.exp(s[i, t, j] - lse)
                ds = p * (dp[i, t, j] - delta)
            if need_p:
                p_out[i, t, j] = put(p)
            ds_out[i, t, j] = put(ds)

    return kernel


@lru_cache(maxsize=None)
def attention_grad_finish(source: str, target: str, has_prev: bool, vector: bool = False):
    """out[t, col0 + i*col_step + j] = prev[same] + sum over r < group of src[i*group + r, t, j], for i < count
    and j < d: a block's gradients (src [count*group, rows, d], any strides: torch's or the scratch's) added
    to the chain's partial and written in `target`. One block per row; its threads sweep the row's (head,
    quad) pairs as attention_merge does. `vector`: quads by vector instructions (d a multiple of 4, every
    operand's rows aligned to four elements); else the same quads element by element. Without `has_prev`,
    prev is a dummy the kernel never reads."""
    acc = acc_type("float64" if "float64" in (source, target) else "float32")
    get = codec(source)[0]
    put = writer(target)
    if vector:
        ld3, ld2, st2 = V.load4_3, V.load4_2, V.store4_2
    else:
        ld3, ld2, st2 = V.element_load4_3, V.element_load4_2, V.element_store4_2

    @cached_kernel(fastmath=True)
    def kernel(src, prev, out, count, group, col0, col_step):
        t = cuda.blockIdx.x
        d = src.shape[2]
        per_head = (d + 3) // 4
        for item in range(cuda.threadIdx.x, count * per_head, cuda.blockDim.x):
            i = item // per_head
            j = 4 * (item - i * per_head)
            col = col0 + i * col_step + j
            if j + 4 <= d:
                r0, r1, r2, r3 = acc(0.0), acc(0.0), acc(0.0), acc(0.0)
                for r in range(group):
                    a, b, c, e = ld3(src, i * group + r, t, j)
                    r0 += acc(get(a))
                    r1 += acc(get(b))
                    r2 += acc(get(c))
                    r3 += acc(get(e))
                if has_prev:
                    p0, p1, p2, p3 = ld2(prev, t, col)
                    r0 += acc(p0)
                    r1 += acc(p1)
                    r2 += acc(p2)
                    r3 += acc(p3)
                st2(out, t, col, put(r0), put(r1), put(r2), put(r3))
            else:  # the tail of a head width that is not a multiple of 4 (never with `vector`)
                for c in range(j, d):
                    value = acc(0.0)
                    for r in range(group):
                        value += acc(get(src[i * group + r, t, c]))
                    if has_prev:
                        value += acc(prev[t, col0 + i * col_step + c])
                    out[t, col0 + i * col_step + c] = put(value)

    return kernel

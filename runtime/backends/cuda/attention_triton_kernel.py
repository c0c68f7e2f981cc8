"""The Triton kernel of the `triton` attention provider (runtime/backends/cuda/attention_triton.py has the
design). A module of its own because it imports triton at the top: Triton's interpreter patches `tl` in
the kernel's module globals, and triton is optional, so only the provider imports this, on first use."""

import triton
import triton.language as tl


@triton.jit
def _sweep(acc, l_i, m_i, q, K, V, rows, start, stop, tk, k_stride, v_stride, g, scale_log2,
           D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr):
    """Keys start..stop in tiles of BLOCK_N, folded into the running (acc, l_i, m_i) in base 2. The masks
    are compile-time: tiles wholly below the diagonal and in range take none."""
    cols = tl.arange(0, D)
    keys = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        n = start_n + keys
        if KEY_MASK:
            k = tl.load(K + n[:, None] * k_stride + g * D + cols[None, :], mask=(n < tk)[:, None], other=0.0)
            v = tl.load(V + n[:, None] * v_stride + g * D + cols[None, :], mask=(n < tk)[:, None], other=0.0)
        else:
            k = tl.load(K + n[:, None] * k_stride + g * D + cols[None, :])
            v = tl.load(V + n[:, None] * v_stride + g * D + cols[None, :])
        s = tl.dot(q, tl.trans(k)) * scale_log2
        if CAUSAL_MASK or KEY_MASK:
            allowed = n[None, :] < tk
            if CAUSAL_MASK:
                allowed = allowed & (n[None, :] <= rows[:, None])
            s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_block(Q, K, V, PREV, OUT, scale_log2, tq, tk, q_stride, k_stride, v_stride, prev_stride, out_stride, H, GROUP,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_PREV: tl.constexpr,
                    FINAL: tl.constexpr, EVEN_N: tl.constexpr):
    start_m = tl.program_id(0)
    if CAUSAL:  # the longest rows first, so the short ones fill the tail
        start_m = tl.num_programs(0) - 1 - start_m
    h = tl.program_id(1)
    g = h // GROUP
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    row_ok = rows < tq
    q = tl.load(Q + rows[:, None] * q_stride + h * D + cols[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:  # tq == tk; BLOCK_M is a multiple of BLOCK_N, so the diagonal starts on a tile
        below = start_m * BLOCK_M
        acc, l_i, m_i = _sweep(acc, l_i, m_i, q, K, V, rows, 0, below, tk, k_stride, v_stride, g, scale_log2, D, BLOCK_N, False, False)
        acc, l_i, m_i = _sweep(acc, l_i, m_i, q, K, V, rows, below, tl.minimum(tk, below + BLOCK_M), tk, k_stride, v_stride, g,
                               scale_log2, D, BLOCK_N, True, not EVEN_N)
    else:
        acc, l_i, m_i = _sweep(acc, l_i, m_i, q, K, V, rows, 0, tk, tk, k_stride, v_stride, g, scale_log2, D, BLOCK_N, False, not EVEN_N)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) / 1.4426950408889634  # natural log, as the packed partial keeps it
    if HAS_PREV:
        lp = tl.load(PREV + rows * prev_stride + H * D + h, mask=row_ok, other=0.0)
        po = tl.load(PREV + rows[:, None] * prev_stride + h * D + cols[None, :], mask=row_ok[:, None], other=0.0)
        top = tl.maximum(lp, lse)
        wp = tl.exp(lp - top)
        wb = tl.exp(lse - top)
        total = wp + wb
        o = (po * wp[:, None] + o * wb[:, None]) / total[:, None]
        lse = top + tl.log(total)
    tl.store(OUT + rows[:, None] * out_stride + h * D + cols[None, :], o.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    if not FINAL:
        tl.store(OUT + rows * out_stride + H * D + h, lse, mask=row_ok)

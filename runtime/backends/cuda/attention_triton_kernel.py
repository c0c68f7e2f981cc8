"""The Triton kernel of the `triton` attention provider (runtime/backends/cuda/attention_triton.py has the
design). A module of its own because it imports triton at the top: Triton's interpreter patches `tl` in
the kernel's module globals, and triton is optional, so only the provider imports this, on first use."""

import triton
import triton.language as tl


@triton.jit
def attention_block(Q, K, V, PREV, OUT, scale_log2, tq, tk, q_stride, k_stride, v_stride, prev_stride, out_stride, H, GROUP,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_PREV: tl.constexpr,
                    FINAL: tl.constexpr):
    start_m = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    keys = tl.arange(0, BLOCK_N)
    row_ok = rows < tq
    q = tl.load(Q + rows[:, None] * q_stride + h * D + cols[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi = tk
    if CAUSAL:
        hi = tl.minimum(tk, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        n = start_n + keys
        key_ok = n < tk
        k = tl.load(K + n[None, :] * k_stride + g * D + cols[:, None], mask=key_ok[None, :], other=0.0)
        s = tl.dot(q, k) * scale_log2
        allowed = key_ok[None, :]
        if CAUSAL:
            allowed = allowed & (n[None, :] <= rows[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + n[:, None] * v_stride + g * D + cols[None, :], mask=key_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
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

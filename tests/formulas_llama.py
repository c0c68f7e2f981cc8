"""Float64 references for the LLaMA kernels (rope, swiglu, attention), written from their formulas.

Independent of runtime/kernels_numpy.py on purpose: attention here is the full softmax of q k^T over the
whole key sequence with an explicit causal mask, head by head, the Hugging Face way (repeat_kv, then
one plain softmax); no blocks, no log-sum-exp, no packed partial. Activations are [tokens, features]
with heads side by side in the feature dimension.
"""

from __future__ import annotations

import numpy as np


def rotate_half(y: np.ndarray) -> np.ndarray:
    """Hugging Face's rotate_half: concat(-y[..., D/2:], y[..., :D/2])."""
    half = y.shape[-1] // 2
    return np.concatenate([-y[..., half:], y[..., :half]], axis=-1)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Each head h (columns [h*D, (h+1)*D) of x) becomes x_h * cos + rotate_half(x_h) * sin."""
    x, cos, sin = (np.asarray(a, dtype=np.float64) for a in (x, cos, sin))
    width = cos.shape[1]
    heads = [x[:, h * width : (h + 1) * width] for h in range(x.shape[1] // width)]
    return np.concatenate([xh * cos + rotate_half(xh) * sin for xh in heads], axis=1)


def rope_tables(tokens: int, width: int, theta: float = 10000.0, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """LLaMA's cos and sin tables [tokens, D] for positions start, start+1, ...: angle = pos / theta^(2i/D)."""
    inverse = 1.0 / theta ** (np.arange(0, width, 2, dtype=np.float64) / width)
    angles = np.outer(np.arange(start, start + tokens, dtype=np.float64), inverse)
    both = np.concatenate([angles, angles], axis=1)
    return np.cos(both), np.sin(both)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, silu(g) = g * sigmoid(g)."""
    gate, up = np.asarray(gate, dtype=np.float64), np.asarray(up, dtype=np.float64)
    return gate / (1.0 + np.exp(-gate)) * up


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    heads: int,
    kv_heads: int,
    causal: bool = True,
    scale: float | None = None,
    offset: int = 0,
) -> np.ndarray:
    """softmax(q_h k_g^T * scale + mask) v_g per query head h, g = h // (heads / kv_heads).

    With `causal`, query i (at position offset + i) sees key j iff j <= offset + i; the keys are the
    whole sequence so far, not a block.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    width = q.shape[1] // heads
    scale = 1.0 / np.sqrt(width) if scale is None else scale
    group = heads // kv_heads
    k_rep = np.repeat(k.reshape(k.shape[0], kv_heads, width), group, axis=1)  # repeat_kv
    v_rep = np.repeat(v.reshape(v.shape[0], kv_heads, width), group, axis=1)
    out = np.empty_like(q)
    for h in range(heads):
        scores = q[:, h * width : (h + 1) * width] @ k_rep[:, h, :].T * scale
        if causal:
            rows = np.arange(q.shape[0])[:, None] + offset
            scores = np.where(np.arange(k.shape[0])[None, :] <= rows, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out[:, h * width : (h + 1) * width] = weights @ v_rep[:, h, :]
    return out

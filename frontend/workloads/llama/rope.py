"""RoPE tables on the host: cos and sin [T, head_dim] per position, as transformers' LlamaRotaryEmbedding.

The inverse frequencies follow transformers' `ROPE_INIT_FUNCTIONS` for `default`, `linear`, `dynamic`
(NTK-scaled once the prompt is longer than `max_position_embeddings`) and `llama3`; every type here
has an attention scaling of 1. transformers computes them in float32; we compute in float64 and cast
the tables to the model dtype once, which differs from it by float32 rounding of position x frequency
(about 1e-7 relative, so ~1e-2 radians at position 128k against transformers' own float32 result).
"""

from __future__ import annotations

import math

import numpy as np

from frontend.workloads.llama.config import LlamaConfig


def inverse_frequencies(config: LlamaConfig, tokens: int) -> np.ndarray:
    """The [head_dim / 2] inverse frequencies for a prompt of `tokens` positions, in float64."""
    rope, dim = config.rope, config.head_dim
    base = rope.theta
    if rope.type == "dynamic" and tokens > config.max_position_embeddings:
        grown = rope.factor * tokens / config.max_position_embeddings - (rope.factor - 1)
        base = base * grown ** (dim / (dim - 2))
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if rope.type == "linear":
        inv = inv / rope.factor
    if rope.type == "llama3":
        inv = _llama3(inv, rope.factor, rope.low_freq_factor, rope.high_freq_factor, rope.original_max_position_embeddings)
    return inv


def _llama3(inv: np.ndarray, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """Long wavelengths divided by `factor`, short ones kept, a smooth blend between (Llama 3.1)."""
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, blended, scaled)


def rope_tables(config: LlamaConfig, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [tokens, head_dim] in float64: angle = position * inverse frequency, halves repeated."""
    angles = np.outer(np.arange(tokens, dtype=np.float64), inverse_frequencies(config, tokens))
    cos, sin = np.cos(angles), np.sin(angles)  # each half once: the halves repeat
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)


def packed_rope_tables(config: LlamaConfig, lengths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin for sequences packed end to end: each one's own `rope_tables` (positions from 0, and
    `dynamic` scaling by its own length), stacked."""
    if len(lengths) == 1:
        return rope_tables(config, lengths[0])
    made = {length: rope_tables(config, length) for length in set(lengths)}  # 16 prompts of one length: one table
    return np.concatenate([made[length][0] for length in lengths]), np.concatenate([made[length][1] for length in lengths])

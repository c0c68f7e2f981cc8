"""A float64 numpy LLaMA prefill, written from Hugging Face's `LlamaModel` (and `Qwen2Model`'s q/k/v
biases, `MistralModel`'s sliding window) and nothing else here.

Whole tensors, no blocks: heads as a [heads, T, D] array, repeat_kv for grouped-query attention,
a T x T score matrix with a causal (and sliding-window) mask and one softmax, then o_proj, SwiGLU and the final RMSNorm.
Only the RoPE frequencies are shared with the graph (they are the model's definition, from the config).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.rope import rope_tables


def float64_forward(config: LlamaConfig, weights: Mapping[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """`LlamaModel(input_ids=ids[None]).last_hidden_state[0]` in float64, [T, hidden]."""
    w = lambda name: np.asarray(weights[name], dtype=np.float64)  # noqa: E731
    x = w("model.embed_tokens.weight")[np.asarray(ids)]
    cos, sin = rope_tables(config, len(ids))
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        h = _rmsnorm(x, w(p + "input_layernorm.weight"), config.rms_norm_eps)
        biases = [w(p + f"self_attn.{n}_proj.bias") if config.qkv_bias else 0.0 for n in "qkv"]
        x = x + _attention(config, h, cos, sin, *(w(p + f"self_attn.{n}_proj.weight") for n in "qkvo"), biases)
        h = _rmsnorm(x, w(p + "post_attention_layernorm.weight"), config.rms_norm_eps)
        gate, up = h @ w(p + "mlp.gate_proj.weight").T, h @ w(p + "mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w(p + "mlp.down_proj.weight").T
    return _rmsnorm(x, w("model.norm.weight"), config.rms_norm_eps)


def _rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _attention(config: LlamaConfig, h, cos, sin, wq, wk, wv, wo, biases) -> np.ndarray:
    tokens, d = h.shape[0], config.head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    bq, bk, bv = biases
    q = (h @ wq.T + bq).reshape(tokens, heads, d).transpose(1, 0, 2)  # [heads, T, D]
    k = (h @ wk.T + bk).reshape(tokens, kv_heads, d).transpose(1, 0, 2)
    v = (h @ wv.T + bv).reshape(tokens, kv_heads, d).transpose(1, 0, 2)
    q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))
    k, v = (np.repeat(t, heads // kv_heads, axis=0) for t in (k, v))  # repeat_kv
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    seen = np.tril(np.ones((tokens, tokens), dtype=bool))
    if config.sliding_window is not None:  # MistralModel: key position > query position - sliding_window
        seen &= ~np.tril(seen, -config.sliding_window)
    scores = np.where(seen, scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out = (scores / scores.sum(axis=-1, keepdims=True)) @ v  # [heads, T, D]
    return out.transpose(1, 0, 2).reshape(tokens, heads * d) @ wo.T


def _rotate_half(t: np.ndarray) -> np.ndarray:
    half = t.shape[-1] // 2
    return np.concatenate([-t[..., half:], t[..., :half]], axis=-1)

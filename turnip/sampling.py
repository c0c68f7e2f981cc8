"""The next token from a row of logits, on the host in float64: greedy, or sampled with temperature and top-p.

Greedy is argmax with the first index on ties (as `torch.argmax`). Sampling divides the logits by the
temperature, takes the softmax, keeps the most likely tokens whose probabilities sum to at least `top_p`
(at least one; transformers' top-p rule), renormalises and draws one with the caller's
`numpy.random.Generator`, so a seed reproduces the tokens. Temperature 0 means greedy.
"""

from __future__ import annotations

import numpy as np

from turnip_ir.errors import InputError


def check_sampling(temperature: float, top_p: float) -> None:
    if not np.isfinite(temperature) or temperature < 0:
        raise InputError(f"temperature must be a number >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {top_p!r}")


def next_tokens(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of `logits` [B, vocab], as int64 [B]. Greedy takes the argmax of float32 or
    float64 logits as they are, and of others (float16, bfloat16) widened to float64 first: every value
    is exact there, so ties go to the lowest id alike, and numpy's argmax over float16 itself is 4x
    slower than widening (no vector loop for half floats)."""
    logits = np.asarray(logits)
    if temperature == 0:
        if logits.dtype not in (np.float32, np.float64):
            logits = logits.astype(np.float64)
        return np.argmax(logits, axis=1).astype(np.int64)
    logits = logits.astype(np.float64)
    return np.array([_sample(row, temperature, top_p, rng) for row in logits], dtype=np.int64)


def _sample(row: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    scaled = row / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    kept = order[: int(np.searchsorted(cumulative, top_p)) + 1]
    weights = probs[kept] / probs[kept].sum()
    return int(kept[min(int(np.searchsorted(np.cumsum(weights), rng.random(), side="right")), len(kept) - 1)])

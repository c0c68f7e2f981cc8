"""The next token from a row of logits, on the host as in float64: greedy, or sampled with temperature and top-p.

Greedy is argmax with the first index on ties (as `torch.argmax`). Sampling divides the logits by the
temperature, takes the softmax, keeps the most likely tokens whose probabilities sum to at least `top_p`
(at least one; transformers' top-p rule), renormalises and draws one with the caller's
`numpy.random.Generator`, so a seed reproduces the tokens. Temperature 0 means greedy, and so does any
temperature below float64's smallest normal number (`GREEDY_BELOW`: 1 / 1e-320 is infinite); above it the
logits are shifted by their maximum before the division, so no temperature overflows them (the most
likely token scales to 0, the others to at most 0).
"""

from __future__ import annotations

import numpy as np

from turnip_ir.errors import InputError


GREEDY_BELOW = float(np.finfo(np.float64).tiny)
"""Temperatures below this (subnormal ones) are greedy: float64 cannot divide by them."""


def check_sampling(temperature: float, top_p: float) -> None:
    if not _real(temperature) or not np.isfinite(temperature) or temperature < 0:
        raise InputError(f"temperature must be a number >= 0, got {temperature!r}")
    if not _real(top_p) or not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {top_p!r}")


def _real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def next_tokens(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of `logits` [B, vocab], as int64 [B]. Greedy is float64's argmax, taken
    without a float64 copy: float32 and float64 logits as they are, 16-bit ones (float16, bfloat16)
    through `argmax16` (numpy's argmax over float16 itself is 10x slower, a float64 copy 2x)."""
    logits = np.asarray(logits)
    if temperature < GREEDY_BELOW:
        if logits.dtype.itemsize == 2 and logits.ndim == 2:
            found = argmax16(logits)
            if found is not None:
                return found
        if logits.dtype not in (np.float32, np.float64):
            logits = logits.astype(np.float64)
        return np.argmax(logits, axis=1).astype(np.int64)
    logits = logits.astype(np.float64)
    return np.array([_sample(row, temperature, top_p, rng) for row in logits], dtype=np.int64)


_NEGATIVE_INFINITY16 = {np.dtype(np.float16).name: -31744}
"""Per 16-bit float type, `_ordered(-inf)`; an ordered key below it is a negative NaN."""


def argmax16(logits: np.ndarray) -> np.ndarray | None:
    """Float64's argmax of each row of 16-bit IEEE floats (float16, bfloat16: sign, exponent, mantissa),
    as int64, computed on their bits: a float's bits as int16 ordered like the floats (`_ordered`, with
    -0 and +0 equal, so ties still go to the lowest id); None when a row holds a NaN, whose argmax the
    caller takes the slow way (numpy returns the first NaN)."""
    floor = _NEGATIVE_INFINITY16.get(logits.dtype.name)
    if floor is None:
        kind = logits.dtype
        if kind.name != "bfloat16":
            return None
        floor = _NEGATIVE_INFINITY16[kind.name] = int(_ordered(np.array([-np.inf], dtype=kind))[0])
    keys = _ordered(np.ascontiguousarray(logits))
    found = np.argmax(keys, axis=1)
    top = logits[np.arange(len(logits)), found]
    if keys.min(initial=0) < floor or np.isnan(top).any():
        return None
    return found.astype(np.int64)


def _ordered(values: np.ndarray) -> np.ndarray:
    """16-bit floats' bits as int16 in the floats' order: a positive float's bits as they are, a negative
    one's magnitude bits flipped, plus one so that -0 and +0 are both 0."""
    bits = values.view(np.int16)
    sign = bits >> 15  # 0 or -1
    return (bits ^ (sign & 0x7FFF)) - sign


def _sample(row: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    with np.errstate(over="ignore"):  # a small temperature sends the unlikely tokens to -inf: probability 0
        scaled = (row - row.max()) / temperature
    probs = np.exp(scaled)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    kept = order[: int(np.searchsorted(cumulative, top_p)) + 1]
    weights = probs[kept] / probs[kept].sum()
    return int(kept[min(int(np.searchsorted(np.cumsum(weights), rng.random(), side="right")), len(kept) - 1)])

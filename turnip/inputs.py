"""A session's arguments checked: the model (config and weights), prompts, forced tokens and given KV
caches, each as the session uses it or a one-line `InputError` naming what is wrong.

Weights are refused, not warned about, when one holds a NaN or an infinity in the compute dtype
(`check_finite_weight`): a NaN in one tensor makes every token the same id, and a value beyond float16's
range becomes an infinity when converted. The check reads each tensor once, when the session first
converts it, on its bits (two integer maxima, in chunks on threads for a large one: memory speed, no
temporary array).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from frontend.workloads import llama
from frontend.workloads.llama.kv_cache import KvCache
from runtime.backends import compute_dtype
from turnip_ir.errors import InputError

CHECK_CHUNK = 64 << 20
"""Bytes of a tensor one thread checks at a time (`holds_nonfinite`)."""
CHECK_THREADS = 8
"""Threads that check one large tensor at most (memory-bound: a few reach the bus's rate)."""

def load_model(config, weights, seed: int, dtype: str | None, backend: str) -> tuple[llama.LlamaConfig, Mapping]:
    """The config (with the compute dtype) and the weights: a mapping, a checkpoint folder, or random from `seed`."""
    folder = Path(weights) if isinstance(weights, (str, Path)) else None
    if folder is not None and not folder.is_dir():
        raise InputError(f"weights folder '{folder}' does not exist")
    if config is None:
        if folder is None:
            raise InputError("a session needs a config, or a weights folder with a config.json")
        config = str(folder)
    if isinstance(config, str):
        config = llama.load_config(config)
    config = replace(config, dtype=compute_dtype(config.dtype, dtype, backend))
    if folder is not None:
        source = llama.CheckpointWeights(folder, config)
    else:
        source = llama.RandomWeights(config, seed) if weights is None else weights
    head = llama.head_name(config)
    if head not in source:
        raise InputError(f"the weights have no '{head}' (the LM head; set tie_word_embeddings if it is the embedding table)")
    return config, source


def check_finite_weight(name: str, values: np.ndarray) -> None:
    """Refuse a weight (in the compute dtype) that holds a NaN or an infinity, naming it and the first bad value."""
    if not holds_nonfinite(values):
        return
    flat = np.asarray(values).reshape(-1)
    bad = ~np.isfinite(flat.astype(np.float32) if flat.dtype.kind != "f" else flat)
    first = np.unravel_index(int(np.argmax(bad)), np.shape(values))
    raise InputError(f"weight {name!r} holds {int(bad.sum())} NaN or infinite value(s) in {np.asarray(values).dtype} "
                     f"(the first {flat[np.argmax(bad)]} at {list(map(int, first))}): the checkpoint is damaged, "
                     "or its values exceed the compute dtype's range (--dtype)")


def holds_nonfinite(values: np.ndarray, nan_only: bool = False) -> bool:
    """Whether float `values` (IEEE: float16, bfloat16, float32, float64) hold a NaN or an infinity (with
    `nan_only`, a NaN), judged on their bits: a positive one's bits as a signed integer are at least
    +inf's (a NaN's above them), a negative one's as an unsigned integer at least -inf's. Other dtypes
    hold none."""
    values = np.asarray(values)
    kind = values.dtype
    if values.size == 0 or not (kind.kind == "f" or kind.name == "bfloat16"):
        return False
    width = kind.itemsize * 8
    top = int(np.array(np.inf, kind).view(f"int{width}")) + int(nan_only)
    signed, unsigned = values.view(f"int{width}"), values.view(f"uint{width}")
    if values.nbytes <= CHECK_CHUNK or not values.flags.c_contiguous:
        return bool(signed.max() >= top or unsigned.max() >= (1 << (width - 1)) | top)
    signed, unsigned = signed.reshape(-1), unsigned.reshape(-1)
    step = CHECK_CHUNK // kind.itemsize
    chunks = [slice(start, start + step) for start in range(0, values.size, step)]
    with ThreadPoolExecutor(min(CHECK_THREADS, os.cpu_count() or 1)) as pool:  # numpy's reductions release the GIL
        tops = list(pool.map(lambda part: (int(signed[part].max()), int(unsigned[part].max())), chunks))
    return max(high for high, _ in tops) >= top or max(low for _, low in tops) >= (1 << (width - 1)) | top


def given_caches(caches, prompts: list[np.ndarray], config: llama.LlamaConfig) -> list[list[tuple]]:
    """The given KV caches, a list per prompt of (k, v) per layer, checked against the prompts, or a one-line error."""
    width = config.num_key_value_heads * config.head_dim
    if len(caches) != len(prompts):
        raise InputError(f"caches are given for {len(caches)} prompts, there are {len(prompts)}")
    checked = []
    for b, (cache, prompt) in enumerate(zip(caches, prompts)):
        want = (len(prompt) - 1, width)
        if len(cache) != config.num_hidden_layers or any(np.shape(t) != want for layer in cache for t in layer):
            raise InputError(f"prompt {b}: its cache must hold {config.num_hidden_layers} layers of (k, v), each {list(want)}")
        checked.append([(np.asarray(k, config.dtype), np.asarray(v, config.dtype)) for k, v in cache])
    return checked


def given_cache(cache: KvCache, prompts: list[np.ndarray], steps: int, config: llama.LlamaConfig, kv_block: int) -> KvCache:
    """A given KvCache, checked: one sequence per prompt holding its first P-1 tokens, room for `steps` more."""
    want = [len(p) - 1 for p in prompts]
    kv_width = config.num_key_value_heads * config.head_dim
    if list(cache.lengths) != want or len(cache) != config.num_hidden_layers or cache.block != kv_block or cache.kv_width != kv_width:
        raise InputError(f"the given cache must hold {want} tokens per sequence in {config.num_hidden_layers} layers of width "
                         f"{kv_width}, in columns of {kv_block}")
    if max(want) + steps > cache.columns * kv_block:
        raise InputError(f"the given cache has room for {cache.columns * kv_block} tokens, the call needs {max(want) + steps}")
    return cache


def forced_tokens(tokens, batch: int, steps: int, config: llama.LlamaConfig) -> np.ndarray:
    """Teacher-forced tokens as int64 [batch, steps], or a one-line error."""
    ids = np.asarray(tokens)
    if ids.shape != (batch, steps) or ids.dtype.kind not in "iu":
        raise InputError(f"forced tokens must be integers of shape [{batch}, {steps}], got {ids.dtype} of shape {list(ids.shape)}")
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise InputError(f"forced tokens must be in the vocabulary range [0, {config.vocab_size})")
    return ids.astype(np.int64)


def checked_prompts(prompts: Sequence, config: llama.LlamaConfig) -> list[np.ndarray]:
    """Each prompt as int64 [P], or a one-line error naming the prompt."""
    if isinstance(prompts, np.ndarray):
        prompts = [prompts] if prompts.ndim == 1 else list(prompts)  # [P] or [B, P]
    if len(prompts) == 0:
        raise InputError("no prompts given")
    checked = []
    for i, prompt in enumerate(prompts):
        ids = np.asarray(prompt)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise InputError(f"prompt {i} must be a 1-D array of integer token ids, got {ids.dtype} of shape {list(ids.shape)}")
        if ids.size == 0:
            raise InputError(f"prompt {i} is empty")
        bad = ids[(ids < 0) | (ids >= config.vocab_size)]
        if bad.size:
            raise InputError(f"prompt {i}: token id {int(bad[0])} is out of the vocabulary range [0, {config.vocab_size})")
        checked.append(ids.astype(np.int64))
    return checked

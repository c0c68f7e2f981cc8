"""A session's arguments checked: the model (config and weights), prompts (token ids, or text and chats
through the weights folder's tokenizer), forced tokens and given KV caches, each as the session uses it
or a one-line `InputError` naming what is wrong."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from frontend.text import Tokenizer, load_tokenizer
from frontend.workloads import llama
from frontend.workloads.llama.kv_cache import KvCache
from runtime.backends import compute_dtype
from turnip_ir.errors import InputError

NO_TOKENIZER = "text needs the tokenizer of a weights folder, and this session has none (it was made without one)"


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


def checked_prompts(prompts, config: llama.LlamaConfig, tokenizer: Callable[[], Tokenizer] | None = None,
                    chat: bool = False) -> list[np.ndarray]:
    """Each prompt as int64 [P], or a one-line error naming the prompt. A prompt is token ids (an array, or
    a list of ints: one prompt), a string (encoded by `tokenizer()`, the folder's; with `chat`, as one user
    message of the chat template) or a conversation (a list of {"role", "content"} messages: the template)."""
    if isinstance(prompts, np.ndarray):
        prompts = [prompts] if prompts.ndim == 1 else list(prompts)  # [P] or [B, P]
    elif isinstance(prompts, str) or _is_ids(prompts) or _is_conversation(prompts):
        prompts = [prompts]
    if len(prompts) == 0:
        raise InputError("no prompts given")
    checked = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str) or _is_conversation(prompt):
            ids = _encoded(prompt, i, config, tokenizer, chat)
        else:
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


def _encoded(prompt: str | list, i: int, config: llama.LlamaConfig, tokenizer, chat: bool) -> np.ndarray:
    """A text prompt's ids; text longer than the model's positions is refused (ids are not: RoPE extends past
    them, and benchmarks run 7b past its 4096)."""
    if isinstance(prompt, str) and not prompt:
        raise InputError(f"prompt {i} is empty text")
    if isinstance(prompt, str) and chat:
        prompt = [{"role": "user", "content": prompt}]
    try:
        if tokenizer is None:
            raise InputError(NO_TOKENIZER)
        ids = tokenizer().encode(prompt) if isinstance(prompt, str) else tokenizer().apply_chat_template(prompt)
    except InputError as err:
        raise InputError(f"prompt {i}: {err}") from None
    if len(ids) > config.max_position_embeddings:
        raise InputError(f"prompt {i} is {len(ids)} tokens, more than the model's {config.max_position_embeddings} positions "
                         "(max_position_embeddings)")
    return np.asarray(ids, dtype=np.int64)


def _is_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in prompt)


def _is_conversation(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(m, Mapping) for m in prompt)


class FolderTokenizer:
    """A weights folder's tokenizer (frontend/text.py), loaded at its first use and kept; calling it gives
    the tokenizer or a one-line error naming what is missing."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self._loaded: Tokenizer | None = None

    def __call__(self) -> Tokenizer:
        if self._loaded is None:
            if self.folder is None:
                raise InputError(NO_TOKENIZER)
            self._loaded = load_tokenizer(self.folder)
        return self._loaded

    def decoded(self, tokens: np.ndarray) -> list[str] | None:
        """Each row's text (special tokens skipped), or None where there is no tokenizer to use: no weights
        folder, no tokenizer.json in it, or the `text` extra not installed (token ids alone need none of them)."""
        try:
            tokenizer = self()
        except InputError:
            return None
        return [tokenizer.decode(row, skip_special_tokens=True) for row in np.asarray(tokens)]

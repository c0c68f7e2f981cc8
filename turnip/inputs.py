"""A session's arguments checked: the model (config and weights), prompts (token ids, or text and chats
through the weights folder's tokenizer), forced tokens and given KV caches, each as the session uses it
or a one-line `InputError` naming what is wrong.

Weights are refused, not warned about, when one holds a NaN or an infinity in the compute dtype
(`check_finite_weight`): a NaN in one tensor makes every token the same id, and a value beyond float16's
range becomes an infinity when converted. The check reads each tensor once, after the session first
converts it, on its bits (two integer maxima, in chunks on threads for a large one: memory speed, no
temporary array), on a thread of its own while the run goes on (turnip/host.py, `Materialized`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from frontend.text import Tokenizer, load_tokenizer
from frontend.workloads import llama
from frontend.workloads.llama.kv_cache import KvCache
from passes.schedules import SCHEDULES
from runtime.backends import compute_dtype
from runtime.policies import ORDERS
from turnip.candidates import DIMENSIONS
from turnip_ir.errors import InputError
from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.limits import INT_LIMIT
from turnip_ir.pools import shared_pool

MAX_KV_BLOCK = 1 << 20
"""The most token rows one cache column may hold: every call's cache has room for at least one column."""
MAX_NEW_TOKENS = 1 << 20
"""The most new tokens a call asks for (as `turnip generate --max-new-tokens`): a step a token, and the
cache has room for all of them from the start."""
CHECK_CHUNK = 64 << 20
"""Bytes of a tensor one thread checks at a time (`holds_nonfinite`)."""
CHECK_THREADS = 8
"""Threads that check one large tensor at most (memory-bound: a few reach the bus's rate)."""

def check_session_arguments(memory, gpus, order, seed, dtype, schedule, kv_block, backend_options, plan_dir) -> None:
    """A `Session`'s arguments that need no model, each refused in one line naming it (before any work)."""
    if not _integer(memory) or not 0 < memory < INT_LIMIT:
        raise InputError(f"memory must be a positive number of bytes (below 2**62), got {memory!r}")
    for name, value in (("gpus", gpus), ("kv_block", kv_block)):
        if not _integer(value) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if kv_block > MAX_KV_BLOCK:
        raise InputError(f"kv_block must be at most {MAX_KV_BLOCK} (token rows a cache column holds), got {kv_block}")
    check_seed(seed)
    for name, value, known in (("order", order, ORDERS), ("schedule", schedule, SCHEDULES)):
        if value not in known and not (name == "schedule" and value is None):
            raise InputError(f"unknown {name} {value!r} (known: {', '.join(known)})")
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise InputError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)}, or None for the config's)")
    if backend_options is not None and not isinstance(backend_options, Mapping):
        raise InputError(f"backend_options must be a mapping of keyword arguments, got {type(backend_options).__name__}")
    if plan_dir is not None and not isinstance(plan_dir, (str, os.PathLike)):
        raise InputError(f"plan_dir must be a folder's path, got {type(plan_dir).__name__}")


def check_prefill_plan(plan):
    """A session's `prefill_plan`: `auto`, `default`, or a mapping of some of turnip/candidates.py's
    DIMENSIONS to a value or `auto` (a layer order, a positive block and query group, a schedule);
    returned as given (a mapping copied), else one `InputError` line naming what is wrong."""
    if isinstance(plan, str) and plan in ("auto", "default"):
        return plan
    if not isinstance(plan, Mapping):
        raise InputError(f"prefill_plan must be 'auto', 'default' or a mapping of {', '.join(DIMENSIONS)}, got {plan!r}")
    for name, value in plan.items():
        if name not in DIMENSIONS:
            raise InputError(f"prefill_plan: unknown dimension {name!r} (known: {', '.join(DIMENSIONS)})")
        if value == "auto":
            continue
        if name in ("block", "query_group"):
            ok, known = _integer(value) and value >= 1, "a positive integer"
        else:
            choices = llama.LAYER_ORDERS if name == "layer_order" else SCHEDULES
            ok, known = value in choices, ", ".join(choices)
        if not ok:
            raise InputError(f"prefill_plan: {name} must be auto or {known}, got {value!r}")
    return dict(plan)


def check_seed(seed, name: str = "seed") -> None:
    """A seed is an integer >= 0 (numpy's generators take no other)."""
    if not _integer(seed) or seed < 0:
        raise InputError(f"{name} must be an integer >= 0, got {seed!r}")


def check_gpus(gpus: int, config: llama.LlamaConfig) -> None:
    """A session places whole layers on its GPUs, so it has at most as many GPUs as the model has layers."""
    if gpus > config.num_hidden_layers:
        raise InputError(f"gpus ({gpus}) is more than the model's {config.num_hidden_layers} layers: a session places whole "
                         "layers on its GPUs")


def _integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


NO_TOKENIZER = "text needs the tokenizer of a weights folder, and this session has none (it was made without one)"


def load_model(config, weights, seed: int, dtype: str | None, backend: str) -> tuple[llama.LlamaConfig, Mapping]:
    """The config (with the compute dtype) and the weights: a mapping, a checkpoint folder, or random from
    `seed`; a mapping must name every weight of the config."""
    if not (config is None or isinstance(config, (llama.LlamaConfig, str, os.PathLike))):
        raise InputError(f"config must be a LlamaConfig, a preset's name or a config.json's path, got {type(config).__name__}")
    if not (weights is None or isinstance(weights, (Mapping, str, os.PathLike))):
        raise InputError(f"weights must be a mapping of tensors by name or a checkpoint folder's path, got {type(weights).__name__}")
    folder = Path(weights) if isinstance(weights, (str, os.PathLike)) else None
    if folder is not None and not folder.is_dir():
        raise InputError(f"weights folder '{folder}' does not exist")
    if config is None:
        if folder is None:
            raise InputError("a session needs a config, or a weights folder with a config.json")
        config = str(folder)
    if isinstance(config, (str, os.PathLike)):
        config = llama.load_config(str(config))
    config = replace(config, dtype=compute_dtype(config.dtype, dtype, backend))
    if folder is not None:
        source = llama.CheckpointWeights(folder, config)
    else:
        source = llama.RandomWeights(config, seed) if weights is None else weights
    head = llama.head_name(config)
    if head not in source:
        raise InputError(f"the weights have no '{head}' (the LM head; set tie_word_embeddings if it is the embedding table)")
    shapes = {**llama.weight_shapes(config), head: (config.vocab_size, config.hidden_size)}
    missing = [name for name in shapes if name not in source]
    if missing:
        raise InputError(f"the weights have no {missing[0]!r}" + (f" nor {len(missing) - 1} other tensor(s) the config needs" if len(missing) > 1 else ""))
    if folder is None and weights is not None:
        _check_tensors(source, shapes)
    return config, source


def _check_tensors(weights: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Each of a caller's tensors an array of real numbers (or a lazy input) of the config's shape, read
    without materialising a lazy one."""
    lazy = getattr(weights, "lazy", None)
    for name, shape in shapes.items():
        value = lazy(name) if lazy is not None else weights[name]
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            value = np.asarray(value) if not isinstance(value, (str, bytes)) else np.array(value)
        if not _real_dtype(value.dtype):
            raise InputError(f"weight {name!r} must be an array of real numbers, got dtype {value.dtype}")
        if tuple(value.shape) != tuple(shape):
            raise InputError(f"weight {name!r} has shape {list(value.shape)}, the config needs {list(shape)}")


def _real_dtype(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind in "biuf" or dtype.name == "bfloat16"


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
    tops = list(shared_pool("check", CHECK_THREADS).map(  # numpy's reductions let go of the GIL; threads made once (turnip_ir/pools.py)
        lambda part: (int(signed[part].max()), int(unsigned[part].max())), chunks))
    return max(high for high, _ in tops) >= top or max(low for _, low in tops) >= (1 << (width - 1)) | top


def given_caches(caches, prompts: list[np.ndarray], config: llama.LlamaConfig) -> list[list[tuple]]:
    """The given KV caches, a list per prompt of (k, v) per layer, checked against the prompts, or a one-line error."""
    width = config.num_key_value_heads * config.head_dim
    if not isinstance(caches, Sequence) or len(caches) != len(prompts):
        given = f"for {len(caches)} prompts" if isinstance(caches, Sequence) else f"as {type(caches).__name__}"
        raise InputError(f"caches must be a list with one cache per prompt ({len(prompts)}), or a KvCache; given {given}")
    checked = []
    for b, (cache, prompt) in enumerate(zip(caches, prompts)):
        want = (len(prompt) - 1, width)
        pairs = isinstance(cache, Sequence) and all(isinstance(layer, Sequence) and len(layer) == 2 for layer in cache)
        if not pairs or len(cache) != config.num_hidden_layers or any(np.shape(t) != want for layer in cache for t in layer):
            raise InputError(f"prompt {b}: its cache must hold {config.num_hidden_layers} layers of (k, v), each {list(want)}")
        if not all(_real_dtype(np.asarray(t).dtype) for layer in cache for t in layer):
            raise InputError(f"prompt {b}: its cache must hold arrays of real numbers")
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
    if not isinstance(prompts, (Sequence, np.ndarray)):
        raise InputError(f"prompts must be a list of 1-D integer arrays or texts, or one array [P] or [B, P], got {type(prompts).__name__}")
    if isinstance(prompts, np.ndarray):
        prompts = [prompts] if prompts.ndim <= 1 else list(prompts)  # [P] or [B, P]
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

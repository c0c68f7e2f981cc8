"""LLaMA weights by their Hugging Face names: the shapes a config implies, random ones, or a checkpoint.

Names are those of `LlamaForCausalLM` checkpoints (`model.layers.{i}.self_attn.q_proj.weight`, ...,
`model.norm.weight`, `model.embed_tokens.weight`; qwen2's `self_attn.{q,k,v}_proj.bias`); a checkpoint saved from a bare `LlamaModel` (no
`model.` prefix) is read too. Both sources are read-only mappings that make a tensor only when asked,
so a 13 GB checkpoint is mapped, not copied, and only the blocks the graph needs are cut from it.
`lazy(name)` gives a tensor as a lazy input (runtime/inputs.py) instead: a checkpoint's is read, and
a random one drawn, straight into the buffer the backend writes it to (pinned host storage), so a
model's weights are never held twice on the host; `LlamaGraph.feed` takes those.
Token ids become hidden states on the host, through the embedding table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path

import numpy as np

from turnip_ir.errors import InputError
from frontend.lazy import LazyTensor
from frontend.safetensors import SafeTensors
from frontend.workloads.common import rng
from frontend.workloads.llama.config import LlamaConfig
from turnip_ir.kernels import numpy_dtype

EMBED = "model.embed_tokens.weight"
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""What a weight may be stored as (F16, BF16, F32, F64): an integer read as a float is a wrong model, not a cast."""
LM_HEAD = "lm_head.weight"
BIAS_SCALE = 0.1
"""Random biases are small beside the projections they shift."""
POOL = 262147
"""Random weights draw at most this many values per tensor and repeat them: 7B in seconds, not minutes.
A prime, so no row length divides it: rows start at distinct offsets of the pool, and no two rows of a
projection or of the embedding table are equal (2^18 made every 64th row of a 4096-wide matrix repeat)."""


def weight_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the prefill reads, by HF name, with its shape ([out, in] for projections)."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    shapes = {EMBED: (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_width, hidden),
            p + "self_attn.k_proj.weight": (kv_width, hidden),
            p + "self_attn.v_proj.weight": (kv_width, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_width),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (inner, hidden),
            p + "mlp.up_proj.weight": (inner, hidden),
            p + "mlp.down_proj.weight": (hidden, inner),
        }
        if config.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q_width,), p + "self_attn.k_proj.bias": (kv_width,),
                       p + "self_attn.v_proj.bias": (kv_width,)}
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def head_name(config: LlamaConfig) -> str:
    """The weight the LM head multiplies by: the embedding table when tied, else `lm_head.weight` [vocab, hidden]."""
    return EMBED if config.tie_word_embeddings else LM_HEAD


class RandomWeights(Mapping):
    """Weights from a seed: projections N(0, 1/fan-in), norms 1 + N(0, 0.1^2), biases N(0, 0.1^2),
    embeddings N(0, 1).

    Each tensor draws at most `POOL` values from its own generator (seed, name) and repeats them in
    row-major order (`Cycled`), drawn when the tensor is written, not when it is named."""

    def __init__(self, config: LlamaConfig, seed: int):
        self.config = config
        self.seed = seed
        self.shapes = weight_shapes(config)
        if not config.tie_word_embeddings:
            self.shapes[LM_HEAD] = (config.vocab_size, config.hidden_size)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.lazy(name).materialize()

    def lazy(self, name: str) -> Cycled:
        """Tensor `name` as a lazy input, drawn when written."""
        return Cycled(partial(self._pool, name), self.shapes[name], numpy_dtype(self.config.dtype))

    def _pool(self, name: str) -> np.ndarray:
        shape = self.shapes[name]
        draw = rng(self.seed, name).standard_normal(min(int(np.prod(shape)), POOL))
        if name.endswith("norm.weight"):
            draw = 1.0 + 0.1 * draw
        elif name.endswith(".bias"):
            draw = BIAS_SCALE * draw
        elif name != EMBED:
            draw = draw / np.sqrt(shape[1])
        return draw.astype(self.config.dtype)

    def __contains__(self, name) -> bool:
        return name in self.shapes  # Mapping's default would draw the whole tensor to answer

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


class CheckpointWeights(Mapping):
    """The weights of an HF model folder (one safetensors file or a sharded index), mapped lazily.

    Opening checks every name and shape against the config, so a missing or misshapen tensor is a
    one-line error before anything is built; reading converts to the model dtype only when it differs."""

    def __init__(self, folder: str | Path, config: LlamaConfig):
        self.config = config
        self.shapes = weight_shapes(config)
        self.file = SafeTensors.open(folder)
        bare = EMBED not in self.file and EMBED.removeprefix("model.") in self.file
        self.stored = {name: name.removeprefix("model.") if bare else name for name in self.shapes}
        for name, shape in self.shapes.items():
            stored = self.stored[name]
            if stored not in self.file:
                raise InputError(f"weights '{self.file.source}': tensor '{stored}' is missing")
            if self.file.dtype(stored) not in FLOAT_DTYPES:
                raise InputError(f"weights '{self.file.source}': tensor '{stored}' has dtype {self.file.dtype(stored)}, "
                                 "a weight must be F16, BF16, F32 or F64")
            if tuple(self.file.shape(stored)) != shape:
                raise InputError(f"weights '{self.file.source}': tensor '{stored}' has shape "
                                 f"{list(self.file.shape(stored))}, the config needs {list(shape)}")
        self._add_head()

    def _add_head(self) -> None:
        """`lm_head.weight` when the file has it (generation needs it unless tied; a prefill does not)."""
        head = (self.config.vocab_size, self.config.hidden_size)
        if LM_HEAD not in self.file:
            return
        if tuple(self.file.shape(LM_HEAD)) != head:
            raise InputError(f"weights '{self.file.source}': tensor '{LM_HEAD}' has shape "
                             f"{list(self.file.shape(LM_HEAD))}, the config needs {list(head)}")
        self.shapes[LM_HEAD] = head
        self.stored[LM_HEAD] = LM_HEAD

    def __getitem__(self, name: str) -> np.ndarray:
        return self.file.get(self.stored[name], dtype=self.config.dtype)

    def lazy(self, name: str):
        """Tensor `name` in the model dtype as a lazy input, read (and converted) when written."""
        return self.file.lazy(self.stored[name], numpy_dtype(self.config.dtype))

    def __contains__(self, name) -> bool:
        return name in self.shapes  # Mapping's default would read (and convert) the tensor to answer

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


class Cycled(LazyTensor):
    """A tensor of `shape` whose values, in row-major order, repeat a pool (`draw()` makes it when the tensor
    is written), or a block of one (frontend/lazy.py)."""

    def __init__(self, draw: Callable[[], np.ndarray], shape: tuple[int, ...], dtype: np.dtype):
        super().__init__(shape, dtype)
        self.draw = draw

    def write_into(self, out: np.ndarray) -> None:
        assert out.flags.c_contiguous and out.shape == self.shape, "a lazy tensor is written into its own contiguous buffer"
        pool = self.draw()
        if not self.whole:
            out[...] = pool[0]
            return
        first = self.index[0].indices(self.whole[0])[0] if self.index else 0
        row = int(np.prod(self.whole[1:], dtype=np.int64))
        if out.shape[1:] == self.whole[1:]:  # whole rows: one run of the pool
            _cycle(out.reshape(-1), pool, first * row)
            return
        columns = (slice(None),) + self.index[1:]
        step = max(1, (4 << 20) // max(1, row * pool.itemsize))  # partial rows: whole rows a few MB at a time, then cut
        rows = np.empty((min(step, out.shape[0]), *self.whole[1:]), pool.dtype)
        for start in range(0, out.shape[0], step):
            count = min(step, out.shape[0] - start)
            _cycle(rows[:count].reshape(-1), pool, (first + start) * row)
            out[start : start + count] = rows[:count][columns]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of the whole tensor, each cycled from the pool drawn once."""
        pool = self.draw()
        width = int(np.prod(self.whole[1:], dtype=np.int64))
        out = np.empty((len(ids), *self.whole[1:]), self.dtype)
        for i, row in enumerate(ids):
            _cycle(out[i].reshape(-1), pool, int(row) * width)
        return out


def _cycle(flat: np.ndarray, pool: np.ndarray, offset: int) -> None:
    """flat[i] = pool[(offset + i) % len(pool)], in three numpy copies (head, whole periods, tail)."""
    period, count = len(pool), len(flat)
    shift = offset % period
    head = min(period - shift, count)
    flat[:head] = pool[shift : shift + head]
    periods = (count - head) // period
    if periods:
        flat[head : head + periods * period].reshape(periods, period)[...] = pool
    tail = count - head - periods * period
    if tail:
        flat[count - tail :] = pool[:tail]


def random_ids(config: LlamaConfig, tokens: int, seed: int) -> np.ndarray:
    """`tokens` token ids drawn uniformly from the vocabulary."""
    return rng(seed, "input_ids").integers(0, config.vocab_size, tokens, dtype=np.int64)


def embed(weights: Mapping[str, np.ndarray], ids: np.ndarray, config: LlamaConfig) -> np.ndarray:
    """The hidden states [T, hidden] that enter layer 0: the embedding rows of `ids`."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"token ids must be a non-empty 1-D integer array, got {ids.dtype} of shape {list(ids.shape)}")
    bad = ids[(ids < 0) | (ids >= config.vocab_size)]
    if bad.size:
        raise InputError(f"token id {int(bad[0])} is out of the vocabulary range [0, {config.vocab_size})")
    if callable(getattr(weights, "lazy", None)):  # only the rows: never the whole table (1 GB for a 128k vocabulary)
        return weights.lazy(EMBED).rows(ids)
    return np.ascontiguousarray(weights[EMBED][ids], dtype=config.dtype)

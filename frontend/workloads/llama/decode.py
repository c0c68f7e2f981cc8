"""One LLaMA decode step as a taskgraph: B sequences, one new token each, against the batch's KV cache.

Inputs: `hidden` [B, hidden] (the new tokens' embeddings), `rope.cos` / `rope.sin` [B, head_dim] (row b
at sequence b's own position), `kv.lengths` [B] float32 (each sequence's cached tokens: exact integers
below 2^24), the weights by their Hugging Face names (the prefill graph's names, so one mapping feeds
both), and per layer l the cache in columns of `kv_block` token rows shared by the batch:
`kv.{l}.k[j]` / `kv.{l}.v[j]` [rows, B, kv_width] hold positions j * kv_block .. of every sequence
(token-major, so the growing last column is a contiguous prefix of its host buffer, frontend/workloads/llama/kv_cache.py).
Every column but the last has kv_block rows; the last has a `tail` of 64, 128 or a multiple of 128 rows
that covers the longest sequence, so the graph's shapes change once per bucket, not once per token:
`DecodeStep.key` is what they depend on. A shorter sequence's rows past its length are padding, never
read: the kernel limits each row to the keys below lengths[b].
The step is a `Program` of one token block of B rows, and each layer is the prefill's own (graph.py `_layer`:
RMSNorm, q/k/v as one einsum each over the B rows plus qwen2's bias, RoPE, attention, the o projection,
the residual, the MLP), given two hooks: its new k (after RoPE) and v rows are outputs (`_layer`'s `kv`
list), and it attends over the cache (`cache_attention`): one `decode_attention` link per cache column
(the whole batch, each row over its own sequence's keys), closed by the link over each sequence's own new
key (the final one). With mistral's sliding window each row sees only keys inside it, and columns wholly
behind every sequence's window are neither inputs nor links. Then the final RMSNorm and the LM head.
Outputs: the logits [B, vocab] in blocks of vocabulary rows, in the model dtype (the LM head is cut like
every other large matmul: `head_blocks`, block j on GPU j % gpus; `DecodeStep.logits` puts them side by
side), and per layer the new k and v rows [B, kv_width] the host appends to the cache (`DecodeStep.new_kv`,
`new_kv_names`). Over `gpus`, layer l runs on GPU l * gpus // L (the prefill's `layers` placement) and the
final norm on the last GPU; the step's activations are fed on GPU 0 and the stream, RoPE rows and lengths
are moved once to each GPU that reads them. The graph is the one the hand-written builder this replaced
made, task for task and in the same order (tests/test_decode_lowering.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from frontend import Blocked, Program, given, on
from frontend.placement import Placement
from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.graph import (
    Attention,
    Projection,
    _layer,
    default_vocab_block,
    linear,
    plan,
)
from frontend.workloads.llama.kv_cache import KvCache
from frontend.workloads.llama.rope import inverse_frequencies
from frontend.workloads.llama.weights import head_name
from turnip_ir.errors import InputError
from turnip_ir.taskgraph import TaskGraph

ACTIVATIONS = ("hidden", "rope.cos", "rope.sin", "kv.lengths")
"""The inputs a step is fed besides its weights and its cache columns (`kv.{layer}.{k,v}[j]`)."""
KV_BLOCK = 1024
"""Default cache tokens per column: a long cache is streamed column by column."""
TAIL_MIN = 64
"""The fewest rows of the last column: 64, then 128, then multiples of TAIL_STEP."""
TAIL_STEP = 128
"""Past 128 rows the last column grows by this many: a new plan 9 times per 1024 tokens, and at most 127
rows of padding streamed per sequence and layer (powers of two would make 5 plans, but a step just past
one, B=64 at 513 tokens say, would stream twice the cache: measured on the H200, 44 GB a step for 30)."""


def tail_rows(rows: int, kv_block: int) -> int:
    """The rows of a last column that must hold `rows` tokens: 64, 128, then the multiple of TAIL_STEP at
    or above, at most kv_block."""
    if rows <= TAIL_MIN:
        bucket = TAIL_MIN
    elif rows <= 2 * TAIL_MIN:
        bucket = 2 * TAIL_MIN
    else:
        bucket = -(-rows // TAIL_STEP) * TAIL_STEP
    return min(bucket, kv_block)


def cache_columns(lengths: Sequence[int], kv_block: int, window: int | None = None) -> list[tuple[int, int]]:
    """(first position, rows) of each cache column a step of sequences with `lengths` cached tokens reads:
    columns of kv_block rows, the last one `tail_rows` long; with a sliding `window`, only from the first
    column some sequence's new token (at position lengths[b]) sees a key of."""
    longest = max(lengths, default=0)
    count = -(-longest // kv_block)
    first = 0
    if window is not None and count:
        first = min(max(0, n - window + 1) for n in lengths) // kv_block
    columns = []
    for j in range(first, count):
        rows = kv_block if j < count - 1 else tail_rows(longest - j * kv_block, kv_block)
        columns.append((j * kv_block, rows))
    return columns


def step_key(batch: int, kv_block: int, columns: Sequence[tuple[int, int]]) -> tuple:
    """`DecodeStep.key` of a step of `batch` sequences reading `columns` (`cache_columns`), without building it."""
    return (batch, kv_block, tuple(columns))


@dataclass
class DecodeStep:
    """A built decode step and how to feed it and read it."""

    config: LlamaConfig
    cache_lengths: tuple[int, ...]
    kv_block: int
    program: Program
    columns: list[tuple[int, int]]
    """(first position, rows) of each cache column it reads."""
    kv: list[tuple[Blocked, Blocked]]
    """Per layer, the new k (after RoPE) and v rows [B, kv_width], outputs."""
    head: Blocked
    """The LM head's output, the logits [B, vocab] in blocks of vocabulary columns (`head_blocks`)."""
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """What depends only on the graph (shared by the steps `dataclasses.replace` re-aims at new lengths):
    the cache inputs, and the weight inputs of a `feed(..., fixed_weights=True)`."""

    @property
    def graph(self) -> TaskGraph:
        return self.program.graph

    @property
    def batch(self) -> int:
        return len(self.cache_lengths)

    @property
    def key(self) -> tuple:
        """What the graph's shapes depend on (besides the config and GPUs): steps of one key share a plan."""
        return step_key(self.batch, self.kv_block, self.columns)

    def feed(self, weights: Mapping[str, np.ndarray], hidden: np.ndarray, cache, fixed_weights: bool = False,
             columns: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Inputs by taskgraph id: `hidden` [B, hidden] and the batch's `cache` (kv_cache.KvCache, or per
        sequence per layer (k, v) [cache_len, kv_width] arrays). Cache columns are views, not copies.
        `fixed_weights`: `weights` is the same mapping with the same arrays as at this graph's last
        such call (a session's), so the weight inputs gathered then are used again. `columns`: this
        step's `column_inputs(cache)`, when the caller has them."""
        if not isinstance(cache, KvCache):
            cache = KvCache.from_prefixes(cache, self.kv_block, room=0, dtype=self.config.dtype)
        if tuple(int(n) for n in cache.lengths) != self.cache_lengths:
            raise InputError(f"the cache holds {list(cache.lengths)} tokens per sequence, the step expects {list(self.cache_lengths)}")
        dtype = self.config.dtype
        cos, sin = rope_rows(self.config, self.cache_lengths)
        arrays = {"hidden": np.ascontiguousarray(hidden, dtype=dtype), "rope.cos": cos.astype(dtype), "rope.sin": sin.astype(dtype)}
        gathered = self.memo.get("weights") if fixed_weights else None
        if gathered is None or gathered[0] is not weights:
            gathered = (weights, self.program.feed(weights, self.weight_names))
            if fixed_weights:
                self.memo["weights"] = gathered
        arrays.update(gathered[1])
        arrays["kv.lengths"] = np.asarray(self.cache_lengths, np.float32)
        arrays.update(self.column_inputs(cache) if columns is None else columns)
        return arrays

    @property
    def weight_names(self) -> list[str]:
        """The inputs fed from the weights mapping by name: all but the step's activations and cache columns."""
        return [name for name in self.program.inputs if name not in ACTIVATIONS and not name.startswith("kv.")]

    def weight_ids(self) -> set[str]:
        """The taskgraph ids of the weights' blocks (the LM head's blocks among them)."""
        if "weight_ids" not in self.memo:
            self.memo["weight_ids"] = self.program.input_ids(self.weight_names)
        return self.memo["weight_ids"]

    def column_inputs(self, cache: KvCache) -> dict[str, np.ndarray]:
        """The cache's column inputs, views (`KvCache.column`: the same objects for the same rows)."""
        return {name: cache.column(layer, which, j, rows) for name, (layer, which, j, rows) in self.cache_inputs().items()}

    def cache_inputs(self) -> dict[str, tuple[int, str, int, int]]:
        """Each cache column input's id -> (layer, "k" or "v", column index, rows) (one dict, kept: not to be changed)."""
        inputs = self.memo.get("cache_inputs")
        if inputs is None:
            inputs = self.memo["cache_inputs"] = {
                column_id(layer, which, start // self.kv_block): (layer, which, start // self.kv_block, rows)
                for layer in range(self.config.num_hidden_layers) for which in "kv" for start, rows in self.columns}
        return inputs

    def logits(self, outputs: Mapping[str, np.ndarray], dtype=np.float64) -> np.ndarray:
        """[B, vocab] from the head's blocks, a copy in `dtype` (None: the model's; the outputs may be the
        backend's memory, reused at its next run)."""
        blocks = [outputs[self.head.block_id(coords)] for coords in sorted(self.head.blocks)]
        return np.concatenate(blocks, axis=1, dtype=dtype)

    def new_kv(self, outputs: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, this step's (k, v) rows [B, kv_width], k after RoPE."""
        return [tuple(outputs[name] for name in self.new_kv_names(l)) for l in range(self.config.num_hidden_layers)]

    def new_kv_names(self, layer: int) -> tuple[str, str]:
        """The output ids of a layer's new (k, v) rows."""
        k, v = self.kv[layer]
        return k.block_id((0, 0)), v.block_id((0, 0))


def rope_rows(config: LlamaConfig, positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [B, head_dim]: row b at position positions[b], with the frequencies of a sequence of
    positions[b] + 1 tokens (only `dynamic` RoPE depends on the length)."""
    positions = [int(p) for p in positions]
    if config.rope.type != "dynamic" or max(positions, default=0) < config.max_position_embeddings:
        # every row's length has the same frequencies (those of one token): one outer product
        angles = np.multiply.outer(np.asarray(positions, dtype=np.float64), inverse_frequencies(config, 1))
    else:
        angles = np.array([position * inverse_frequencies(config, position + 1) for position in positions], dtype=np.float64)
    both = np.concatenate([angles, angles], axis=1).reshape(len(positions), config.head_dim)
    return np.cos(both), np.sin(both)


def build_decode_step(config: LlamaConfig, cache_lengths: Sequence[int], gpus: int = 1, kv_block: int = KV_BLOCK,
                      projection: Projection = linear) -> DecodeStep:
    """The decode step of len(cache_lengths) sequences, sequence b having cache_lengths[b] tokens cached:
    the prefill's decoder layer (graph.py `_layer`) on one token block of B rows, attending over the cache.
    `projection` makes the layers' projections (`_layer`'s hook: a LoRA adapter's, fed by name with the weights)."""
    lengths = tuple(cache_lengths)
    if not lengths:
        raise InputError("decode step: the batch is empty")
    for what, value, least in (("gpus", gpus, 1), ("kv_block", kv_block, 1), *((f"cache length {b}", n, 0) for b, n in enumerate(lengths))):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InputError(f"decode step: {what} must be an integer >= {least}, got {value!r}")
    kv_block = int(kv_block)
    columns = cache_columns(lengths, kv_block, config.sliding_window)
    prog = Program(gpus)
    batch, dtype = len(lengths), config.dtype
    rope = [prog.input(f"rope.{f}", (batch, config.head_dim), dtype, place=on(0)) for f in ("cos", "sin")]
    cached = prog.input("kv.lengths", (batch,), "float32", place=on(0))
    x = prog.input("hidden", (batch, config.hidden_size), dtype, place=on(0))
    kv: list[tuple[Blocked, Blocked]] = []
    for layer in range(config.num_hidden_layers):
        attend = cache_attention(config, layer, columns, kv_block, cached)
        x = _layer(prog, config, x, rope, layer, plan(config, "layers", gpus, layer), kv, projection=projection, attention=attend)
    norm = prog.input("model.norm.weight", (config.hidden_size,), dtype)
    h = prog.map("rmsnorm", x, norm, name="final_norm", signature="th,h->th", eps=config.rms_norm_eps, place=on(gpus - 1))
    rows = tuple(stop - start for start, stop in head_blocks(config))
    head = prog.input(head_name(config), (config.vocab_size, config.hidden_size), dtype, (rows,))
    logits = linear(prog, h, "logits", head, given(lambda c: c["o"] % gpus))
    prog.output(logits)
    prog.taskgraph()
    return DecodeStep(config, lengths, kv_block, prog, columns, kv, logits)


def cache_attention(config: LlamaConfig, layer: int, columns: Sequence[tuple[int, int]], kv_block: int, lengths: Blocked) -> Attention:
    """Layer `layer`'s attention over the batch's cache (a `_layer` hook): one `decode_attention` link per
    cache column (`kv.{layer}.k[j]` and `.v[j]` [rows, B, kv_width]) for the whole batch, each row over its
    own sequence's keys below `lengths`, closed by the link over each sequence's own new key."""
    attrs = {"heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads}
    if config.sliding_window is not None:
        attrs["window"] = config.sliding_window

    def attend(prog: Program, q: Blocked, k: Blocked, v: Blocked, name: str, place: Placement) -> Blocked:
        prev = None
        for start, rows in columns:
            j = start // kv_block
            column = [prog.input(column_id(layer, which, j), (rows, *k.shape), config.dtype) for which in "kv"]
            prev = _link(prog, f"{name}.{j}", (q, *column, lengths), "rbk", prev, place, final=False, start=start, **attrs)
        return _link(prog, name, (q, k, v, lengths), "bk", prev, place, own=True, **attrs)

    return attend


def column_id(layer: int, which: str, j: int) -> str:
    """The input id of cache column j of layer `layer`'s k or v (`which`)."""
    return f"kv.{layer}.{which}[{j}]"


def _link(prog: Program, name: str, operands: tuple[Blocked, ...], keys: str, prev: Blocked | None, place: Placement,
          **attrs) -> Blocked:
    """One `decode_attention` link: q [B, heads x D] ('bn'), k and v (`keys`: a column's 'rbk' or the new
    rows' 'bk'), lengths [B], and the partial so far [B, heads x D + heads] ('bp'); a partial unless final."""
    signature = f"bn,{keys},{keys},b" + ("" if prev is None else ",bp")
    operands += () if prev is None else (prev,)
    result = "bp" if attrs.get("final") is False else "bn"
    return prog.map("decode_attention", *operands, name=name, signature=f"{signature}->{result}", place=place, **attrs)


def head_blocks(config: LlamaConfig) -> list[tuple[int, int]]:
    """(first row, end) of each LM head block: `default_vocab_block` rows each, the last one shorter."""
    rows = default_vocab_block(config)
    return [(start, min(start + rows, config.vocab_size)) for start in range(0, config.vocab_size, rows)]

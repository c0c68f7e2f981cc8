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
Per layer: RMSNorm, q/k/v as one einsum each over the B rows (plus the bias, qwen2), RoPE; then one
`decode_attention` link per cache column (the whole batch, each row over its own sequence's keys),
closed by the link over each sequence's own new key (the final one); the o projection, the residual,
the MLP. With mistral's sliding window each row sees only keys inside it, and columns wholly behind
every sequence's window are neither inputs nor links. Then the final RMSNorm and the LM head.
Outputs: the logits in blocks of vocabulary rows, `logits[j]` [B, rows of block j] in the model dtype (the
LM head is cut like every other large matmul: `head_blocks`, block j on GPU j % gpus), and per layer `k_new.{l}` / `v_new.{l}` [B, kv_width],
the rows the host appends to the cache. Over `gpus`, layer l runs on GPU l * gpus // L (a pipeline,
as the prefill's `layers` placement) and the final norm on the last; the stream, RoPE rows and lengths are moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.graph import default_vocab_block
from frontend.workloads.llama.kv_cache import KvCache
from frontend.workloads.llama.rope import inverse_frequencies
from frontend.workloads.llama.weights import head_name
from turnip_ir.errors import InputError
from turnip_ir.taskgraph import TaskGraph, Tensor

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
    graph: TaskGraph
    columns: list[tuple[int, int]]
    """(first position, rows) of each cache column it reads."""
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """What depends only on the graph (shared by the steps `dataclasses.replace` re-aims at new lengths):
    the cache inputs, and the weight inputs of a `feed(..., fixed_weights=True)`."""

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
            gathered = (weights, {node.id: _weight(weights, node.id, self.config, dtype) for node in self.graph.nodes.values()
                                  if node.op == "input" and node.id not in arrays and not node.id.startswith("kv.")})
            if fixed_weights:
                self.memo["weights"] = gathered
        arrays.update(gathered[1])
        arrays["kv.lengths"] = np.asarray(self.cache_lengths, np.float32)
        arrays.update(self.column_inputs(cache) if columns is None else columns)
        return arrays

    def column_inputs(self, cache: KvCache) -> dict[str, np.ndarray]:
        """The cache's column inputs, views (`KvCache.column`: the same objects for the same rows)."""
        return {name: cache.column(layer, which, j, rows) for name, (layer, which, j, rows) in self.cache_inputs().items()}

    def cache_inputs(self) -> dict[str, tuple[int, str, int, int]]:
        """Each cache column input's id -> (layer, "k" or "v", column index, rows) (one dict, kept: not to be changed)."""
        inputs = self.memo.get("cache_inputs")
        if inputs is None:
            inputs = self.memo["cache_inputs"] = {
                f"kv.{layer}.{which}[{start // self.kv_block}]": (layer, which, start // self.kv_block, rows)
                for layer in range(self.config.num_hidden_layers) for which in "kv" for start, rows in self.columns}
        return inputs

    def logits(self, outputs: Mapping[str, np.ndarray], dtype=np.float64) -> np.ndarray:
        """[B, vocab] from the head's blocks, a copy in `dtype` (None: the model's; the outputs may be the
        backend's memory, reused at its next run)."""
        blocks = [outputs[f"logits[{j}]"] for j in range(len(head_blocks(self.config)))]
        return np.concatenate(blocks, axis=1, dtype=dtype)

    def new_kv(self, outputs: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, this step's (k, v) rows [B, kv_width], k after RoPE."""
        return [tuple(outputs[name] for name in self.new_kv_names(l)) for l in range(self.config.num_hidden_layers)]

    @staticmethod
    def new_kv_names(layer: int) -> tuple[str, str]:
        """The output ids of a layer's new (k, v) rows."""
        return f"k_new.{layer}", f"v_new.{layer}"


def head_block_rows(config: LlamaConfig, task: str) -> tuple[int, int] | None:
    """The rows of the LM head that input `task` holds, when it is one of the head's blocks; else None."""
    prefix = head_name(config) + "["
    if not task.startswith(prefix):
        return None
    for j, rows in enumerate(head_blocks(config)):
        if task == head_block_id(config, j):
            return rows
    return None


def _weight(weights: Mapping[str, np.ndarray], task: str, config: LlamaConfig, dtype) -> np.ndarray:
    """A weight input's value: the named weight, or a block of the LM head's rows (a view: rows of a
    C-contiguous array lie together)."""
    rows = head_block_rows(config, task)
    if rows is not None:
        return np.ascontiguousarray(weights[head_name(config)][rows[0]:rows[1]], dtype=dtype)
    return np.ascontiguousarray(weights[task], dtype=dtype)


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


def build_decode_step(config: LlamaConfig, cache_lengths: Sequence[int], gpus: int = 1, kv_block: int = KV_BLOCK) -> DecodeStep:
    """The decode step of len(cache_lengths) sequences, sequence b having cache_lengths[b] tokens cached."""
    lengths = tuple(cache_lengths)
    if not lengths:
        raise InputError("decode step: the batch is empty")
    for what, value, least in (("gpus", gpus, 1), ("kv_block", kv_block, 1), *((f"cache length {b}", n, 0) for b, n in enumerate(lengths))):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InputError(f"decode step: {what} must be an integer >= {least}, got {value!r}")
    graph = TaskGraph(gpus)
    columns = cache_columns(lengths, int(kv_block), config.sliding_window)
    builder = _Builder(config, graph, lengths, int(kv_block), columns)
    x = builder.graph.input((len(lengths), config.hidden_size), config.dtype, device=0, id="hidden")
    for layer in range(config.num_hidden_layers):
        x = builder.layer(x, layer)
    builder.head(x)
    return DecodeStep(config, lengths, int(kv_block), graph, columns)


class _Builder:
    """Builds one step's tasks, each layer on its pipeline GPU, moving tensors to it once."""

    def __init__(self, config: LlamaConfig, graph: TaskGraph, lengths: tuple[int, ...], kv_block: int, columns: list[tuple[int, int]]):
        self.config, self.graph, self.lengths, self.kv_block, self.columns = config, graph, lengths, kv_block, columns
        self.moves: dict[tuple[str, int], Tensor] = {}
        shape = (len(lengths), config.head_dim)
        self.rope = [graph.input(shape, config.dtype, device=0, id=f"rope.{f}") for f in ("cos", "sin")]
        self.lengths_input = graph.input((len(lengths),), "float32", device=0, id="kv.lengths")
        self.gpu = 0

    def on(self, t: Tensor) -> Tensor:
        """`t` on the current GPU, moved there once."""
        if t.device == self.gpu:
            return t
        key = (t.id, self.gpu)
        if key not in self.moves:
            self.moves[key] = self.graph.move(t, self.gpu, id=f"{t.id}.to{self.gpu}")
        return self.moves[key]

    def weight(self, name: str, shape: tuple[int, ...]) -> Tensor:
        return self.graph.input(shape, self.config.dtype, device=self.gpu, id=name)

    def kernel(self, name: str, *xs: Tensor, id: str, **attrs) -> Tensor:
        return self.graph.kernel(name, *(self.on(x) for x in xs), device=self.gpu, id=id, **attrs)

    def project(self, h: Tensor, name: str, shape: tuple[int, int], id: str) -> Tensor:
        return self.kernel("einsum", h, self.weight(name, shape), id=id, equation="ti,oi->to")

    def project_bias(self, h: Tensor, name: str, shape: tuple[int, int], id: str) -> Tensor:
        """`name`.weight's projection, plus `name`.bias broadcast over the rows when the family has one (qwen2)."""
        if not self.config.qkv_bias:
            return self.project(h, name + ".weight", shape, id)
        product = self.project(h, name + ".weight", shape, id + ".w")
        return self.kernel("add", product, self.weight(name + ".bias", shape[:1]), id=id)

    def layer(self, x: Tensor, layer: int) -> Tensor:
        """One decoder layer on the residual stream `x` [B, hidden]; returns the new stream."""
        c = self.config
        self.gpu = layer * self.graph.devices // c.num_hidden_layers
        p, n = f"model.layers.{layer}.", f"l{layer}."
        hidden, inner = c.hidden_size, c.intermediate_size
        q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        h = self.kernel("rmsnorm", x, self.weight(p + "input_layernorm.weight", (hidden,)), id=n + "attn_norm", eps=c.rms_norm_eps)
        q = self.project_bias(h, p + "self_attn.q_proj", (q_width, hidden), n + "q")
        k = self.project_bias(h, p + "self_attn.k_proj", (kv_width, hidden), n + "k")
        k_new, v_new = DecodeStep.new_kv_names(layer)
        v = self.project_bias(h, p + "self_attn.v_proj", (kv_width, hidden), v_new)
        q = self.kernel("rope", q, *self.rope, id=n + "q_rope")
        k = self.kernel("rope", k, *self.rope, id=k_new)
        self.graph.output(k, v)
        a = self.attention(q, k, v, layer)
        o = self.project(a, p + "self_attn.o_proj.weight", (hidden, q_width), n + "o")
        x = self.kernel("add", x, o, id=n + "attn_res")
        h = self.kernel("rmsnorm", x, self.weight(p + "post_attention_layernorm.weight", (hidden,)), id=n + "mlp_norm", eps=c.rms_norm_eps)
        gate = self.project(h, p + "mlp.gate_proj.weight", (inner, hidden), n + "gate")
        up = self.project(h, p + "mlp.up_proj.weight", (inner, hidden), n + "up")
        act = self.kernel("swiglu", gate, up, id=n + "act")
        down = self.project(act, p + "mlp.down_proj.weight", (hidden, inner), n + "down")
        return self.kernel("add", x, down, id=n + "mlp_res")

    def attention(self, q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
        """One decode_attention link per cache column for the whole batch, closed by the sequences' own keys."""
        c, n = self.config, f"l{layer}."
        attrs = {"heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads}
        if c.sliding_window is not None:
            attrs["window"] = c.sliding_window
        kv_width = c.num_key_value_heads * c.head_dim
        lengths = self.on(self.lengths_input)
        prev = None
        for start, rows in self.columns:
            j = start // self.kv_block
            kc, vc = (self.graph.input((rows, len(self.lengths), kv_width), c.dtype, device=self.gpu, id=f"kv.{layer}.{which}[{j}]") for which in "kv")
            operands = (q, kc, vc, lengths) if prev is None else (q, kc, vc, lengths, prev)
            prev = self.kernel("decode_attention", *operands, id=f"{n}attn.{j}", final=False, start=start, **attrs)
        operands = (q, k, v, lengths) if prev is None else (q, k, v, lengths, prev)
        return self.kernel("decode_attention", *operands, id=n + "attn", own=True, **attrs)

    def head(self, x: Tensor) -> None:
        """The final RMSNorm on the last GPU, then the LM head in blocks of vocabulary rows (`head_blocks`),
        block j on GPU j % gpus: `logits[j]` [B, rows of block j]."""
        c = self.config
        self.gpu = self.graph.devices - 1
        h = self.kernel("rmsnorm", x, self.weight("model.norm.weight", (c.hidden_size,)), id="final_norm", eps=c.rms_norm_eps)
        for j, (start, stop) in enumerate(head_blocks(c)):
            self.gpu = j % self.graph.devices
            block = self.graph.input((stop - start, c.hidden_size), c.dtype, device=self.gpu, id=head_block_id(c, j))
            self.graph.output(self.kernel("einsum", h, block, id=f"logits[{j}]", equation="ti,oi->to"))


def head_blocks(config: LlamaConfig) -> list[tuple[int, int]]:
    """(first row, end) of each LM head block: `default_vocab_block` rows each, the last one shorter."""
    rows = default_vocab_block(config)
    return [(start, min(start + rows, config.vocab_size)) for start in range(0, config.vocab_size, rows)]


def head_block_id(config: LlamaConfig, j: int) -> str:
    """The input id of LM head block j: the head's name and the block, as `Program` names blocks."""
    return f"{head_name(config)}[{j},0]"

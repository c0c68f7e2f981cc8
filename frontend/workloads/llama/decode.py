"""One LLaMA decode step as a taskgraph: B sequences, one new token each, against their KV caches.

Inputs: `hidden` [B, hidden] (the new tokens' embeddings), `rope.cos` / `rope.sin` [B, head_dim] (row b
at sequence b's own position), the weights by their Hugging Face names (the prefill graph's names, so
one mapping feeds both), and per layer l and sequence b the cache `kv.{l}.{b}.k` / `.v` [cache_len,
kv_width], cut into blocks of at most `kv_block` tokens (`kv.{l}.{b}.k[j]` when there are several).
Per layer: RMSNorm, q/k/v as one einsum each over the B rows (plus the bias, qwen2), RoPE; then per
sequence the rows of q, k and v (`rows`), an attention chain over the cache blocks (non-final links)
closed by the new token's own key (the final link; no causal mask: the one query sees every key; with
mistral's sliding window, cache blocks wholly behind it are neither inputs nor links, and a block it
covers in part is masked exactly by the kernel's `window` and `offset`), the B results stacked (`concat`),
the o projection, the residual, the MLP. Then the final RMSNorm and the LM head.
Outputs: `logits` [B, vocab] in the model dtype, and per layer `k_new.{l}` / `v_new.{l}` [B, kv_width],
the rows the host appends to the caches. Over `gpus`, layer l runs on GPU l * gpus // L (a pipeline,
as the prefill's `layers` placement) and the head on the last; the stream and RoPE rows are moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.rope import inverse_frequencies
from frontend.workloads.llama.weights import head_name
from turnip_ir.errors import InputError
from turnip_ir.taskgraph import TaskGraph, Tensor

KV_BLOCK = 1024
"""Default cache tokens per attention link: a long cache is streamed block by block."""


@dataclass
class DecodeStep:
    """A built decode step and how to feed it and read it."""

    config: LlamaConfig
    cache_lengths: tuple[int, ...]
    kv_block: int
    graph: TaskGraph

    @property
    def batch(self) -> int:
        return len(self.cache_lengths)

    def feed(self, weights: Mapping[str, np.ndarray], hidden: np.ndarray,
             caches: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]]) -> dict[str, np.ndarray]:
        """Inputs by taskgraph id: `hidden` [B, hidden], caches[b][l] = (k, v) [cache_len, kv_width]."""
        dtype = self.config.dtype
        cos, sin = rope_rows(self.config, self.cache_lengths)
        arrays = {"hidden": hidden, "rope.cos": cos, "rope.sin": sin}
        for node in self.graph.nodes.values():
            if node.op == "input" and node.id not in arrays and not node.id.startswith("kv."):
                arrays[node.id] = weights[node.id]
        for b, length in enumerate(self.cache_lengths):
            for layer in range(self.config.num_hidden_layers):
                for which, cache in zip("kv", caches[b][layer]):
                    if cache.shape[0] != length:
                        raise InputError(f"sequence {b}: layer {layer} {which} cache has {cache.shape[0]} rows, the step expects {length}")
                    for block_id, (start, stop) in cache_blocks(f"kv.{layer}.{b}.{which}", length, self.kv_block, self.config.sliding_window):
                        arrays[block_id] = cache[start:stop]
        return {name: np.ascontiguousarray(value, dtype=dtype) for name, value in arrays.items()}

    def cache_rows(self) -> dict[str, tuple[int, int, int]]:
        """Each cache block input's id -> (sequence, first row, end row) of its sequence's cache: the
        rows it holds (a session keeps a block on the GPU between steps while these stay the same)."""
        rows = {}
        for b, length in enumerate(self.cache_lengths):
            for layer in range(self.config.num_hidden_layers):
                for which in "kv":
                    for block_id, (start, stop) in cache_blocks(f"kv.{layer}.{b}.{which}", length, self.kv_block, self.config.sliding_window):
                        rows[block_id] = (b, start, stop)
        return rows

    def logits(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """[B, vocab] in float64."""
        return np.asarray(outputs["logits"], dtype=np.float64)

    def new_kv(self, outputs: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, this step's (k, v) rows [B, kv_width], k after RoPE."""
        return [(outputs[f"k_new.{l}"], outputs[f"v_new.{l}"]) for l in range(self.config.num_hidden_layers)]


def rope_rows(config: LlamaConfig, positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [B, head_dim]: row b at position positions[b], with the frequencies of a sequence of
    positions[b] + 1 tokens (only `dynamic` RoPE depends on the length)."""
    rows = []
    for position in positions:
        angles = position * inverse_frequencies(config, position + 1)
        rows.append(np.concatenate([angles, angles]))
    both = np.array(rows, dtype=np.float64).reshape(len(positions), config.head_dim)
    return np.cos(both), np.sin(both)


def cache_blocks(name: str, length: int, kv_block: int, window: int | None = None) -> list[tuple[str, tuple[int, int]]]:
    """The block ids and row ranges of a cache of `length` rows cut into blocks of at most `kv_block`;
    with a sliding `window`, only the blocks the new token (at position `length`) sees some key of."""
    starts = list(range(0, length, kv_block))
    if len(starts) == 1:
        blocks = [(name, (0, length))]
    else:
        blocks = [(f"{name}[{j}]", (start, min(start + kv_block, length))) for j, start in enumerate(starts)]
    if window is None:
        return blocks
    return [(block_id, (start, stop)) for block_id, (start, stop) in blocks if stop - 1 > length - window]


def build_decode_step(config: LlamaConfig, cache_lengths: Sequence[int], gpus: int = 1, kv_block: int = KV_BLOCK) -> DecodeStep:
    """The decode step of len(cache_lengths) sequences, sequence b having cache_lengths[b] tokens cached."""
    lengths = tuple(cache_lengths)
    if not lengths:
        raise InputError("decode step: the batch is empty")
    for what, value, least in (("gpus", gpus, 1), ("kv_block", kv_block, 1), *((f"cache length {b}", n, 0) for b, n in enumerate(lengths))):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InputError(f"decode step: {what} must be an integer >= {least}, got {value!r}")
    graph = TaskGraph(gpus)
    builder = _Builder(config, graph, lengths, int(kv_block))
    x = builder.graph.input((len(lengths), config.hidden_size), config.dtype, device=0, id="hidden")
    for layer in range(config.num_hidden_layers):
        x = builder.layer(x, layer)
    builder.head(x)
    return DecodeStep(config, lengths, int(kv_block), graph)


class _Builder:
    """Builds one step's tasks, each layer on its pipeline GPU, moving tensors to it once."""

    def __init__(self, config: LlamaConfig, graph: TaskGraph, lengths: tuple[int, ...], kv_block: int):
        self.config, self.graph, self.lengths, self.kv_block = config, graph, lengths, kv_block
        self.moves: dict[tuple[str, int], Tensor] = {}
        shape = (len(lengths), config.head_dim)
        self.rope = [graph.input(shape, config.dtype, device=0, id=f"rope.{f}") for f in ("cos", "sin")]
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
        v = self.project_bias(h, p + "self_attn.v_proj", (kv_width, hidden), f"v_new.{layer}")
        q = self.kernel("rope", q, *self.rope, id=n + "q_rope")
        k = self.kernel("rope", k, *self.rope, id=f"k_new.{layer}")
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
        """Per sequence: its rows, a chain over its cache blocks closed by its own new key; stacked back."""
        c, n, batch = self.config, f"l{layer}.", len(self.lengths)
        heads = {"heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads}
        kv_width = c.num_key_value_heads * c.head_dim
        rows = []
        for b, length in enumerate(self.lengths):
            q_b, k_b, v_b = (t if batch == 1 else self.kernel("rows", t, id=f"{t.id}.{b}", start=b, stop=b + 1) for t in (q, k, v))
            prev = None
            window = c.sliding_window
            blocks = zip(cache_blocks(f"kv.{layer}.{b}.k", length, self.kv_block, window),
                         cache_blocks(f"kv.{layer}.{b}.v", length, self.kv_block, window))
            for j, ((k_id, (start, stop)), (v_id, _)) in enumerate(blocks):
                kc = self.graph.input((stop - start, kv_width), c.dtype, device=self.gpu, id=k_id)
                vc = self.graph.input((stop - start, kv_width), c.dtype, device=self.gpu, id=v_id)
                operands = (q_b, kc, vc) if prev is None else (q_b, kc, vc, prev)
                hidden = window is not None and start <= length - window  # some row of the block is behind the window
                masked = {"window": window, "offset": start - length} if hidden else {}
                prev = self.kernel("attention", *operands, id=f"{n}attn.{b}.{j}", final=False, **heads, **masked)
            operands = (q_b, k_b, v_b) if prev is None else (q_b, k_b, v_b, prev)
            rows.append(self.kernel("attention", *operands, id=f"{n}attn.{b}", **heads))
        return rows[0] if batch == 1 else self.kernel("concat", *rows, id=n + "attn")

    def head(self, x: Tensor) -> None:
        """The final RMSNorm and the LM head on the last GPU: `logits` [B, vocab]."""
        c = self.config
        self.gpu = self.graph.devices - 1
        h = self.kernel("rmsnorm", x, self.weight("model.norm.weight", (c.hidden_size,)), id="final_norm", eps=c.rms_norm_eps)
        logits = self.project(h, head_name(c), (c.vocab_size, c.hidden_size), "logits")
        self.graph.output(logits)

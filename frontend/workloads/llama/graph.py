"""The LLaMA prefill taskgraph: Hugging Face `LlamaModel` semantics, the sequence cut into token blocks.

Per layer, for every token block: RMSNorm, q/k/v projections (`ti,oi->to` against [out, in] weights;
qwen2 adds each one's bias vector), RoPE on q and k (cos/sin tables are inputs cut like the tokens),
causal attention as chains of (query block, key block) tasks below the diagonal (mistral: only the key
blocks its sliding window reaches), the o projection and the residual add; then RMSNorm, gate and up
projections, SwiGLU, the down projection and the residual add. A final RMSNorm gives
`LlamaModel(...).last_hidden_state[0]`. Activations are [tokens, features] with heads side by side.
The layer (`_layer`) is the model's one description: the decode step (decode.py) and the training step
(train.py) lower it too, through its hooks (how it attends, how it projects, which k and v it outputs).
Tasks run layer by layer. Inside a layer (`layer_order`):
- `blocks` (the default): token block by token block through the whole layer (`Program.order_by`), so
  only the k/v blocks later queries need stay live, not whole activations. Every block reads all nine
  of the layer's weights, so a budget that cannot hold them beside the layer's k and v reloads them.
- `halves`: every block through the attention half (norm, q/k/v, RoPE, attention, o and the residual),
  then every block through the MLP half. The attention half holds four weights and the layer's k and v,
  the MLP half three weights and no k or v: under a tight budget each weight crosses once a layer, at
  the price of the residual stream of every block waiting in between.
`query_group` M > 1 runs M token blocks at a time (under `halves`, through the attention half only), their
attention chains interleaved key block by key block (frontend/attention.py): where a layer's k and v
cannot stay on the GPU (128k tokens of 7B: 2 GiB a layer) each reloaded k/v block serves M queries.

Packed prompts (`sequences`: their lengths): several prompts packed end to end along the tokens go through
one graph, so each weight is read once per block of the batch rather than once per prompt. The token
blocks are cut by `partition.split_packed` (each holds whole prompts or a piece of one), attention keeps
each prompt to its own keys (frontend/attention.py: the links follow the prompts, a block of several is
one causal task with `segments`), and RoPE positions restart at 0 in every prompt (its own tables, so
`dynamic` scaling follows its own length). Every other op is per token and cannot mix prompts. Each
prompt's hidden states and k/v rows equal those of its own prefill; `kv_pieces` says which rows of which
k/v output task are which prompt's, for writing them straight into a KV cache.

Placements over `gpus`:
- `sequence`: token block b on GPU b % gpus; each weight has a home GPU in turn (loaded over that GPU's host
  link, so the links share the traffic) and is moved over NVLink to every other GPU that reads it;
- `zigzag`: token blocks dealt out in a snake, 0, 1, .., g-1, g-1, .., 1, 0, 0, 1, ..: causal attention makes
  later blocks costlier (block b attends to b + 1 key blocks), and the snake pairs cheap blocks with
  costly ones on every GPU, where `sequence` gives the last GPU the most work;
- `layers`: layer l on GPU l * gpus // L (a pipeline), activations moved between stages;
- `heads`: each GPU owns gpus-th of the heads (and of the FFN width): q/k/v/gate/up are cut by rows,
  o/down by columns, whose partial products are summed by add trees on GPU 0, where the residual
  stream and the norms live (tensor parallelism; gpus must divide the kv head count).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from turnip_ir.errors import InputError
from frontend import Blocked, Program, follow, given, on, split_block
from frontend.partition import split_packed, starts
from frontend.placement import Placement
from turnip_ir.taskgraph import TaskGraph
from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.rope import packed_rope_tables
from frontend.workloads.llama.weights import embed

PLACEMENTS = ("sequence", "zigzag", "layers", "heads")
LAYER_ORDERS = ("blocks", "halves")
BLOCK_7B = 4096
"""Tokens per block from hidden 1024 up: a 4096-token block makes each 7B projection a 137 GFLOP GEMM and
each attention task ~275 GFLOP, 5-10x a ~50 us dispatch; smaller models get 4 blocks (to exercise chains)."""


def default_block(config: LlamaConfig, tokens: int) -> int:
    if config.hidden_size >= 1024:
        return min(tokens, BLOCK_7B)
    return max(1, -(-tokens // 4))


VOCAB_BLOCK = 8192
"""Vocabulary rows per LM head block from hidden 1024 up (7B's 32000 in 4 blocks of 64 MiB): the head is cut
like every other large matmul, so it need not fit one GPU whole and spreads over GPUs."""


def default_vocab_block(config: LlamaConfig) -> int:
    """Rows of the LM head per block: VOCAB_BLOCK from hidden 1024 up; smaller models get 2 blocks (to
    exercise the cut)."""
    return VOCAB_BLOCK if config.hidden_size >= 1024 else max(1, -(-config.vocab_size // 2))


@dataclass(frozen=True)
class Plan:
    """Where each kind of op runs: `local` (norms, residuals), `split` (q/k/v/gate/up), `attention`,
    `reduce` (o/down), and how many head groups the projections are cut into."""

    local: Placement
    split: Placement
    attention: Placement
    reduce: Placement
    groups: int = 1
    spread_weights: bool = False
    """Give each weight its own home GPU in turn (it is loaded over that GPU's host link, then moved over
    NVLink to the others), instead of the GPU of its first reader (GPU 0 for every weight)."""


def zigzag(block: int, gpus: int) -> int:
    """The GPU of token block `block` when blocks are dealt out in a snake over `gpus` GPUs."""
    turn, position = divmod(block, gpus)
    return position if turn % 2 == 0 else gpus - 1 - position


def plan(config: LlamaConfig, placement: str, gpus: int, layer: int) -> Plan:
    """The placement of layer `layer` (the final norm is layer L) under a named strategy."""
    if placement == "sequence":
        by_block = given(lambda c: c["t"] % gpus)
        return Plan(by_block, by_block, by_block, by_block, spread_weights=True)
    if placement == "zigzag":
        snake = given(lambda c: zigzag(c["t"], gpus))
        return Plan(snake, snake, snake, snake, spread_weights=True)
    if placement == "layers":
        stage = on(min(layer, config.num_hidden_layers - 1) * gpus // config.num_hidden_layers)
        return Plan(stage, stage, stage, stage)
    if placement == "heads":
        return Plan(follow, given(lambda c: c["o"]), follow, given(lambda c: c["i"]), gpus)
    raise InputError(f"unknown llama placement '{placement}' (known: {', '.join(PLACEMENTS)})")


ACTIVATIONS = ("hidden", "rope.cos", "rope.sin")
"""The inputs a prefill is fed besides its weights: the embedded tokens and the RoPE tables."""


class KvPiece(NamedTuple):
    """Rows of one k or v output block that belong to one sequence: the block's rows [row_start, row_stop)
    are that sequence's positions first_position.. in layer `layer`, and the block holds the cache's
    columns [columns[0], columns[1]) (all kv_heads * head_dim of them, but under the `heads` placement)."""

    row_start: int
    row_stop: int
    sequence: int
    layer: int
    kind: str
    """"k" (after RoPE) or "v"."""
    first_position: int
    columns: tuple[int, int]


@dataclass
class LlamaGraph:
    """A built prefill: the frontend program (inputs, outputs, taskgraph) and how to feed and read it."""

    config: LlamaConfig
    tokens: int
    block: int
    program: Program
    hidden_states: Blocked | None
    """The final hidden states; None for a prefill built with `hidden=False`."""
    kv: list[tuple[Blocked, Blocked]] = field(default_factory=list)
    """Per layer, the post-RoPE k and the v as outputs (`build_llama(kv_outputs=True)`), else empty."""
    layer_order: str = "blocks"
    query_group: int = 1
    sequences: tuple[int, ...] = ()
    """The lengths of the sequences packed end to end (`build_llama(sequences=)`), else (tokens,)."""

    @property
    def graph(self) -> TaskGraph:
        return self.program.graph

    @property
    def sequence_starts(self) -> tuple[int, ...]:
        """The first token of each sequence in the packed tokens."""
        return starts(self.sequences)

    @property
    def activation_ids(self) -> set[str]:
        """The taskgraph ids of the inputs `feed` makes from the tokens (ACTIVATIONS); the rest are weights."""
        return self.program.input_ids(name for name in ACTIVATIONS if name in self.program.inputs)

    def feed(self, weights: Mapping[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
        """The run's inputs by taskgraph id: embedded tokens (every sequence's, end to end), RoPE tables
        (positions from 0 in each sequence) and weight blocks. Weights that
        offer `lazy(name)` (weights.py: a checkpoint, random ones) are fed as lazy inputs, read or drawn
        only when the backend writes them into its buffers."""
        if len(ids) != self.tokens:
            raise InputError(f"{len(ids)} token ids given, the graph was built for {self.tokens}")
        cos, sin = packed_rope_tables(self.config, self.sequences)
        extra = dict(zip(ACTIVATIONS, (embed(weights, ids, self.config), cos, sin)))
        lazy = {name: weights.lazy(name) for name in weights} if callable(getattr(weights, "lazy", None)) else weights
        return self.program.feed(ChainMap(extra, lazy))

    def gather(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The final hidden states [T, hidden] from a run's outputs."""
        return self.program.gather(self.hidden_states, outputs)

    def gather_kv(self, outputs: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, k and v [T, kv_heads * head_dim] (k after RoPE) from a run's outputs: the KV cache."""
        return [(self.program.gather(k, outputs), self.program.gather(v, outputs)) for k, v in self.kv]

    def gather_sequences(self, outputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Per sequence, its final hidden states [length, hidden] (views of `gather`'s whole array)."""
        return self._by_sequence(self.gather(outputs))

    def gather_kv_sequences(self, outputs: Mapping[str, np.ndarray]) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """Per sequence, per layer, its k and v [length, kv_heads * head_dim] (views of `gather_kv`'s)."""
        layers = [(self._by_sequence(k), self._by_sequence(v)) for k, v in self.gather_kv(outputs)]
        return [[(k[s], v[s]) for k, v in layers] for s in range(len(self.sequences))]

    def _by_sequence(self, whole: np.ndarray) -> list[np.ndarray]:
        return [whole[start : start + length] for start, length in zip(self.sequence_starts, self.sequences)]

    def kv_pieces(self) -> dict[str, list[KvPiece]]:
        """For every k and v output task (`kv_outputs`), the pieces of its rows that belong to each sequence,
        in row order: what to write where in each sequence's KV cache (`execute(outputs_into=)`)."""
        spans = list(zip(self.sequence_starts, (*self.sequence_starts[1:], self.tokens)))
        pieces: dict[str, list[KvPiece]] = {}
        for layer, pair in enumerate(self.kv):
            for kind, x in zip("kv", pair):
                for coords, block in x.blocks.items():
                    rows, columns = x.slices(coords)
                    pieces[block.id] = []
                    for s, (begin, end) in enumerate(spans):
                        first, last = max(rows.start, begin), min(rows.stop, end)
                        if first < last:
                            piece = KvPiece(first - rows.start, last - rows.start, s, layer, kind, first - begin, (columns.start, columns.stop))
                            pieces[block.id].append(piece)
        return pieces


Projection = Callable[[Program, Blocked, str, Blocked, Placement], Blocked]
"""`(prog, h, name, weight, place) -> h W^T` named `name`: how `_layer` projects (`linear`, or a
training step's LoRA projection, frontend/workloads/llama/train.py)."""
Attention = Callable[[Program, Blocked, Blocked, Blocked, str, Placement], Blocked]
"""`(prog, q, k, v, name, place) -> the attention output` [tokens, heads x head_dim] named `name`: how
`_layer` attends (`causal`, or a decode step's attention over its KV cache, frontend/workloads/llama/decode.py)."""


def linear(prog: Program, h: Blocked, name: str, w: Blocked, place: Placement) -> Blocked:
    """h W^T against an [out, in] weight."""
    return prog.einsum("ti,oi->to", h, w, name=name, place=place)


def causal(config: LlamaConfig, sequences: tuple[int, ...] | None = None) -> Attention:
    """Blocked causal attention among the tokens (a prefill's, a training step's), within mistral's window,
    kept inside each of `sequences` (lengths of prompts packed end to end, or a batch side by side)."""

    def attend(prog: Program, q: Blocked, k: Blocked, v: Blocked, name: str, place: Placement) -> Blocked:
        return prog.attention(q, k, v, name=name, heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                              place=place, window=config.sliding_window, sequences=sequences)

    return attend


def build_llama(config: LlamaConfig, tokens: int, block: int | None = None, gpus: int = 1,
                placement: str = "sequence", kv_outputs: bool = False, layer_order: str = "blocks",
                query_group: int = 1, sequences: Sequence[int] | None = None, hidden: bool = True,
                projection: Projection = linear) -> LlamaGraph:
    """The prefill of `tokens` tokens in blocks of `block` (default: `default_block`) over `gpus` GPUs;
    with `kv_outputs`, each layer's k (after RoPE) and v blocks are outputs too (`LlamaGraph.gather_kv`).
    `layer_order` and `query_group` order the tasks inside a layer (the module's docstring); they change
    the plan a budget gets, not what is computed. `sequences` (positive lengths adding up to `tokens`)
    packs that many prompts end to end (the module's docstring); None is one sequence of `tokens`.
    `hidden=False` (with `kv_outputs`: a KV cache's prefill) leaves out the final hidden states and all the
    last layer needs only for them (its q, attention, o and MLP, and the final norm). `projection` makes
    the layers' projections (`_layer`'s hook: a LoRA adapter's, frontend/workloads/llama/train.py).

    A block larger than `tokens` is clamped to it (one block), and `LlamaGraph.block` is the block used."""
    block = default_block(config, tokens) if block is None else block
    for what, value in (("tokens", tokens), ("block", block), ("gpus", gpus), ("query_group", query_group)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"llama: {what} must be a positive integer, got {value!r}")
    if layer_order not in LAYER_ORDERS:
        raise InputError(f"unknown llama layer order '{layer_order}' (known: {', '.join(LAYER_ORDERS)})")
    lengths = _sequences(sequences, tokens)
    if not hidden and not kv_outputs:
        raise InputError("llama: a prefill without its hidden states must output k and v (kv_outputs)")
    block = min(block, tokens)
    if placement == "heads" and config.num_key_value_heads % gpus:
        raise InputError(f"llama: placement 'heads' needs gpus ({gpus}) to divide the kv heads ({config.num_key_value_heads})")
    plan(config, placement, gpus, 0)  # an unknown name fails before anything is built
    prog = Program(gpus, order_by=("t",))
    cut = (split_block(tokens, block) if sequences is None else split_packed(lengths, block),)
    x = prog.input("hidden", (tokens, config.hidden_size), config.dtype, cut)
    rope = [prog.input(f"rope.{f}", (tokens, config.head_dim), config.dtype, cut) for f in ("cos", "sin")]
    kv: list[tuple[Blocked, Blocked]] | None = [] if kv_outputs else None
    last = config.num_hidden_layers - 1
    for layer in range(config.num_hidden_layers):
        prog.phase, prog.group = 2 * layer, query_group  # the MLP half: 2 * layer + 1 under `halves`
        x = _layer(prog, config, x, rope, layer, plan(config, placement, gpus, layer), kv, layer_order == "halves", projection,
                   attention=causal(config, None if sequences is None else lengths), kv_only=not hidden and layer == last)
    out = None
    if hidden:
        prog.phase, prog.group = 2 * config.num_hidden_layers, 1
        final = plan(config, placement, gpus, config.num_hidden_layers)
        norm = prog.input("model.norm.weight", (config.hidden_size,), config.dtype)
        out = prog.map("rmsnorm", x, norm, name="hidden_states", signature="th,h->th", eps=config.rms_norm_eps, place=final.local)
        prog.output(out)
    prog.taskgraph()
    return LlamaGraph(config, tokens, block, prog, out, kv or [], layer_order, query_group, lengths)


def _sequences(sequences: Sequence[int] | None, tokens: int) -> tuple[int, ...]:
    """The checked lengths of the packed sequences; (tokens,) for None."""
    if sequences is None:
        return (tokens,)
    lengths = tuple(sequences)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 for n in lengths):
        raise InputError(f"llama: sequences must be positive integer lengths, got {list(lengths)}")
    if sum(lengths) != tokens:
        raise InputError(f"llama: sequences {list(lengths)} add up to {sum(lengths)} tokens, not {tokens}")
    return tuple(int(n) for n in lengths)


def _layer(prog: Program, config: LlamaConfig, x: Blocked, rope: list[Blocked], layer: int, where: Plan,
           kv: list[tuple[Blocked, Blocked]] | None = None, halves: bool = False, projection: Projection = linear,
           attention: Attention | None = None, kv_only: bool = False) -> Blocked | None:
    """One decoder layer on the residual stream `x`; returns the new stream. The one description of the
    layer, lowered for the prefill, the decode step and training; what differs are the hooks:
    - `kv`: a list, and the layer's post-RoPE k and its v become outputs, appended to it (a prefill's
      cache blocks, a decode step's new rows); `kv_only` stops there (a cache's last layer: no q,
      attention or MLP, and no stream returned);
    - `projection` makes the seven projections (`linear`; a training step's LoRA);
    - `attention` attends (None: `causal` over one sequence; a decode step's over its KV cache).
    With `halves`, the MLP half is keyed after the attention half of every block (the next phase) and
    block by block."""
    p, n = f"model.layers.{layer}.", f"l{layer}."
    hidden, dtype, groups = config.hidden_size, config.dtype, where.groups
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim

    homes = iter(range(layer * 9, layer * 9 + 9))  # nine weights a layer, each its own home GPU in turn

    def weight(name: str, shape: tuple[int, ...], splits=()) -> Blocked:
        home = next(homes) % prog.graph.devices
        return prog.input(p + name, shape, dtype, splits, place=on(home) if where.spread_weights else None)

    def project(h: Blocked, name: str, w: Blocked, place: Placement) -> Blocked:
        return projection(prog, h, n + name, w, place)

    h = prog.map("rmsnorm", x, weight("input_layernorm.weight", (hidden,)), name=n + "attn_norm", signature="th,h->th",
                 eps=config.rms_norm_eps, place=where.local)

    def project_biased(which: str, width: int) -> Blocked:
        t = project(h, which, weight(f"self_attn.{which}_proj.weight", (width, hidden), (groups,)), where.split)
        if not config.qkv_bias:
            return t
        bias = prog.input(f"{p}self_attn.{which}_proj.bias", (width,), dtype, (groups,))  # qwen2: cut like the rows
        return prog.map("add", t, bias, name=t.name + "_bias", signature="tn,n->tn", place=follow)

    widths = (("k", kv_width), ("v", kv_width)) if kv_only else (("q", q_width), ("k", kv_width), ("v", kv_width))
    *rotated, v = [project_biased(which, width) for which, width in widths]
    q, k = [None, *rotated] if kv_only else rotated
    q, k = (t if t is None else prog.map("rope", t, *rope, name=n + t.name.split(".")[-1] + "_rope", signature="tn,td,td->tn",
                                          place=follow) for t in (q, k))
    if kv is not None:
        prog.output(k, v)
        kv.append((k, v))
    if kv_only:
        return None
    a = (attention or causal(config))(prog, q, k, v, n + "attn", where.attention)
    o = project(a, "o", weight("self_attn.o_proj.weight", (hidden, q_width), (None, groups)), where.reduce)
    x = prog.map("add", x, o, name=n + "attn_res", signature="th,th->th", place=where.local)
    if halves:
        prog.phase, prog.group = prog.phase + 1, 1
    h = prog.map("rmsnorm", x, weight("post_attention_layernorm.weight", (hidden,)), name=n + "mlp_norm", signature="th,h->th",
                 eps=config.rms_norm_eps, place=where.local)
    gate = project(h, "gate", weight("mlp.gate_proj.weight", (config.intermediate_size, hidden), (groups,)), where.split)
    up = project(h, "up", weight("mlp.up_proj.weight", (config.intermediate_size, hidden), (groups,)), where.split)
    act = prog.map("swiglu", gate, up, name=n + "act", signature="tf,tf->tf", place=follow)
    down = project(act, "down", weight("mlp.down_proj.weight", (hidden, config.intermediate_size), (None, groups)), where.reduce)
    return prog.map("add", x, down, name=n + "mlp_res", signature="th,th->th", place=where.local)

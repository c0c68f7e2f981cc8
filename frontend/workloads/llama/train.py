"""One LoRA training step of a LLaMA-family model as one taskgraph: forward, LM head, loss and backward.

`build_training_step(config, batch, seq_len, lora, ...)` writes the forward pass with the prefill's own
decoder layer (graph.py `_layer`, given a LoRA `projection`), the final norm, the LM head (logits cut
into vocabulary blocks, so the head need not fit one GPU) and the blocked cross-entropy (frontend/loss.py),
then appends the backward pass (frontend/autodiff.py `grad`) with respect to the adapters only: the base
weights are frozen, so no gradient of theirs is ever computed. Forward and backward are one taskgraph;
keep, offload or recompute of each activation is the compiler's choice (`compile_taskgraph`, `remat=True`
to let it recompute), with no hand-placed checkpoint.

The batch: B sequences of T tokens side by side, [B*T, hidden], each sequence cut into its own token
blocks; attention stays inside each sequence (`Program.attention(sequences=...)`), RoPE positions restart
at 0 in each. The loss is transformers' causal-LM loss, `LlamaForCausalLM(input_ids=ids, labels=labels).loss`:
position t of a sequence predicts its token t + 1 (`feed` shifts the labels, the last position of each
sequence is ignored, as are labels of -100), averaged over the batch's counted positions.

LoRA (`LoraSpec`): on each targeted projection W [out, in], y = W h + (alpha / r) B (A h) with A [r, in] and
B [out, r], dropout 0; the scale is applied to A h ([tokens, r], the cheaper side). Adapters are inputs
named as PEFT's keys without the `base_model.model.` prefix, `model.layers.{i}.self_attn.q_proj.lora_A.weight`,
fed in the model's dtype (`feed` converts float32 masters); the projection's own einsum is `<name>.base`.
Gradients come out in float32 (float64 for a float64 model): each token block's partial product is cast
to float32 before the sum over blocks (a cast of an [r, in] or [out, r] block: cheap beside the products). They are the gradients
of loss_scale times the mean loss; `TrainGraph.grads` divides the scale out (in float32, on the host), so
an fp16 model scales its loss against underflow and the caller sees unscaled gradients (inf or NaN pass
through for a loss scaler to see). The scale is an input, `loss_scale` [1]: a dynamic loss scaler feeds
another value to the same plan.

The interface the host driver uses: `build_training_step(...) -> TrainGraph`; `TrainGraph.graph` (the
taskgraph to compile), `.feed(weights, adapters, ids [B, T], labels [B, T] = ids, loss_scale=None) -> inputs`,
`.loss(outputs) -> float` (the mean loss), `.grads(outputs, loss_scale=None) -> {adapter name: float32 array}`
(None: the scale the step was built with);
`LoraSpec.shapes(config)` names and shapes the adapters without building a graph.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from frontend import Blocked, Program, follow, split_block
from frontend.autodiff import grad
from frontend.loss import IGNORE, mean_loss
from frontend.placement import Placement
from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.graph import (
    LAYER_ORDERS,
    _layer,
    causal,
    default_block,
    default_vocab_block,
    linear,
    plan,
)
from frontend.workloads.llama.rope import rope_tables
from frontend.workloads.llama.weights import embed, head_name
from turnip_ir.errors import InputError
from turnip_ir.kernels import numpy_dtype, partial_dtype
from turnip_ir.pools import shared_pool
from turnip_ir.taskgraph import TaskGraph

MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
"""The projections LoRA may target, in the model's order, with the module that holds each."""
ACTIVATIONS = ("hidden", "rope.cos", "rope.sin", "labels", "loss_scale")
"""The inputs `feed` makes from the batch and the loss scale; the rest are weights and adapters."""


@dataclass(frozen=True)
class LoraSpec:
    """Adapters of rank `rank` on the `targets` projections of every layer, scaled by alpha / rank."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise InputError(f"lora: rank must be a positive integer, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise InputError(f"lora: alpha must be a positive number, got {self.alpha!r}")
        unknown = [t for t in self.targets if t not in MODULES]
        if unknown or not self.targets:
            raise InputError(f"lora: unknown target '{unknown[0] if unknown else ''}' (known: {', '.join(MODULES)})")
        object.__setattr__(self, "targets", tuple(t for t in MODULES if t in self.targets))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def shapes(self, config: LlamaConfig) -> dict[str, tuple[int, int]]:
        """Every adapter's name and shape, layer by layer in the model's order, A before B."""
        hidden, inner = config.hidden_size, config.intermediate_size
        q_width, kv_width = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
        sizes = {"q_proj": (q_width, hidden), "k_proj": (kv_width, hidden), "v_proj": (kv_width, hidden),
                 "o_proj": (hidden, q_width), "gate_proj": (inner, hidden), "up_proj": (inner, hidden),
                 "down_proj": (hidden, inner)}
        shapes = {}
        for layer in range(config.num_hidden_layers):
            for target in self.targets:
                out, into = sizes[target]
                module = f"model.layers.{layer}.{MODULES[target]}.{target}"
                shapes[f"{module}.lora_A.weight"] = (self.rank, into)
                shapes[f"{module}.lora_B.weight"] = (out, self.rank)
        return shapes


def lora_projection(spec: LoraSpec, dtype: str):
    """A `_layer` projection that adds spec's adapter to the targeted weights (module docstring)."""

    def project(prog: Program, h: Blocked, name: str, w: Blocked, place: Placement) -> Blocked:
        module = w.name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] not in spec.targets:
            return linear(prog, h, name, w, place)
        base = linear(prog, h, f"{name}.base", w, place)
        a = prog.input(f"{module}.lora_A.weight", (spec.rank, w.shape[1]), dtype, (None, w.splits[1]))
        b = prog.input(f"{module}.lora_B.weight", (w.shape[0], spec.rank), dtype, (w.splits[0], None))
        down = prog.einsum("ti,ri->tr", h, a, name=f"{name}.lora_a", place=follow)
        scaled = prog.map("scale", down, name=f"{name}.lora_s", factor=spec.scaling)
        up = prog.einsum("tr,or->to", scaled, b, name=f"{name}.lora_b", place=place)
        return prog.map("add", base, up, name=name, signature="to,to->to", place=follow)

    return project


@dataclass
class TrainGraph:
    """A built training step: the program, its loss and adapter gradients, and how to feed and read it."""

    config: LlamaConfig
    batch: int
    seq_len: int
    block: int
    lora: LoraSpec
    loss_scale: float
    program: Program
    total: Blocked
    """The cross-entropy's (summed loss, counted positions) [2]."""
    gradients: dict[str, Blocked] = field(default_factory=dict)
    recomputed: int = 0
    """The first this many layers' forward is computed again just before their backward (`build_training_step`)."""

    @property
    def graph(self) -> TaskGraph:
        return self.program.graph

    @property
    def adapter_shapes(self) -> dict[str, tuple[int, int]]:
        return self.lora.shapes(self.config)

    @property
    def activation_ids(self) -> set[str]:
        """The taskgraph ids of the inputs `feed` makes from a batch (ACTIVATIONS); the rest are weights and adapters."""
        return self.program.input_ids(ACTIVATIONS)

    def feed(self, weights: Mapping[str, np.ndarray], adapters: Mapping[str, np.ndarray], ids: np.ndarray,
             labels: np.ndarray | None = None, loss_scale: float | None = None,
             weight_blocks: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The run's inputs by taskgraph id: the batch's embedded tokens, RoPE tables and shifted labels,
        the loss scale (None: the built one), the adapters (converted to the model dtype) and the weights
        (lazy where the mapping offers `lazy`). `weight_blocks`: the weights already cut (`cut_weights` of
        the same `weights`, kept by a caller that runs step after step: a 7b step has 550 blocks), used
        as they are; `weights` then serves the embedding alone."""
        ids = self._batch(ids, "ids")
        labels = ids if labels is None else self._batch(labels, "labels")
        bad = labels[(labels != IGNORE) & ((labels < 0) | (labels >= self.config.vocab_size))]
        if bad.size:
            raise InputError(f"label {int(bad[0])} is neither -100 nor in the vocabulary range [0, {self.config.vocab_size})")
        self._check_adapters(adapters)
        shifted = np.full(labels.shape, IGNORE, dtype=np.float32)
        shifted[:, :-1] = labels[:, 1:]
        cos, sin = self._rope
        extra = {"hidden": embed(weights, ids.reshape(-1), self.config), "rope.cos": cos, "rope.sin": sin,
                 "labels": shifted.reshape(-1), "loss_scale": np.array([_scale(self.loss_scale if loss_scale is None else loss_scale)])}
        adapters = _converted(adapters, self.config.dtype)
        if weight_blocks is not None:
            return {**weight_blocks, **self.program.feed(ChainMap(extra, adapters), names=[*extra, *adapters])}
        return self.program.feed(ChainMap(extra, adapters, _lazy(weights)))

    @cached_property
    def _rope(self) -> tuple[np.ndarray, np.ndarray]:
        """The batch's RoPE tables (cos, sin), made once: every step feeds the same."""
        cos, sin = rope_tables(self.config, self.seq_len)
        return np.tile(cos, (self.batch, 1)), np.tile(sin, (self.batch, 1))

    def cut_weights(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The frozen weights' blocks by taskgraph id (lazy where the mapping offers `lazy`), for `feed`'s
        `weight_blocks`."""
        names = [name for name in self.program.inputs if name not in ACTIVATIONS and name not in self.adapter_shapes]
        return self.program.feed(_lazy(weights), names=names)

    def loss(self, outputs: Mapping[str, np.ndarray]) -> float:
        """The mean loss of the step (not scaled)."""
        return mean_loss(self.program.gather(self.total, outputs))

    def grads(self, outputs: Mapping[str, np.ndarray], loss_scale: float | None = None, in_place: bool = False) -> dict[str, np.ndarray]:
        """Each adapter's gradient of the mean loss, by name, float32 (float64 for a float64 model), the loss
        scale the run was fed (None: the built one) divided out. `in_place`: a gradient of one block is the
        run's own output array, divided in place (a caller done with `outputs`: no copy of 16.8 million
        values a 7b rank-16 step); otherwise each is gathered into a new array."""
        scale = self.loss_scale if loss_scale is None else loss_scale
        grads = {}
        for name, x in self.gradients.items():
            single = outputs.get(next(iter(x.blocks.values())).id) if in_place and len(x.blocks) == 1 else None
            g = single if isinstance(single, np.ndarray) and single.flags.writeable else self.program.gather(x, outputs)
            g /= g.dtype.type(scale)  # in place: gathered anew, or the caller's to give
            grads[name] = g
        return grads

    def _batch(self, array: np.ndarray, what: str) -> np.ndarray:
        array = np.asarray(array)
        if array.shape != (self.batch, self.seq_len) or array.dtype.kind not in "iu":
            raise InputError(f"{what} must be integers of shape [{self.batch}, {self.seq_len}], got {array.dtype} {list(array.shape)}")
        return array

    def _check_adapters(self, adapters: Mapping[str, np.ndarray]) -> None:
        for name, shape in self.adapter_shapes.items():
            if name not in adapters:
                raise InputError(f"adapter '{name}' is missing")
            if tuple(np.shape(adapters[name])) != shape:
                raise InputError(f"adapter '{name}' has shape {list(np.shape(adapters[name]))}, the model needs {list(shape)}")


def _converted(adapters: Mapping[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """The adapters in the model's `dtype`, each converted whole (the blocks are then views, or copies without
    a conversion), on a few threads: numpy's conversion to float16 runs at a few hundred million values a
    second and releases the GIL, and a 7b rank-16 step's adapters hold 16.8 million (50 ms on one core)."""
    want = numpy_dtype(dtype)
    names = list(adapters)
    if sum(np.size(adapters[name]) for name in names) < CONVERT_ALONE:
        return {name: np.asarray(adapters[name], want) for name in names}
    return dict(zip(names, _converter().map(lambda name: np.asarray(adapters[name], want), names)))


CONVERT_ALONE = 1 << 20
"""Fewer adapter values than this are converted on the calling thread (a pool costs more)."""
CONVERT_THREADS = 8


def _converter() -> ThreadPoolExecutor:
    """The conversions' threads, made once a process (turnip_ir/pools.py)."""
    return shared_pool("convert", CONVERT_THREADS)


def _lazy(weights: Mapping[str, np.ndarray]) -> Mapping:
    """The weights as lazy inputs where the mapping offers them (read or drawn as the backend writes them)."""
    return {name: weights.lazy(name) for name in weights} if callable(getattr(weights, "lazy", None)) else weights


def build_training_step(config: LlamaConfig, batch: int, seq_len: int, lora: LoraSpec, gpus: int = 1,
                        block: int | None = None, loss_scale: float = 1.0, placement: str = "sequence",
                        layer_order: str = "blocks", query_group: int = 1, vocab_block: int | None = None,
                        recompute: int = 0) -> TrainGraph:
    """The training step of `batch` sequences of `seq_len` tokens in blocks of `block` (default: the
    prefill's `default_block` of one sequence) over `gpus` GPUs (module docstring); `placement`,
    `layer_order` and `query_group` as `build_llama`'s, `vocab_block` columns per logits block. The
    backward computes the forward of the first `recompute` layers again just before it needs them
    (frontend/autodiff.py `grad(recompute=)`; turnip/recompute.py chooses how many by the sim)."""
    if isinstance(recompute, bool) or not isinstance(recompute, int) or not 0 <= recompute <= config.num_hidden_layers:
        raise InputError(f"llama training: recompute must be a layer count from 0 to {config.num_hidden_layers}, got {recompute!r}")
    block = min(default_block(config, seq_len) if block is None else block, seq_len)
    vocab_block = vocab_block or default_vocab_block(config)
    _check(batch, seq_len, block, gpus, query_group, vocab_block, loss_scale, placement, layer_order)
    prog = Program(gpus, order_by=("t",), training=True)
    cut = (split_block(seq_len, block) * batch,)
    tokens, dtype = batch * seq_len, config.dtype
    x = prog.input("hidden", (tokens, config.hidden_size), dtype, cut)
    rope = [prog.input(f"rope.{f}", (tokens, config.head_dim), dtype, cut) for f in ("cos", "sin")]
    project = lora_projection(lora, dtype)
    attend = causal(config, (seq_len,) * batch if batch > 1 else None)
    for layer in range(config.num_hidden_layers):
        prog.phase, prog.group = 2 * layer, query_group
        where = plan(config, placement, gpus, layer)
        x = _layer(prog, config, x, rope, layer, where, halves=layer_order == "halves", projection=project, attention=attend)
    prog.phase, prog.group = 2 * config.num_hidden_layers, 1
    total = _loss(prog, config, x, plan(config, placement, gpus, config.num_hidden_layers).local, vocab_block, cut)
    adapters = [prog.inputs[name] for name in lora.shapes(config)]
    scale = prog.input("loss_scale", (1,), partial_dtype(dtype))
    layers = range(2 * recompute)  # the first `recompute` layers' phases (halves: two a layer)
    gradients = grad(prog, total, adapters, seed=scale, dtype=partial_dtype(dtype), recompute=layers)
    prog.output(total, *gradients.values())
    prog.taskgraph()
    return TrainGraph(config, batch, seq_len, block, lora, float(loss_scale), prog, total, gradients, recompute)


def _loss(prog: Program, config: LlamaConfig, x: Blocked, place: Placement, vocab_block: int, cut) -> Blocked:
    """The final norm, the LM head in vocabulary blocks and the cross-entropy against the `labels` input."""
    norm = prog.input("model.norm.weight", (config.hidden_size,), config.dtype)
    hidden = prog.map("rmsnorm", x, norm, name="hidden_states", signature="th,h->th", eps=config.rms_norm_eps, place=place)
    columns = (split_block(config.vocab_size, vocab_block),)
    head = prog.input(head_name(config), (config.vocab_size, config.hidden_size), config.dtype, columns)
    logits = prog.einsum("th,vh->tv", hidden, head, name="logits", place=place)
    labels = prog.input("labels", (x.shape[0],), "float32", cut)
    return prog.cross_entropy(logits, labels, name="loss")


def _check(batch, seq_len, block, gpus, query_group, vocab_block, loss_scale, placement, layer_order) -> None:
    for what, value in (("batch", batch), ("seq_len", seq_len), ("block", block), ("gpus", gpus),
                        ("query_group", query_group), ("vocab_block", vocab_block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"llama training: {what} must be a positive integer, got {value!r}")
    if seq_len < 2:
        raise InputError(f"llama training: a sequence of {seq_len} token predicts nothing; seq_len must be at least 2")
    _scale(loss_scale)
    if layer_order not in LAYER_ORDERS:
        raise InputError(f"unknown llama layer order '{layer_order}' (known: {', '.join(LAYER_ORDERS)})")
    if placement == "heads":
        raise InputError("llama training: placement 'heads' is not supported yet (use sequence, zigzag or layers)")


def _scale(loss_scale) -> float:
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or not 0 < loss_scale < np.inf:
        raise InputError(f"llama training: loss_scale must be a positive number, got {loss_scale!r}")
    return float(loss_scale)

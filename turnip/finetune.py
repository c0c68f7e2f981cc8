"""LoRA fine-tuning of a session's model under its memory budget: the host driver around a gradient engine.

A step's gradients come from an engine: `GradientEngine.step(adapters, ids, labels, loss_scale) -> (loss,
grads)`, the mean loss of one micro-batch (transformers' `LlamaForCausalLM(input_ids=ids, labels=labels).loss`)
and every adapter's gradient of it, the loss scale divided out, inf and NaN passed through. `TurnipEngine`
is Turnip's: the training graph (`llama.build_training_step`) built once per shape, compiled under
the session's budget and run on its backend through the session's plan cache. Tests drive the same loop
with a torch reference engine.

The rest runs on the host (docs/finetune.md says why): the data (turnip/training_data.py), the adapter and
its files (turnip/lora.py), AdamW, its warm-up and the fp16 loss scaler (turnip/optimizer.py), in float32.
A step reads `grad_accum` micro-batches of `batch` examples and makes one update from the gradient of their
loss as transformers' Trainer normalises it under gradient accumulation: the cross-entropy summed over
every counted position of all the micro-batches, divided by their number (Trainer's `num_items_in_batch`,
counted over `labels[..., 1:] != -100`). So micro-batch k's mean-loss gradient is weighted by n_k / sum n
(summed in float64, then float32), and the step's loss is that same mean, not the mean of the micro-batch
means.

Stopping: a loss that is inf or NaN, or (bf16, fp32) gradients that are, stop the run with `TrainingStopped`,
which names the step and carries the result so far: the adapter after the last good step. With fp16 a
gradient that overflowed is the loss scaler's: it halves the scale and the step makes no update.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from frontend.workloads import llama
from turnip.lora import Adapter, LoraSettings
from turnip.optimizer import AdamW, LossScaler, TrainingState, warmup_lr
from turnip.recompute import choose_recompute
from turnip.training_data import Batch, TrainingData, read_examples
from turnip_ir.cost import CostModel
from turnip_ir.errors import InputError, TurnipError


class GradientEngine(Protocol):
    def step(self, adapters: Mapping[str, np.ndarray], ids: np.ndarray, labels: np.ndarray,
             loss_scale: float) -> tuple[float, dict[str, np.ndarray]]:
        """The mean loss of the micro-batch (ids, labels int [B, T]; labels -100 ignored, shifted inside)
        and each adapter's gradient of it, by name, the loss scale divided out."""
        ...


class RunCosts:
    """What the engine's runs cost, as the session's `_run` counts it into a stats object (compiles and
    their seconds, cache hits, bytes offloaded and reloaded, the arena's peak, ...). Every counter starts
    at 0, so the session may count more than a summary reads."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return 0

    def __repr__(self) -> str:
        return f"RunCosts({vars(self)})"


@dataclass
class StepRecord:
    """One step as `--log` writes it: its number (counting a resumed run's earlier steps), the loss, the
    learning rate, the tokens read (padding not counted), its wall time, the loss scale and whether the
    loss scaler skipped its update."""

    step: int
    loss: float
    lr: float
    tokens: int
    seconds: float
    loss_scale: float = 1.0
    skipped: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class FinetuneResult:
    """The adapter after the run, the state to go on from, and each step."""

    adapter: Adapter
    state: TrainingState
    steps: list[StepRecord] = field(default_factory=list)
    costs: RunCosts = field(default_factory=RunCosts)
    truncated: int = 0
    """Examples longer than the sequence length (a batch reads their first `seq_len` tokens)."""
    device_peak: int | None = None
    """The most device memory this process held on a GPU during the run, as the driver reports it (NVML:
    what nvidia-smi shows), context included; None where the driver cannot say (no GPU)."""
    device_context: int | None = None
    """What the process held on that GPU before its first arena: the CUDA context and the driver's modules."""

    @property
    def losses(self) -> list[float]:
        return [record.loss for record in self.steps]


class TrainingStopped(TurnipError):
    """A loss or gradient that became inf or NaN; `result` holds the adapter after the last good step."""

    def __init__(self, message: str, result: FinetuneResult):
        super().__init__(message)
        self.result = result


def finetune(session, data, steps: int, adapter: Adapter | str | Path | None = None, state: TrainingState | None = None,
             rank: int = 8, alpha: float | None = None, targets=("q_proj", "v_proj"), lr: float = 1e-4,
             weight_decay: float = 0.01, warmup_steps: int = 0, batch: int = 1, grad_accum: int = 1, seq_len: int | None = None,
             seed: int | None = None, base_model: str | None = None, on_step: Callable[[StepRecord], None] | None = None,
             engine: GradientEngine | None = None) -> FinetuneResult:
    """`steps` AdamW steps of LoRA on `session`'s model over `data` (module docstring).

    `data`: a .npy / .npz / .jsonl path, an int array [rows, T], or a list of 1-D sequences or strings
    (turnip/training_data.py). `adapter`: a PEFT adapter folder to go on from (its rank, alpha, targets and
    the optimizer state beside it), an `Adapter` (with `state`, or AdamW afresh), or None: a new one of
    `rank`, `alpha` (None: 2 rank) on `targets`, drawn from `seed` (None: the session's). `on_step` is
    called with each step's record as it ends."""
    for what, value in (("steps", steps), ("batch", batch), ("grad_accum", grad_accum)):
        _check_count(what, value, 1)
    _check_count("warmup_steps", warmup_steps, 0)
    if getattr(session, "adapter", None) is not None:  # its weights are base + adapter: a new one would be of those
        raise InputError("the session runs its model with an adapter merged in, so it cannot fine-tune: use a session "
                         "without one and pass the adapter as finetune's adapter= to go on training it")
    optimizer = AdamW(lr, weight_decay)
    config = session.config
    examples, where = read_examples(data, session.tokenizer)
    dataset = TrainingData(examples, config.vocab_size, seq_len, where)
    if adapter is None:
        settings = LoraSettings(rank, alpha, tuple(targets))
        adapter = Adapter.new(config, settings, session.seed if seed is None else seed, base_model or config.name)
    elif isinstance(adapter, (str, Path)):
        adapter, state = Adapter.read(adapter, config)
    else:
        adapter = Adapter(adapter.settings, {n: np.array(t, np.float32) for n, t in adapter.tensors.items()}, adapter.base_model)
    state = state or TrainingState()
    if state.scaler.enabled != (config.dtype == "float16"):  # a scaler goes on only from an fp16 run into an fp16 run
        state.scaler = LossScaler(config.dtype == "float16")
    result = FinetuneResult(adapter, state, truncated=dataset.truncated)
    engine = engine or TurnipEngine(session, adapter.settings, result.costs)
    for _ in range(steps):
        record = _step(engine, optimizer, warmup_steps, dataset, batch, grad_accum, result)
        result.steps.append(record)
        if on_step is not None:
            on_step(record)
    return result


def check_computes(backend: str) -> None:
    """Refuse the sim backend (resolved name) in one line: a step needs a loss and gradients, which it never computes."""
    if backend == "sim":
        raise InputError("the sim backend computes no values (no loss, no gradient), so finetune needs the cpu or cuda backend")


def _step(engine: GradientEngine, optimizer: AdamW, warmup_steps: int, data: TrainingData, batch: int, grad_accum: int,
          result: FinetuneResult) -> StepRecord:
    """One step: the gradient over `grad_accum` micro-batches, then the update (module docstring)."""
    began = time.perf_counter()
    state, adapter = result.state, result.adapter
    number = state.steps_done + 1
    batches = [data.batch(state.examples_seen + j * batch, batch) for j in range(grad_accum)]
    loss, grads = _accumulated(engine, adapter.tensors, batches, state.scaler.scale)
    finite = _finite(grads)
    if not np.isfinite(loss) or not (finite or state.scaler.enabled):
        what = f"the loss is {loss}" if not np.isfinite(loss) else "the gradients are not finite"
        kept = f"the adapter after step {number - 1}" if number > 1 else "the adapter it started from"
        raise TrainingStopped(f"{what} at step {number}: stopped, keeping {kept}", result)
    lr = warmup_lr(optimizer.lr, warmup_steps, state.adam.step)
    scale = state.scaler.scale
    applied = state.scaler.update(finite)
    if applied:
        optimizer.update(adapter.tensors, grads, state.adam, lr)
    state.steps_done += 1
    state.examples_seen += batch * grad_accum
    tokens = sum(b.tokens for b in batches)
    return StepRecord(number, loss, lr, tokens, time.perf_counter() - began, scale, not applied)


def _accumulated(engine: GradientEngine, adapters: Mapping[str, np.ndarray], batches: list[Batch],
                 loss_scale: float) -> tuple[float, dict[str, np.ndarray]]:
    """The loss over all `batches` and its gradient (float32): each micro-batch's weighted by its share
    of the counted positions (one micro-batch: its own, as it came)."""
    if len(batches) == 1:
        b = batches[0]
        loss, grads = engine.step(adapters, b.ids, b.labels, loss_scale)
        return float(loss), {name: np.asarray(grads[name], np.float32) for name in adapters}
    counted = sum(b.predicted for b in batches)
    loss, grads = 0.0, {name: np.zeros(t.shape, np.float64) for name, t in adapters.items()}
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are looked for by the caller
        for b in batches:
            part, part_grads = engine.step(adapters, b.ids, b.labels, loss_scale)
            weight = b.predicted / counted
            loss += weight * float(part)
            for name, g in grads.items():
                g += weight * np.asarray(part_grads[name], np.float64)
        return loss, {name: g.astype(np.float32) for name, g in grads.items()}


def _finite(grads: Mapping[str, np.ndarray]) -> bool:
    """No inf or NaN in any gradient: a float64 sum of float32 values cannot overflow, so it is finite
    exactly when every value is (one pass, no temporary array)."""
    with np.errstate(invalid="ignore"):  # inf - inf
        return all(np.isfinite(np.sum(g, dtype=np.float64)) for g in grads.values())


def _check_count(what: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        kind = "a positive integer" if least == 1 else f"an integer of {least} or more"
        raise InputError(f"{what} must be {kind}, got {value!r}")


class TurnipEngine:
    """Gradients from Turnip's training graph (`llama.build_training_step`), one built per batch shape,
    compiled under the session's budget and run on its backend through the session's `_run` (its plan
    cache and arena; the frozen weights are the session's, kept where they are between runs, as for a
    prefill; the adapters, the batch and the loss scale are fed anew each run)."""

    def __init__(self, session, settings: LoraSettings, costs: RunCosts):
        self.session, self.costs = session, costs
        self.spec = settings.spec

    def step(self, adapters, ids, labels, loss_scale):
        session = self.session
        shape = tuple(ids.shape)
        step, blocks, self.costs.recompute = self._built(shape)
        inputs = step.feed(session.weights, adapters, ids, labels, loss_scale=loss_scale, weight_blocks=blocks)
        result, _, _ = self._run(shape, step, inputs)
        return step.loss(result.outputs), step.grads(result.outputs, loss_scale=loss_scale, in_place=True)  # the run's: ours to give

    def _run(self, shape: tuple[int, int], step, inputs=None):
        """The step's plan (compiled once: the session's cache), run with `inputs` (None: compiled only).
        The planner keeps, moves or recomputes each activation; the frozen weights stream from their pinned
        memory each step (placed before the run, those that fit would be moved out again and in once more)."""
        key, batch = self._key(shape, step.recomputed), frozenset(step.activation_ids)
        if inputs is None:
            return self.session._compiled(key, step.graph, self.costs, "host", True, batch)
        return self.session._run(key, step.graph, inputs, self.costs, remat=True, start_on_gpu=batch)

    def _key(self, shape: tuple[int, int], recomputed: int) -> tuple:
        """The step's key in `Session._run` (`Session._cache_key` adds where the inputs start, remat on, and
        the batch's inputs on the GPU)."""
        return ("train", *shape, self.spec.rank, self.spec.alpha, self.spec.targets, recomputed)

    def chooses(self) -> bool:
        """Whether the sim chooses how many layers a step recomputes: on the cuda backend, whose runs the sim
        predicts; the cpu backend computes what it is given in its own time (none recomputed)."""
        return self.session.backend == "cuda"

    def _built(self, shape: tuple[int, int]) -> tuple:
        """The step for this batch shape, the frozen weights cut into its blocks (`TrainGraph.cut_weights`:
        the same arrays every step, 550 blocks at 7b) and what the sim chose on the cuda backend (the layers
        the backward recomputes, turnip/recompute.py `RecomputeChoice.text`; elsewhere none: ""), built once per session
        (`Session._training`), so a caller that calls `finetune` step by step builds, chooses and cuts once."""
        session = self.session
        key = (shape, self.spec)
        if key not in session._training:
            def build(recompute: int):
                return llama.build_training_step(session.config, shape[0], shape[1], self.spec, gpus=session.gpus,
                                                 placement=session._placement(), recompute=recompute)

            if self.chooses():
                choice = choose_recompute(build, lambda step: self._run(shape, step), session.config.num_hidden_layers,
                                          lambda: CostModel().for_attention(session.attention))
                step, note = choice.step, choice.text()
                for other in choice.makespans.keys() - {step.recomputed}:  # the candidates that lost: their plans go
                    session.cache.pop(session._cache_key(self._key(shape, other), "host", True, frozenset(step.activation_ids)), None)
            else:
                step, note = build(0), ""
            session._training[key] = (step, step.cut_weights(session.weights), note)
            if len(session._training) > 8:  # a few shapes at most: each holds a graph of thousands of tasks
                session._training.pop(next(iter(session._training)))
        return session._training[key]

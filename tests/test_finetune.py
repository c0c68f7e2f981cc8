"""LoRA fine-tuning's host driver against torch, transformers and peft, on tiny checkpoints transformers writes.

The gradients come from an engine: here the float64 torch reference (tests/lora_reference.py); where the
training graph (`llama.build_training_step`) is there, the driver tests run with Turnip's own
engine too (on the cpu backend, in float64, under a budget that offloads, in random orders). The expected
values come from torch alone: peft's LoRA model, torch.optim.AdamW, transformers' warm-up schedule and its
gradient-accumulation normalisation (`num_items_in_batch`), with the same data rows picked here. Also: the
optimizer alone against torch's AdamW in float32, the fp16 loss scaler, a stop on NaN, resuming from a
written folder, PEFT folders both ways, the data readers, and `turnip finetune`'s outputs and bad inputs.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from lora_reference import TorchReferenceEngine, base_model

from frontend.workloads import llama

import turnip.finetune as driver
from turnip import Session
from turnip.finetune import TrainingStopped, finetune
from turnip.lora import CONFIG_FILE, PREFIX, PROJECTIONS, STATE_FILE, WEIGHTS_FILE, Adapter, LoraSettings, MergedWeights
from turnip.optimizer import AdamState, AdamW, LossScaler, TrainingState, warmup_lr
from turnip.training_data import TrainingData, read_examples
from turnip_cli.main import main
from turnip_ir.errors import InputError

MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 96, "max_position_embeddings": 128, "rms_norm_eps": 1e-5}
VOCAB = MODEL["vocab_size"]
SETTINGS = LoraSettings(4, 8.0, ("q_proj", "v_proj", "down_proj"))
BUDGET = 96 << 10
"""Small enough that the Turnip engine's plans offload (its own tests check that)."""
ENGINES = ["torch"] + (["turnip"] if hasattr(llama, "build_training_step") else [])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny LLaMA checkpoint written by transformers (float32 safetensors)."""
    path = tmp_path_factory.mktemp("finetune") / "model"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**MODEL)).save_pretrained(path)
    return path


def session_for(folder: Path, engine: str, dtype: str | None = None, memory: int = BUDGET) -> Session:
    if engine == "torch":
        return Session(weights=folder, memory=memory, backend="cpu", dtype=dtype)
    return Session(weights=folder, memory=memory, backend="cpu", dtype=dtype or "float64", order="random", seed=3)


def engine_for(folder: Path, engine: str, settings: LoraSettings = SETTINGS):
    """The gradient engine (None: the session's own, Turnip's)."""
    return TorchReferenceEngine(folder, settings) if engine == "torch" else None


def rows_of(seed: int, count: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (count, length))


def padded(sequences: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(sequences), length), np.int64)
    labels = np.full((len(sequences), length), -100, np.int64)
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = labels[row, : len(s)] = s[:length]
    return ids, labels


# ----- the optimizer --------------------------------------------------------------------------------------
def test_adamw_equals_torch_adamw_in_float32():
    rng = np.random.default_rng(0)
    shapes = {"a": (4, 32), "b": (32, 4)}
    params = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    grads = [{n: (rng.standard_normal(s) * 10.0 ** rng.integers(-6, 1)).astype(np.float32) for n, s in shapes.items()} for _ in range(12)]
    theirs = {n: torch.nn.Parameter(torch.from_numpy(p.copy())) for n, p in params.items()}
    opt = torch.optim.AdamW(theirs.values(), lr=3e-2, weight_decay=0.1)
    schedule = transformers.get_constant_schedule_with_warmup(opt, 3)
    mine, state = AdamW(3e-2, 0.1), AdamState()
    for g in grads:
        for n, p in theirs.items():
            p.grad = torch.from_numpy(g[n])
        lr = warmup_lr(mine.lr, 3, state.step)
        assert lr == pytest.approx(schedule.get_last_lr()[0], rel=1e-15)
        opt.step()
        schedule.step()
        mine.update(params, g, state, lr)
    for n, p in theirs.items():
        np.testing.assert_allclose(params[n], p.detach().numpy(), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(state.exp_avg_sq[n], opt.state[p]["exp_avg_sq"].numpy(), rtol=2e-6, atol=0)
    assert state.step == 12


def test_warmup_is_transformers_constant_schedule_with_warmup():
    assert [warmup_lr(1.0, 4, t) for t in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert [warmup_lr(2.0, 0, t) for t in range(2)] == [2.0, 2.0]


def test_loss_scaler_halves_skips_and_grows():
    scaler = LossScaler(True, growth_interval=3)
    assert scaler.scale == 2.0**16
    assert [scaler.update(f) for f in (False, True, True, True, False)] == [False, True, True, True, False]
    assert scaler.scale == 2.0**15  # halved, grown after 3 good steps, halved
    off = LossScaler(False)
    assert off.scale == 1.0 and off.update(False) and off.scale == 1.0


def test_adamw_refuses_learning_rates_that_are_not_positive_numbers():
    for bad in (0, -1e-4, float("nan"), float("inf"), "1e-4", True):
        with pytest.raises(InputError, match="learning rate must be a positive number"):
            AdamW(bad)


# ----- the driver against torch -------------------------------------------------------------------------
def peft_start(folder: Path, path: Path, settings: LoraSettings = SETTINGS, seed: int = 5) -> Path:
    """An adapter folder peft writes, A and B both drawn (init_lora_weights=False), so every gradient is non-zero."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=list(settings.targets), lora_dropout=0.0,
                             init_lora_weights=False, task_type="CAUSAL_LM")
    peft.get_peft_model(base_model(folder, torch.float32), config).save_pretrained(path)
    return path


def torch_run(folder: Path, start: Path, steps: list[list[tuple[np.ndarray, np.ndarray]]], lr: float, weight_decay: float,
              warmup: int) -> tuple[list[float], dict[str, np.ndarray]]:
    """From peft's own reading of the adapter folder `start`: its LoRA on transformers' model in float64,
    torch's AdamW, transformers' warm-up, and gradient accumulation as transformers' Trainer does it: each
    micro-batch's loss is its summed cross-entropy over the step's `num_items_in_batch` (labels[..., 1:]
    not -100, over all its micro-batches). The losses and the adapters by turnip's names."""
    model = peft.PeftModel.from_pretrained(base_model(folder), str(start), is_trainable=True)
    params = {n.replace(".default", "").removeprefix(PREFIX): p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=lr, weight_decay=weight_decay)
    schedule = transformers.get_constant_schedule_with_warmup(opt, warmup)
    losses = []
    for micro in steps:
        items = sum(int((labels[:, 1:] != -100).sum()) for _, labels in micro)
        total = 0.0
        for ids, labels in micro:
            loss = model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels), num_items_in_batch=torch.tensor(items)).loss
            loss.backward()
            total += loss.item()
        opt.step()
        schedule.step()
        opt.zero_grad()
        losses.append(total)
    return losses, {name: p.detach().numpy() for name, p in params.items()}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("data", ["npy", "ragged npz"])
def test_adapter_and_losses_equal_torch_adamw_with_accumulation_and_warmup(folder, tmp_path, engine, data):
    """From an adapter peft wrote: 3 steps of 2 micro-batches of 2 examples, 5 examples (so the steps wrap
    around the data), warm-up over 2 updates. With ragged sequences the micro-batches count different
    numbers of positions, so the step's gradient differs from the mean of the micro-batch means: the
    normalisation is tested. Turnip's engine: float64, under a budget that offloads, in random orders."""
    batch, accum, steps = 2, 2, 3
    if data == "npy":
        examples = [np.asarray(r) for r in rows_of(1, 5, 9)]
        path = tmp_path / "d.npy"
        np.save(path, np.stack(examples))
    else:
        lengths = (9, 2, 6, 3, 8)
        examples = [rows_of(k, 1, n)[0] for k, n in enumerate(lengths)]
        path = tmp_path / "d.npz"
        np.savez(path, *examples)
    order = [[[examples[(s * accum * batch + j * batch + b) % 5] for b in range(batch)] for j in range(accum)] for s in range(steps)]
    expected_batches = [[padded(m, 9) for m in step] for step in order]
    start = peft_start(folder, tmp_path / "start")
    with session_for(folder, engine) as session:
        result = finetune(session, str(path), steps, adapter=start, lr=2e-2, weight_decay=0.1, warmup_steps=2, batch=batch,
                          grad_accum=accum, engine=engine_for(folder, engine))
        initial, _ = Adapter.read(start, session.config)
    losses, tensors = torch_run(folder, start, expected_batches, 2e-2, 0.1, 2)
    np.testing.assert_allclose(result.losses, losses, rtol=1e-6)
    assert [r.lr for r in result.steps] == [0.0, 1e-2, 2e-2]
    for name, expected in tensors.items():
        np.testing.assert_allclose(result.adapter.tensors[name], expected, rtol=0, atol=1e-6, err_msg=name)
    moved = min(np.abs(result.adapter.tensors[n] - initial.tensors[n]).max() for n in tensors)
    assert moved > 1e-3  # every adapter tensor changed: the comparison is not of unchanged adapters
    assert result.state.adam.step == 3 and result.state.examples_seen == 12
    if engine == "turnip":
        assert result.costs.compiles == 1 and result.costs.bytes_offloaded > 0


def test_a_run_resumed_from_its_folder_equals_one_run(folder, tmp_path):
    """3 steps, written with the optimizer state, then 3 more from the folder: the 6 steps of one run, bit
    for bit (the update count, moments, schedule position and data position go on)."""
    rows = rows_of(2, 5, 7)
    with session_for(folder, "torch") as session:
        whole = finetune(session, rows, 6, warmup_steps=4, lr=1e-2, batch=2, engine=engine_for(folder, "torch", LoraSettings()))
        first = finetune(session, rows, 3, warmup_steps=4, lr=1e-2, batch=2, engine=engine_for(folder, "torch", LoraSettings()))
        first.adapter.save(tmp_path / "a", first.state)
        second = finetune(session, rows, 3, adapter=tmp_path / "a", warmup_steps=4, lr=1e-2, batch=2,
                          engine=engine_for(folder, "torch", LoraSettings()))
    assert [r.step for r in second.steps] == [4, 5, 6]
    assert first.losses + second.losses == whole.losses
    for name, tensor in whole.adapter.tensors.items():
        np.testing.assert_array_equal(second.adapter.tensors[name], tensor)
    assert second.state.adam.step == whole.state.adam.step == 6


class Faulty:
    """An engine that returns what `fault(call, loss_scale)` says: None (the reference's), "nan-loss", "inf-grad"."""

    def __init__(self, inner, fault):
        self.inner, self.fault, self.calls = inner, fault, 0

    def step(self, adapters, ids, labels, loss_scale):
        self.calls += 1
        loss, grads = self.inner.step(adapters, ids, labels, loss_scale)
        kind = self.fault(self.calls, loss_scale)
        if kind == "nan-loss":
            loss = float("nan")
        if kind == "inf-grad":
            grads = {n: np.where(np.arange(g.size).reshape(g.shape) % 2, np.inf, -np.inf) for n, g in grads.items()}
        return loss, grads


def test_fp16_overflow_halves_the_scale_and_skips_the_update(folder):
    """Gradients that overflow while the scale is above 2^14: two steps skipped (no update, the scale
    halved each time), then updates as a float32 run from the same data position makes them."""
    rows = rows_of(3, 6, 8)
    reference = engine_for(folder, "torch", LoraSettings())
    with session_for(folder, "torch", dtype="float16") as session:
        assert session.config.dtype == "float16"
        engine = Faulty(reference, lambda call, scale: "inf-grad" if scale > 2**14 else None)
        scaled = finetune(session, rows, 4, lr=1e-2, engine=engine)
    assert [r.skipped for r in scaled.steps] == [True, True, False, False]
    assert [r.loss_scale for r in scaled.steps] == [2**16, 2**15, 2**14, 2**14]
    assert scaled.state.adam.step == 2 and scaled.state.scaler.scale == 2**14
    with session_for(folder, "torch") as session:
        plain = finetune(session, rows, 2, lr=1e-2, state=TrainingState(examples_seen=2), engine=reference)
    for name, tensor in plain.adapter.tensors.items():
        np.testing.assert_array_equal(scaled.adapter.tensors[name], tensor)


@pytest.mark.parametrize("fault", ["nan-loss", "inf-grad"])
def test_a_loss_or_gradient_that_becomes_nan_stops_and_keeps_the_last_good_adapter(folder, fault):
    rows = rows_of(4, 4, 8)
    reference = engine_for(folder, "torch", LoraSettings())
    with session_for(folder, "torch") as session:
        good = finetune(session, rows, 2, lr=1e-2, engine=reference)
        with pytest.raises(TrainingStopped, match="at step 3: stopped, keeping the adapter after step 2") as stopped:
            finetune(session, rows, 5, lr=1e-2, engine=Faulty(reference, lambda call, scale: fault if call == 3 else None))
    kept = stopped.value.result
    assert len(kept.steps) == 2 and kept.state.adam.step == 2
    for name, tensor in good.adapter.tensors.items():
        np.testing.assert_array_equal(kept.adapter.tensors[name], tensor)


def test_session_finetune_returns_losses_and_adapter(folder):
    with session_for(folder, "torch") as session:
        result = session.finetune(rows_of(5, 3, 6), steps=2, rank=2, alpha=4, targets=("k_proj",),
                                  engine=engine_for(folder, "torch", LoraSettings(2, 4, ("k_proj",))))
    assert len(result.losses) == 2 and all(np.isfinite(result.losses))
    assert sorted(result.adapter.tensors) == sorted(LoraSettings(2, 4, ("k_proj",)).shapes(session.config))
    with pytest.raises(InputError, match="closed"):
        session.finetune(rows_of(5, 3, 6), steps=1)


def test_a_sim_session_refuses_to_finetune_in_one_line():
    with Session(config="tiny", memory="8MiB", backend="sim") as session, pytest.raises(InputError, match="sim backend computes no values"):
        session.finetune(rows_of(5, 3, 6), steps=1)


def test_the_sessions_training_plan_streams_the_weights_and_places_only_the_batch(folder):
    """The Turnip engine plans a step with the frozen weights starting in their pinned host memory (nothing
    placed on the GPU before a run, where it would be moved out again for the activations and in again) and
    the batch's inputs on the GPU: what a run places is the batch, step after step."""
    steps, rows = 3, rows_of(2, 3, 6)
    with session_for(folder, "turnip") as session:
        result = session.finetune(rows, steps=steps, rank=4, alpha=8, targets=SETTINGS.targets)
        (memgraph,) = [plan for key, plan in session.cache.items() if key[0] == "train"]
    built = llama.build_training_step(session.config, 1, 6, SETTINGS.spec)
    batch = sum(built.graph.nodes[name].nbytes for name in built.activation_ids)
    weights = sum(node.nbytes for node in built.graph.nodes.values() if node.op == "input" and node.id not in built.activation_ids)
    assert result.costs.bytes_reloaded > 0 and 0 < result.costs.bytes_placed <= steps * batch < weights
    placed = {node.task for node in memgraph.nodes if node.op == "input" and node.device is not None}
    assert placed <= built.activation_ids


def test_the_engine_cuts_the_weights_once_and_feeds_the_same_blocks_every_step(folder, monkeypatch):
    """A step's inputs are the frozen weights' blocks cut once per session and batch shape (`TrainGraph.cut_weights`:
    the same arrays, which a backend finds in place and a check has seen, in a later `finetune` call too)
    and the batch and adapters anew; the inputs equal those cut whole from the weights."""
    fed = []
    with session_for(folder, "turnip") as session:
        real = session._run

        def run(key, graph, inputs, *args, **kwargs):
            fed.append(inputs)
            return real(key, graph, inputs, *args, **kwargs)

        monkeypatch.setattr(session, "_run", run)
        result = session.finetune(rows_of(2, 3, 6), steps=2, rank=4, alpha=8, targets=SETTINGS.targets)
        result = session.finetune(rows_of(3, 3, 6), steps=1, adapter=result.adapter, state=result.state)  # a call of its own
        weights = session.weights
    assert len(fed) == 3 and all(np.isfinite(result.losses))
    built = llama.build_training_step(session.config, 1, 6, SETTINGS.spec)
    frozen = {name for name in fed[0] if name not in built.activation_ids and "lora_" not in name}
    assert frozen and all(fed[k][name] is fed[0][name] for k in (1, 2) for name in frozen)
    adapters = {name: np.zeros(shape, np.float32) for name, shape in SETTINGS.spec.shapes(session.config).items()}
    ids = np.arange(6).reshape(1, 6)
    whole, cut = built.feed(weights, adapters, ids), built.feed(weights, adapters, ids, weight_blocks=built.cut_weights(weights))
    assert whole.keys() == cut.keys() and all(np.array_equal(np.asarray(whole[k]), np.asarray(cut[k])) for k in whole)


def test_where_the_sim_chooses_the_session_runs_the_chosen_step_alone(folder, monkeypatch):
    """Where the engine lets the sim choose how many layers a step recomputes (the cuda backend's engine),
    each candidate is compiled, the chosen one's plan alone stays in the session's cache and runs, the
    choice is named, and the losses are those of the step with nothing recomputed."""
    rows = rows_of(2, 3, 6)
    with session_for(folder, "turnip") as session:
        plain = session.finetune(rows, steps=2, rank=4, alpha=8, targets=SETTINGS.targets)
    monkeypatch.setattr(driver.TurnipEngine, "chooses", lambda self: True)
    with session_for(folder, "turnip") as session:
        chosen = session.finetune(rows, steps=2, rank=4, alpha=8, targets=SETTINGS.targets)
        (key,) = [key for key in session.cache if key[0] == "train"]
        ((step, _, note),) = session._training.values()
    assert chosen.costs.compiles >= 2 and chosen.costs.recompute == note
    assert re.match(r"recomputes the forward of \d layer\(s\) before their backward \(sim by layers recomputed: 0: [\d.]+ s, 1: ", note)
    assert key[6] == step.recomputed and f"forward of {step.recomputed} layer" in note
    np.testing.assert_array_equal(chosen.losses, plain.losses)
    assert all(np.array_equal(chosen.adapter.tensors[n], plain.adapter.tensors[n]) for n in plain.adapter.tensors)


def test_the_summary_names_the_device_memory_the_driver_reported(folder):
    from turnip_cli.finetune_cmd import summary_lines

    with session_for(folder, "torch") as session:
        result = session.finetune(rows_of(5, 2, 6), steps=1, rank=2, engine=engine_for(folder, "torch", LoraSettings(2, 4, ("q_proj", "v_proj"))))
    assert result.device_peak is None and not any("device memory" in line for line in summary_lines(result))  # the cpu backend: no driver
    result.device_peak, result.device_context = 5 << 30, 512 << 20
    assert "device memory this process held (the driver, NVML): peak 5.00 GiB, of which the CUDA context 512.00 MiB" in summary_lines(result)


@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) if e == "turnip" else e for e in ENGINES])
def test_a_loss_falls_on_a_small_text(tmp_path, engine):
    """100 steps over the tests' own small corpus (tests/test_text.py's, through its byte-level tokenizer)
    take a tiny model's loss from about log(vocabulary) to under a third of it."""
    from test_text import CORPUS, write_folder

    model = write_folder(tmp_path / "m", "byte-level")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    settings = LoraSettings(8, None, PROJECTIONS)
    with session_for(model, engine, "float32", 1 << 20) as session:
        result = session.finetune(str(tmp_path / "d.jsonl"), steps=100, lr=3e-3, batch=3, targets=PROJECTIONS,
                                  engine=engine_for(model, engine, settings))
    first, last = result.losses[0], np.mean(result.losses[-10:])
    assert first > 5 and last < first / 3, (first, last)


# ----- adapters -----------------------------------------------------------------------------------------
def test_a_new_adapter_is_initialised_as_peft_does(folder):
    with session_for(folder, "torch") as session:
        config = session.config
    adapter = Adapter.new(config, LoraSettings(8, None, ("q_proj", "o_proj", "up_proj")), seed=1)
    assert adapter.settings.alpha == 16
    for name, tensor in adapter.tensors.items():
        assert tensor.dtype == np.float32
        if ".lora_B." in name:
            assert not tensor.any()
        else:
            bound = 1 / np.sqrt(tensor.shape[1])  # what nn.init.kaiming_uniform_(a=sqrt(5)) draws within
            assert np.abs(tensor).max() <= bound and np.abs(tensor).max() > 0.9 * bound
            assert abs(tensor.mean()) < 0.1 * bound and tensor.std() == pytest.approx(bound / np.sqrt(3), rel=0.1)
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 8, bias=False)
    torch.nn.init.kaiming_uniform_(layer.weight, a=np.sqrt(5))
    assert np.abs(layer.weight.detach().numpy()).max() <= 1 / np.sqrt(32)
    assert not np.array_equal(adapter.tensors["model.layers.0.self_attn.q_proj.lora_A.weight"],
                              Adapter.new(config, adapter.settings, seed=2).tensors["model.layers.0.self_attn.q_proj.lora_A.weight"])


def test_settings_refuse_what_is_not_lora_here():
    with pytest.raises(InputError, match="rank must be a positive integer"):
        LoraSettings(0)
    with pytest.raises(InputError, match="'qkv' is not a projection"):
        LoraSettings(4, None, ("qkv",))
    assert replace(LoraSettings(4), alpha=None).alpha == 8 and LoraSettings(4, 3).scaling == 0.75


def random_adapter(config, settings: LoraSettings, seed: int) -> Adapter:
    """An adapter with B non-zero too, so that it changes the logits."""
    rng = np.random.default_rng(seed)
    adapter = Adapter.new(config, settings, seed, base_model="tiny")
    adapter.tensors = {n: (rng.standard_normal(t.shape) * 0.2).astype(np.float32) for n, t in adapter.tensors.items()}
    return adapter


def test_peft_loads_what_turnip_writes_with_the_same_logits(folder, tmp_path):
    with session_for(folder, "torch") as session:
        adapter = random_adapter(session.config, SETTINGS, 0)
    written = adapter.save(tmp_path / "out", TrainingState())
    assert sorted(p.name for p in written) == sorted((CONFIG_FILE, WEIGHTS_FILE, STATE_FILE))
    doc = json.loads((tmp_path / "out" / CONFIG_FILE).read_text())
    assert {k: doc[k] for k in ("peft_type", "r", "lora_alpha", "target_modules", "lora_dropout", "bias", "task_type",
                                "base_model_name_or_path")} == {
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"], "lora_dropout": 0.0,
        "bias": "none", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny"}
    from safetensors.numpy import load_file

    stored = load_file(tmp_path / "out" / WEIGHTS_FILE)
    assert stored.keys() == {PREFIX + n for n in adapter.tensors}
    assert stored[f"{PREFIX}model.layers.1.mlp.down_proj.lora_A.weight"].shape == (4, 64)
    assert stored[f"{PREFIX}model.layers.1.self_attn.v_proj.lora_B.weight"].shape == (16, 4)
    assert {t.dtype for t in stored.values()} == {np.dtype(np.float32)}
    ids = rows_of(6, 2, 10)
    loaded = peft.PeftModel.from_pretrained(base_model(folder), str(tmp_path / "out"))
    with torch.no_grad():
        theirs = loaded(input_ids=torch.from_numpy(ids)).logits.numpy()
    by_hand = TorchReferenceEngine(folder, SETTINGS).logits(adapter.tensors, ids)
    plain = TorchReferenceEngine(folder, SETTINGS).logits({n: 0 * t for n, t in adapter.tensors.items()}, ids)
    np.testing.assert_allclose(theirs, by_hand, rtol=1e-10, atol=1e-12)
    assert np.abs(by_hand - plain).max() > 1e-2  # the adapter matters


def test_turnip_reads_what_peft_trained_and_wrote(folder, tmp_path):
    """peft's own LoRA, trained three AdamW steps by torch, saved by peft: read back with its rank, alpha,
    targets and tensors; no optimizer state (a run from it starts AdamW afresh), and a run goes on from it."""
    torch.manual_seed(1)
    config = peft.LoraConfig(r=2, lora_alpha=6, target_modules=["v_proj", "gate_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base_model(folder, torch.float32), config)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.from_numpy(rows_of(7, 2, 8))
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(tmp_path / "peft")
    theirs = {n.replace(".default", "").removeprefix(PREFIX): p.detach().numpy() for n, p in model.named_parameters() if p.requires_grad}
    with session_for(folder, "torch") as session:
        adapter, state = Adapter.read(tmp_path / "peft", session.config)
        assert state is None
        assert (adapter.settings.rank, adapter.settings.alpha, adapter.settings.targets) == (2, 6.0, ("v_proj", "gate_proj"))
        assert adapter.tensors.keys() == theirs.keys()
        for name, tensor in theirs.items():
            np.testing.assert_array_equal(adapter.tensors[name], tensor)
        assert any(np.abs(t).max() > 0 for n, t in adapter.tensors.items() if "lora_B" in n)  # trained: B moved
        result = finetune(session, rows_of(8, 2, 6), 1, adapter=tmp_path / "peft", engine=engine_for(folder, "torch", adapter.settings))
    assert result.state.adam.step == 1 and result.adapter.settings == adapter.settings


def test_merged_weights_run_the_model_with_a_peft_adapter(folder, tmp_path):
    """A prefill over the weights with an adapter peft trained merged in: the hidden states of peft's model
    with that adapter (float64), on the cpu backend under a budget that offloads."""
    settings = LoraSettings(2, 6, ("q_proj", "o_proj", "up_proj"))
    start = peft_start(folder, tmp_path / "peft", settings)
    ids = rows_of(16, 1, 11)[0]
    model = peft.PeftModel.from_pretrained(base_model(folder), str(start))
    with torch.no_grad():
        theirs = model.base_model.model.model(input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].numpy()
        plain = base_model(folder).model(input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].numpy()
    config = llama.load_config(str(folder))
    adapter, _ = Adapter.read(start, config)
    weights = MergedWeights(llama.CheckpointWeights(folder, config), adapter)
    with Session(config=config, weights=weights, memory=BUDGET, backend="cpu", order="random") as session:
        hidden = session.prefill(ids)
    np.testing.assert_allclose(hidden, theirs, rtol=0, atol=2e-5)  # float32 compute
    assert np.abs(theirs - plain).max() > 1e-2  # the adapter matters


def test_an_adapter_folder_without_what_peft_defaults(folder, tmp_path):
    """target_modules as module paths, r and lora_alpha missing (PEFT's 8 and 8); a folder saved again
    without a state loses the stale one."""
    with session_for(folder, "torch") as session:
        config = session.config
    adapter = random_adapter(config, LoraSettings(8, 8, ("q_proj",)), 3)
    adapter.save(tmp_path / "a", TrainingState())
    doc = json.loads((tmp_path / "a" / CONFIG_FILE).read_text())
    del doc["r"], doc["lora_alpha"]
    (tmp_path / "a" / CONFIG_FILE).write_text(json.dumps({**doc, "target_modules": ["model.layers.0.self_attn.q_proj", "q_proj"]}))
    read, state = Adapter.read(tmp_path / "a", config)
    assert read.settings == LoraSettings(8, 8, ("q_proj",)) and state is not None
    read.save(tmp_path / "a")
    assert not (tmp_path / "a" / STATE_FILE).exists()


@pytest.mark.parametrize("change, message", [
    (lambda doc, t: ({**doc, "target_modules": ["q_proj", "c_attn"]}, t), "targets 'c_attn', which the model lacks"),
    (lambda doc, t: (doc, {**t, f"{PREFIX}model.layers.5.self_attn.q_proj.lora_A.weight": np.zeros((4, 32), np.float32)}),
     "targets layer 5 .* which the model lacks"),
    (lambda doc, t: (doc, {**t, f"{PREFIX}lm_head.lora_A.weight": np.zeros((4, 32), np.float32)}), "is not a LoRA weight of a projection"),
    (lambda doc, t: ({**doc, "r": 3}, t), r"has shape \[4, 32\], the model needs \[3, 32\]"),
    (lambda doc, t: (doc, {**t, f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((16, 4), np.float32)}),
     r"q_proj.lora_B.weight' has shape \[16, 4\], the model needs \[32, 4\]"),
    (lambda doc, t: (doc, {k: v for k, v in t.items() if "layers.1.mlp" not in k}), "has no tensor .*layers.1.mlp.down_proj.lora_A"),
    (lambda doc, t: ({**doc, "use_dora": True}, t), "use_dora true is not supported"),
    (lambda doc, t: ({**doc, "peft_type": "IA3"}, t), "only LORA adapters"),
    (lambda doc, t: ({**doc, "target_modules": ["q_proj", "v_proj"]}, t), "tensor .*down_proj.* is of none of its target_modules"),
])
def test_adapters_the_model_cannot_take_are_refused_in_one_line(folder, tmp_path, change, message):
    from safetensors.numpy import load_file, save_file

    with session_for(folder, "torch") as session:
        config = session.config
    random_adapter(config, SETTINGS, 1).save(tmp_path / "a")
    doc, tensors = change(json.loads((tmp_path / "a" / CONFIG_FILE).read_text()), load_file(tmp_path / "a" / WEIGHTS_FILE))
    (tmp_path / "a" / CONFIG_FILE).write_text(json.dumps(doc))
    save_file(tensors, tmp_path / "a" / WEIGHTS_FILE)
    with pytest.raises(InputError, match=message) as refused:
        Adapter.read(tmp_path / "a", config)
    assert "\n" not in str(refused.value)


# ----- data -------------------------------------------------------------------------------------------------
def test_npy_steps_take_the_next_rows_wrapping_around(tmp_path):
    rows = rows_of(9, 5, 4)
    np.save(tmp_path / "d.npy", rows)
    examples, where = read_examples(tmp_path / "d.npy", None)
    data = TrainingData(examples, VOCAB, None, where)
    for step in range(4):  # batch 2: rows 0 1, 2 3, 4 0, 1 2
        batch = data.batch(2 * step, 2)
        np.testing.assert_array_equal(batch.ids, rows[[(2 * step) % 5, (2 * step + 1) % 5]])
        np.testing.assert_array_equal(batch.labels, batch.ids)
        assert batch.tokens == 8 and batch.predicted == 6


def test_npz_sequences_are_padded_and_the_padding_is_ignored(tmp_path):
    sequences = [np.array([5, 6, 7]), np.array([1, 2, 3, 4, 8, 9]), np.array([10, 11], np.int32)]
    np.savez(tmp_path / "d.npz", *sequences)
    data = TrainingData(*read_examples(tmp_path / "d.npz", None)[:1], VOCAB, None)
    assert data.seq_len == 6
    batch = data.batch(2, 2)  # the third, then the first (wrapping)
    np.testing.assert_array_equal(batch.ids, [[10, 11, 0, 0, 0, 0], [5, 6, 7, 0, 0, 0]])
    np.testing.assert_array_equal(batch.labels, [[10, 11, -100, -100, -100, -100], [5, 6, 7, -100, -100, -100]])
    assert batch.tokens == 5 and batch.predicted == 3
    cut = TrainingData(sequences, VOCAB, 4)
    assert cut.truncated == 1 and cut.batch(1, 1).ids.tolist() == [[1, 2, 3, 4]]


def test_padding_leaves_the_loss_as_transformers_gives_it_for_the_sequence_alone(folder):
    """A padded row's loss equals the loss of the unpadded sequence (causal attention; labels -100)."""
    engine = TorchReferenceEngine(folder, SETTINGS)
    with Session(weights=folder, backend="cpu") as session:
        adapters = Adapter.new(session.config, SETTINGS, 0).tensors
    sequence = rows_of(10, 1, 5)
    ids, labels = padded([sequence[0]], 9)
    alone = base_model(folder)(input_ids=torch.from_numpy(sequence), labels=torch.from_numpy(sequence)).loss.item()
    assert engine.step(adapters, ids, labels)[0] == pytest.approx(alone, rel=1e-6)


def test_jsonl_text_is_tokenized_with_the_folders_tokenizer(tmp_path):
    from test_text import write_folder

    model = write_folder(tmp_path / "m", "byte-level")
    texts = ["Hello world, a tiny corpus.", "Grüße aus Köln 🙂"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    with Session(weights=model, backend="cpu") as session:
        examples, _ = read_examples(tmp_path / "d.jsonl", session.tokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(model)
    assert [list(e) for e in examples] == [theirs(t)["input_ids"] for t in texts]


@pytest.mark.parametrize("make, message", [
    (lambda p: np.save(p / "d.npy", np.array([[1, 2, VOCAB]])), rf"row 0: token id {VOCAB} is outside the vocabulary \[0, {VOCAB}\)"),
    (lambda p: np.save(p / "d.npy", np.array([[1, 2], [3, -1]])), "row 1: token id -1 is outside the vocabulary"),
    (lambda p: np.save(p / "d.npy", np.array([[1], [2]])), "rows of 1 token predict nothing"),
    (lambda p: np.save(p / "d.npy", np.array([[1.0, 2.0]])), "must hold integer token ids"),
    (lambda p: np.save(p / "d.npy", np.array([1, 2, 3])), r"must hold token ids \[rows, T\]"),
    (lambda p: np.savez(p / "d.npz", np.array([1, 2]), np.array([7])), "sequence 1 has 1 token"),
    (lambda p: np.savez(p / "d.npz", np.array([1, 200])), "sequence 0: token id 200 is outside"),
    (lambda p: np.savez(p / "d.npz"), "holds no examples"),
    (lambda p: (p / "d.txt").write_text("hi"), "must be .npy"),
    (lambda p: (p / "d.npy").write_bytes(b"not numpy"), "is not a readable .npy"),
])
def test_bad_data_is_one_line(tmp_path, make, message):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(InputError, match=message) as refused:
        TrainingData(*read_examples(path, None)[:1], VOCAB, None, f"data '{path}'")
    assert "\n" not in str(refused.value)


# ----- the command ---------------------------------------------------------------------------------------
@pytest.fixture
def reference_engine(monkeypatch, folder):
    """`turnip finetune` with the torch reference as its engine (the training graph is not on this branch)."""
    made = []

    def make(session, settings, costs):
        made.append(TorchReferenceEngine(folder, settings))
        return made[-1]

    monkeypatch.setattr(driver, "TurnipEngine", make)
    return made


def turnip(capsys, *args):
    """`turnip finetune ...` in this process: its exit code, stdout and stderr (argparse's errors exit)."""
    try:
        code = main(["finetune", *map(str, args)])
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def base_args(folder: Path, tmp_path: Path, data: Path, out: str = "out") -> list:
    return ["--weights", folder, "--data", data, "--steps", 3, "--memory", "1MiB", "--backend", "cpu", "--adapter-out", tmp_path / out]


def test_cli_writes_the_peft_folder_and_the_log(folder, tmp_path, capsys, reference_engine):
    rows = rows_of(11, 5, 8)
    np.save(tmp_path / "d.npy", rows)
    code, out, err = turnip(capsys, *base_args(folder, tmp_path, tmp_path / "d.npy"), "--batch", 2, "--lr", 1e-2,
                            "--lora-rank", 2, "--lora-targets", "v_proj,q_proj,up_proj", "--seed", 4, "--log", tmp_path / "log.csv")
    assert code == 0, err
    with session_for(folder, "torch") as session:
        expected = finetune(session, rows, 3, rank=2, targets=("q_proj", "v_proj", "up_proj"), batch=2, lr=1e-2, seed=4,
                            engine=TorchReferenceEngine(folder, LoraSettings(2, None, ("q_proj", "v_proj", "up_proj"))))
    with open(tmp_path / "log.csv") as f:
        log = list(csv.DictReader(f))
    assert [int(r["step"]) for r in log] == [1, 2, 3]
    assert [float(r["loss"]) for r in log] == expected.losses
    assert [float(r["lr"]) for r in log] == [1e-2] * 3
    assert all(float(r["tokens_per_s"]) > 0 for r in log)
    adapter, state = Adapter.read(tmp_path / "out", session.config)
    assert adapter.settings == LoraSettings(2, 4, ("q_proj", "v_proj", "up_proj")) and state.adam.step == 3
    assert adapter.base_model == str(folder.resolve())
    for name, tensor in expected.adapter.tensors.items():
        np.testing.assert_array_equal(adapter.tensors[name], tensor)
    assert f"wrote {tmp_path / 'out' / WEIGHTS_FILE}" in out
    loaded = peft.PeftModel.from_pretrained(base_model(folder), str(tmp_path / "out"))
    assert sum(1 for n, _ in loaded.named_parameters() if "lora_A" in n) == 6


def test_cli_goes_on_from_its_adapter(folder, tmp_path, capsys, reference_engine):
    np.save(tmp_path / "d.npy", rows_of(12, 4, 6))
    args = base_args(folder, tmp_path, tmp_path / "d.npy")
    assert turnip(capsys, *args, "--lora-rank", 4)[0] == 0
    code, _, err = turnip(capsys, *base_args(folder, tmp_path, tmp_path / "d.npy", "again"), "--adapter-in", tmp_path / "out",
                          "--log", tmp_path / "log.csv")
    assert code == 0, err
    assert (tmp_path / "log.csv").read_text().splitlines()[1].startswith("4,")
    with Session(weights=folder, backend="cpu") as session:
        assert Adapter.read(tmp_path / "again", session.config)[1].adam.step == 6


@pytest.mark.skipif("turnip" not in ENGINES, reason="needs the training graph (llama.build_training_step)")
def test_cli_with_turnips_engine_equals_torch(folder, tmp_path, capsys):
    """The command as it ships: Turnip's engine in float32 under a budget that offloads, in random orders,
    from an adapter peft wrote; the log's losses and the adapter equal the float64 torch run's."""
    rows = rows_of(15, 6, 12)
    np.save(tmp_path / "d.npy", rows)
    start = peft_start(folder, tmp_path / "start", LoraSettings())
    code, out, err = turnip(capsys, *base_args(folder, tmp_path, tmp_path / "d.npy"), "--memory", "96KiB", "--batch", 2, "--grad-accum", 2,
                            "--lr", 1e-2, "--warmup-steps", 1, "--order", "random", "--adapter-in", start, "--log", tmp_path / "log.csv")
    assert code == 0, err
    assert "offloaded 0 B" not in out
    steps = [[padded(list(rows[[(4 * k + 2 * j + b) % 6 for b in range(2)]]), 12) for j in range(2)] for k in range(3)]
    losses, tensors = torch_run(folder, start, steps, 1e-2, 0.01, 1)
    with open(tmp_path / "log.csv") as f:
        np.testing.assert_allclose([float(r["loss"]) for r in csv.DictReader(f)], losses, rtol=1e-5)
    with Session(weights=folder, backend="cpu") as session:
        adapter, _ = Adapter.read(tmp_path / "out", session.config)
    for name, expected in tensors.items():
        np.testing.assert_allclose(adapter.tensors[name], expected, rtol=0, atol=1e-5, err_msg=name)


def nan_at_step_2(monkeypatch, folder):
    def make(session, settings, costs):
        return Faulty(TorchReferenceEngine(folder, settings), lambda call, scale: "nan-loss" if call == 2 else None)

    monkeypatch.setattr(driver, "TurnipEngine", make)


def peft_folder(folder: Path, path: Path, doc_change=None, tensor_change=None) -> Path:
    with Session(weights=folder, backend="cpu") as session:
        random_adapter(session.config, LoraSettings(2, None, ("q_proj",)), 2).save(path)
    if doc_change:
        doc = json.loads((path / CONFIG_FILE).read_text())
        (path / CONFIG_FILE).write_text(json.dumps(doc_change(doc)))
    if tensor_change:
        from safetensors.numpy import load_file, save_file

        save_file(tensor_change(load_file(path / WEIGHTS_FILE)), path / WEIGHTS_FILE)
    return path


BAD = {
    "id outside the vocabulary": (lambda p, f: [], lambda p: np.save(p / "d.npy", np.array([[3, 4, VOCAB + 5]])),
                                  f"token id {VOCAB + 5} is outside the vocabulary"),
    "row of one token": (lambda p, f: [], lambda p: np.save(p / "d.npy", np.array([[3], [4]])), "predict nothing"),
    "sequence of one token": (lambda p, f: [], lambda p: np.savez(p / "d.npz", np.array([3, 4]), np.array([5])), "sequence 1 has 1 token"),
    "adapter target the model lacks": (lambda p, f: ["--adapter-in", peft_folder(f, p / "in", lambda d: {**d, "target_modules": ["c_attn"]})],
                                       None, "targets 'c_attn', which the model lacks"),
    "adapter of another shape": (lambda p, f: ["--adapter-in", peft_folder(f, p / "in", lambda d: {**d, "r": 3})],
                                 None, r"the model needs \[3, 32\]"),
    "adapter of another layer": (lambda p, f: ["--adapter-in", peft_folder(f, p / "in", None, lambda t: {
        **t, f"{PREFIX}model.layers.2.self_attn.q_proj.lora_A.weight": np.zeros((2, 32), np.float32)})], None, "layer 2"),
    "lr not a number": (lambda p, f: ["--lr", "fast"], None, "argument --lr: must be a positive number, got 'fast'"),
    "lr as a word for infinity": (lambda p, f: ["--lr", "infinity"], None, "argument --lr: must be a positive number"),
    "lr zero": (lambda p, f: ["--lr", "0"], None, "argument --lr: must be a positive number"),
    "lr negative": (lambda p, f: ["--lr", "-0.0001"], None, "argument --lr: must be a positive number"),
    "lr nan": (lambda p, f: ["--lr", "nan"], None, "argument --lr: must be a positive number"),
    "lr inf": (lambda p, f: ["--lr", "inf"], None, "argument --lr: must be a positive number"),
    "adapter-out is adapter-in": (lambda p, f: ["--adapter-in", peft_folder(f, p / "out")], None, "is the --adapter-in folder"),
    "log is the data": (lambda p, f: ["--log", p / "d.npy"], None, "would destroy the input"),
    "log over adapter-in's config": (lambda p, f: ["--adapter-in", peft_folder(f, p / "in"), "--log", p / "in" / CONFIG_FILE], None,
                                     "is a file of --adapter-in .* would destroy the input"),
    "rank against adapter-in": (lambda p, f: ["--adapter-in", peft_folder(f, p / "in"), "--lora-rank", "8"], None,
                                "--lora-rank 8 disagrees with --adapter-in's 2"),
    "seq-len one": (lambda p, f: ["--seq-len", "1"], None, "--seq-len must be at least 2"),
    "sim backend": (lambda p, f: ["--backend", "sim"], None, "the sim backend computes no values"),
    "adapter-out in a missing folder": (lambda p, f: ["--adapter-out", p / "no" / "out"], None, "its folder does not exist"),
    "adapter-out a file": (lambda p, f: ["--adapter-out", p / "d.npy"], None, "is a file; it must be a folder"),
    "steps zero": (lambda p, f: ["--steps", "0"], None, "--steps must be a positive integer"),
}


@pytest.mark.parametrize("case", BAD)
def test_cli_bad_input_is_one_line_and_writes_nothing(folder, tmp_path, capsys, reference_engine, case):
    extra, make_data, message = BAD[case]
    (make_data or (lambda p: np.save(p / "d.npy", rows_of(13, 3, 5))))(tmp_path)
    data = next(p for p in tmp_path.iterdir() if p.suffix in (".npy", ".npz"))
    flags = extra(tmp_path, folder)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    code, _, err = turnip(capsys, *base_args(folder, tmp_path, data), *flags)
    assert code != 0
    assert re.search(message, err), err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    after = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert after == before  # no adapter, no log, nothing touched
    assert not reference_engine or reference_engine[0].calls == 0


def test_cli_text_needs_a_folders_tokenizer(tmp_path, capsys, reference_engine):
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    code, _, err = turnip(capsys, "--config", "tiny", "--data", tmp_path / "d.jsonl", "--steps", 1, "--memory", "1MiB", "--backend", "cpu",
                          "--adapter-out", tmp_path / "out")
    assert code == 1 and err.count("\n") == 1
    assert f"data '{tmp_path / 'd.jsonl'}': text needs the tokenizer of a weights folder" in err
    assert not (tmp_path / "out").exists()


def test_cli_stops_on_a_nan_loss_naming_the_step_and_keeps_the_last_good_adapter(folder, tmp_path, capsys, monkeypatch):
    nan_at_step_2(monkeypatch, folder)
    np.save(tmp_path / "d.npy", rows_of(14, 3, 6))
    code, _, err = turnip(capsys, *base_args(folder, tmp_path, tmp_path / "d.npy"), "--lr", 1e-2, "--log", tmp_path / "log.csv")
    assert code == 1
    line = f"the loss is nan at step 2: stopped, keeping the adapter after step 1 (written to {tmp_path / 'out'})"
    assert err.strip().splitlines() == [f"turnip finetune: error: {line}"]
    with session_for(folder, "torch") as session:
        one = finetune(session, rows_of(14, 3, 6), 1, lr=1e-2, engine=TorchReferenceEngine(folder, LoraSettings()))
        kept, state = Adapter.read(tmp_path / "out", session.config)
    for name, tensor in one.adapter.tensors.items():
        np.testing.assert_array_equal(kept.tensors[name], tensor)
    assert state.adam.step == 1
    assert len((tmp_path / "log.csv").read_text().splitlines()) == 2  # the header and step 1


def test_cli_help_names_every_flag_of_the_issue(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = capsys.readouterr().out
    for flag in ("--weights", "--config", "--data", "--steps", "--memory", "--adapter-out", "--adapter-in", "--lora-rank",
                 "--lora-alpha", "--lora-targets", "--lr", "--weight-decay", "--warmup-steps", "--batch", "--grad-accum",
                 "--seq-len", "--backend", "--gpus", "--order", "--seed", "--dtype", "--log"):
        assert flag in text

"""bench/bench_train.py and its hand baseline, bench/train_baseline.py, on the CPU.

The streaming trainer (weights copied into two buffers layer by layer, inputs kept or offloaded, each layer
recomputed in the backward, the loss in row chunks) gives plain resident autograd's loss and adapter
gradients, and turnip's training step gives the same, in float64 on a small config. The benchmark runs end
to end (`--device cpu --quick` on the tiny-gqa preset) so that the GPU script cannot rot: every system runs,
turnip offloads at its smallest budget, the table and the JSON come out, and turnip's and transformers +
peft's gradients equal the streaming trainer's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from frontend.workloads import llama
from frontend.workloads.llama.train import LoraSpec, build_training_step
from passes.pipeline import compile_taskgraph
from runtime import execute

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import train_baseline as tb


def test_the_streaming_trainer_equals_resident_autograd_and_turnip():
    config = replace(llama.load_config("tiny-gqa"), dtype="float64", num_hidden_layers=4)
    lora = LoraSpec(4, 8.0, ("q_proj", "k_proj", "v_proj", "o_proj"))
    drawn = llama.RandomWeights(config, 1)
    names = [*llama.weight_shapes(config), llama.head_name(config)]
    host = {name: torch.from_numpy(np.array(drawn[name], np.float64)) for name in names}
    rng = np.random.default_rng(0)
    adapters = {name: (0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in lora.shapes(config).items()}  # masters
    ids = rng.integers(0, config.vocab_size, (2, 9))
    reference = tb.ResidentTrainer(torch, config, lora, host, "cpu", loss_scale=8.0)
    masters = reference.masters(adapters)
    loss, want = reference.step(ids, masters), reference.grads(masters)
    for offload in (False, True):
        trainer = tb.StreamingTrainer(torch, config, lora, host, "cpu", loss_scale=8.0, offload_inputs=offload, loss_rows=5)
        masters = trainer.masters(adapters)
        assert trainer.step(ids, masters) == pytest.approx(loss, rel=1e-12)
        assert tb.max_relative_error(trainer.grads(masters), want) < 1e-12
    step = build_training_step(config, 2, 9, lora, block=3)
    outputs = execute(compile_taskgraph(step.graph, 1 << 30), "cpu", inputs=step.feed({n: t.numpy() for n, t in host.items()}, adapters, ids)).outputs
    assert step.loss(outputs) == pytest.approx(loss, rel=1e-8)  # the cpu backend's float64 run is 1e-8 off the formulas
    assert tb.max_relative_error(step.grads(outputs), want) < 1e-6


def _bench(tmp_path, *args: str) -> tuple[str, dict]:
    """`bench_train.py --device cpu --quick --config tiny-gqa ARGS` run to its end: its stdout and its JSON."""
    out = tmp_path / "train.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_train.py"), "--device", "cpu", "--quick", "--config", "tiny-gqa",
                           *args, "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(out.read_text())


def test_the_training_benchmark_runs_end_to_end_on_the_cpu(tmp_path):
    pytest.importorskip("peft")
    stdout, results = _bench(tmp_path, "--steps", "1")
    assert "| 24 | turnip@0.0005 |" in stdout and stdout.rstrip().splitlines()[-1].startswith("wrote ")
    systems = results["points"][0]["systems"]
    assert set(systems) == {"turnip@0.0005", "turnip@0.002", "torch-stream", "torch-stream@0.0005", "torch-stream@0.002", "torch-resident", "hf-peft"}
    assert all("step_s" in figures for figures in systems.values()), systems
    tight = systems["turnip@0.0005"]
    assert tight["offloaded"] > 0 and tight["reloaded"] > 0 and "nondet/fixed" in tight
    for name in ("turnip@0.0005", "turnip@0.002", "torch-resident", "hf-peft"):
        assert systems[name]["grad_error"] < 1e-4, name
        assert systems[name]["loss_error"] < 1e-5, name
    lora = LoraSpec(16, 32.0, ("q_proj", "k_proj", "v_proj", "o_proj"))
    config = replace(llama.load_config("tiny-gqa"), num_hidden_layers=2)
    assert results["adamw"]["adapters"] == sum(a * b for a, b in lora.shapes(config).values())


def test_the_training_benchmark_times_turnip_finetune_in_a_fresh_process(tmp_path):
    _, results = _bench(tmp_path, "--systems", "command", "--budgets", "0.002", "--command-steps", "3")
    command = results["points"][0]["systems"]["command@0.002"]
    assert command["returncode"] == 0 and len(command["steps_s"]) == 3 and command["step_s"] == command["steps_s"][1:]
    assert 0 < command["first_step_s"] < command["wall_s"]


def test_the_training_benchmark_plans_with_advanced_recomputes_when_asked(tmp_path):
    _, results = _bench(tmp_path, "--steps", "1", "--systems", "turnip", "torch-stream", "--remat-advance")
    systems = results["points"][0]["systems"]
    assert results["remat_advance"] is True
    for name in ("turnip@0.0005", "turnip@0.002"):
        assert systems[name]["grad_error"] < 1e-4 and systems[name]["loss_error"] < 1e-5, name

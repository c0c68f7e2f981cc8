"""bench/bench_generate.py end to end on the CPU (`--device cpu --quick` on the tiny-gqa preset), so the GPU
benchmark script cannot rot: every system runs, the table and the JSON come out, and the turnip session's
and the streaming decoder's logits agree with the resident torch decoder's (float32 here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("torch")


def test_the_generation_benchmark_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "generate.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_generate.py"), "--device", "cpu", "--quick", "--config", "tiny-gqa",
                           "--shapes", "3x9", "3x9:ragged", "--budgets", "0.0001", "0.01", "--prefills", "1", "--orders", "nondet", "fixed",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| 3 x 9 | turnip@0.0001 |" in done.stdout and done.stdout.rstrip().splitlines()[-1].startswith("wrote ")
    results = json.loads(out.read_text())
    systems = results["shapes"][0]["systems"]
    assert set(systems) == {"torch-resident", "torch-stream", "floor", "turnip@0.0001", "turnip@0.01", "turnip@0.0001/fixed", "turnip@0.01/fixed"}
    assert all("step_s" in figures for figures in systems.values()), systems
    assert max(systems["torch-stream"]["logit_error_per_step"]) < 1e-4
    tight = systems["turnip@0.0001"]
    assert max(tight["logit_error_per_step"]) < 1e-3 and len(tight["logit_error_per_step"]) == 4
    assert tight["bytes_reloaded_per_step"] > 0 and tight["backends_built"] == 1
    assert tight["prefill_s"] > 0 and systems["turnip@0.01"]["prefill_s"] != systems["turnip@0.01"]["prefill_s"]  # NaN: not timed there
    assert systems["torch-stream"]["tokens"] == systems["torch-resident"]["tokens"]
    assert tight["llama_prefill_s"] > 0 and tight["compiles"] >= 1 and len(tight["step_bytes_placed"]) == 4
    ragged = results["shapes"][1]
    assert ragged["ragged"] and len(set(ragged["lengths"])) > 1
    assert set(ragged["systems"]) == {"turnip@0.0001", "turnip@0.0001/fixed", "turnip@0.01", "turnip@0.01/fixed"}
    assert "| 3 x 9 ragged | turnip@0.01/fixed |" in done.stdout

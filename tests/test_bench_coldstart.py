"""bench/bench_coldstart.py end to end on the CPU (tiny preset, cpu backend), so the GPU benchmark script
cannot rot: the model folder is written, `cp` timed, both turnip processes run and report their phases,
the torch script runs where torch is importable (else its row says so), the table and the JSON come out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # three fresh processes, each importing the toolkit (about 20 s on a 2-core VM)
def test_the_cold_start_benchmark_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "coldstart.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_coldstart.py"), "--config", "tiny", "--tokens", "32",
                           "--memory", "1MiB", "--backend", "cpu", "--torch-device", "cpu", "--folder", str(tmp_path / "m"),
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["cp"]["bytes"] == sum(p.stat().st_size for p in (tmp_path / "m").glob("*.safetensors")) > report["weight_bytes"] > 0
    for name in ("turnip (first process)", "turnip (second process)"):
        run = report["runs"][name]
        assert run["returncode"] == 0 and run["peak_rss"] > 0, run
        assert set(run["phases"]) == {"load", "model", "weights", "compile", "prepare", "run", "wall"}
        assert run["phases"]["wall"] <= run["wall_s"]  # the process's own clock, inside the parent's
        assert f"| {name} | {run['wall_s']:.2f} |" in done.stdout
    torch_run = report["runs"]["torch"]
    if torch_run.get("error") == "skipped: torch is not importable":
        assert "| torch | skipped: torch is not importable |" in done.stdout
    else:
        assert torch_run["returncode"] == 0 and torch_run["finite"] and torch_run["load_s"] > 0, torch_run
        assert report["turnip_over_torch"] > 0
    assert done.stdout.rstrip().splitlines()[-1] == f"wrote {out}"

"""bench/bench_autoplan.py end to end on the CPU (the tiny preset on the sim backend), so the benchmark that
docs/benchmarks.md's "The plan by default" comes from keeps running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_autoplan_prints_a_row_per_point(tmp_path):
    done = subprocess.run([sys.executable, "bench/bench_autoplan.py", "--config", "tiny", "--points", "256:512KiB:16MiB",
                           "--json", str(tmp_path / "rows.json")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 256 at 512KiB / 16MiB |")]
    assert len(rows) == 1 and "layers in halves, blocks of 256" in rows[0]
    (found,) = json.loads((tmp_path / "rows.json").read_text())
    assert found["tokens"] == 256 and found["chosen"]["plan"].startswith("layers in halves, blocks of 256")
    assert f"**{found['chosen']['makespan'] / found['loose_run']['makespan']:.3f}**" in rows[0]
    assert found["again"]["plan"] == found["chosen"]["plan"] and found["forced"]["plan"] == "as forced"

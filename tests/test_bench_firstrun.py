"""bench/bench_firstrun.py end to end on the cpu backend: fresh processes per dtype, their first and warm runs read."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_firstrun_reads_each_fresh_processs_runs(tmp_path):
    out = tmp_path / "firstrun.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_firstrun.py"), "--config", "tiny", "--tokens", "32",
                           "--memory", "1MiB", "--backend", "cpu", "--processes", "1", "--repeats", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [p["dtype"] for p in report["processes"]] == ["float16", "bfloat16"]
    assert all(p["returncode"] == 0 and len(p["runs"]) == 2 and p["compile"] >= 0 for p in report["processes"])
    assert report["summary"]["bf16_over_fp16_first"] > 0
    assert "bf16 first run / fp16 first run" in done.stdout

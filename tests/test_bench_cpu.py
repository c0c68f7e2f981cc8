"""bench/bench_cpu.py in its quick mode, so the CPU benchmark cannot rot: turnip's prefill on the cpu backend
and transformers' LlamaModel agree on the same weights, the table comes out, and a disagreement exits 1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_cpu  # noqa: E402


def test_the_quick_benchmark_agrees_with_transformers_and_prints_both_times(capsys):
    assert bench_cpu.main(["--quick"]) == 0, capsys.readouterr().err
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 layers")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[0] == "2 layers, hidden 128, float32, 64 tokens"
    assert float(cells[5]) > 0 and float(cells[6]) <= bench_cpu.TOLERANCE["float32"]


def test_a_disagreement_with_transformers_exits_1(monkeypatch, capsys):
    monkeypatch.setitem(bench_cpu.TOLERANCE, "float32", 0.0)
    assert bench_cpu.main(["--quick"]) == 1
    assert "disagree" in capsys.readouterr().err

"""bench/investigations/order_headroom.py on the CPU: its key orders are the policies they stand for, the
climb never ends worse than where it starts, and the row it writes says which order was fastest."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "investigations"))

import order_headroom  # noqa: E402
from runtime.graph import build_exec_graph  # noqa: E402
from runtime.policies import make_policy  # noqa: E402

ARGS = ["--config", "7b", "--points", "128@2GiB", "--burst-ms", "1", "5", "--gap-ms", "1", "5", "--random", "2", "--steps", "4"]
"""7b at 128 tokens streams its weights: link-bound, so the bursts matter (as in test_bench_interference)."""


def _graph():
    import run

    built = order_headroom.built_llama("7b", 128)
    return build_exec_graph(run.compile_turnip(built.graph, 2 << 30, built.activation_ids)[0], 2)


def test_the_plan_key_and_nondets_keys_run_as_their_policies():
    graph = _graph()
    windows = {0: order_headroom.bursts_until(1, (1.0, 5.0), (1.0, 5.0), 1.0)}
    spans = order_headroom.headroom(graph, windows, 0.5, seeds=0, steps=0, moves=4, reach=10, rng=random.Random(0))
    assert spans["climb"] == min(spans["plan"], spans["nondet"], spans["critical"])  # no steps: the best start
    nondet = order_headroom.makespan(graph, make_policy("nondet", graph), windows, 0.5)
    assert spans["nondet"] == nondet
    keys = order_headroom.nondet_keys(graph)
    assert order_headroom.makespan(graph, order_headroom.KeyPolicy(graph, keys), windows, 0.5) == nondet


def test_the_climb_keeps_only_what_ends_sooner(tmp_path, capsys):
    out = tmp_path / "headroom.json"
    assert order_headroom.main(ARGS + ["--bursts", "1", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    starts = min(row["plan"], row["nondet"], row["critical"])
    assert row["climb"] <= starts and 0 <= row["climb_kept"] <= 4
    best = min(row[name] for name in ("fixed", "nondet", "random", "plan", "critical", "climb"))
    assert row["fixed_over_best"] == row["fixed"] / best >= 1.0
    assert f"| 128@2GiB | 0 | {row['fixed']:.4f} |" in capsys.readouterr().out

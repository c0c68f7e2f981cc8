"""bench/investigations/link_gaps.py charges each gap on the H2D lane to what held the next copy back,
and the Recorder's trace carries when the loop submitted each vertex."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "investigations"))

from link_gaps import link_gaps  # noqa: E402


def _node(task, inputs=(), mem_deps=()):
    return SimpleNamespace(task=task, inputs=inputs, mem_deps=mem_deps)


def _event(node, cat, ts, dur, submitted):
    return {"ph": "X", "cat": cat, "pid": 0, "tid": 2 if cat == "reload" else 0, "ts": ts, "dur": dur,
            "args": {"node": node, "submitted": submitted}}


def test_each_gap_goes_to_dependencies_host_or_device():
    nodes = [_node("k0"), _node("a"), _node("b", mem_deps=(0,)), _node("c"), _node("d")]
    events = [
        _event(1, "reload", 0, 100, 0),  # no gap
        _event(0, "kernel", 0, 150, 0),  # frees b's room at 150
        _event(2, "reload", 160, 100, 90),  # gap 60 (100..160): queued ahead, its dependency ended at 150
        _event(3, "reload", 300, 100, 290),  # gap 40: nothing to wait for, submitted after the copy before
        _event(4, "reload", 420, 100, 350),  # gap 20: submitted before the copy before ended
    ]
    totals, rows = link_gaps(events, nodes)
    assert totals == {"dependencies": 60, "host": 40, "device": 20}
    assert [r["task"] for r in rows] == ["b", "c", "d"]
    assert rows[0]["ready_after_us"] == 50


def test_the_recorders_trace_names_when_each_vertex_was_submitted():
    from frontend.workloads import llama
    from passes.pipeline import compile_taskgraph
    from runtime import execute

    built = llama.build_llama(llama.load_config("tiny"), 64, 32)
    memgraph = compile_taskgraph(built.graph, 1 << 16, inputs="host")
    recorder = execute(memgraph, backend="sim", verify=False).recorder
    events = [e for e in recorder.trace_events() if e["ph"] == "X"]
    assert events and all(e["args"]["submitted"] <= e["ts"] + 1e-6 for e in events)
    totals, rows = link_gaps(events, memgraph.nodes)
    assert sum(totals.values()) == sum(r["gap_us"] for r in rows)

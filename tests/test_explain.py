"""`turnip explain` and turnip_ir/explain.py: every reload of a plan gets its cause, read back from the plan.

A hand-written memgraph pins each cause exactly (host input, offloaded eviction, eviction with the host
copy already there, a repack); compiled random plans are checked against the definitions, recomputed
here by brute force; the command prints, filters, writes JSON and fails in one line.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from turnip_cli.main import main
from turnip_ir.explain import explain_offloads
from turnip_ir.memgraph import MemGraph, MemNode
from tools.random_graphs import random_taskgraph


def _node(i, op, task, device, loc=None, storage=None, inputs=(), kernel=None):
    return MemNode(i, op, task, device, loc, storage, tuple(inputs), kernel=kernel or ("relu" if op == "kernel" else None),
                   shape=(2,), dtype="float32")


def _plan() -> MemGraph:
    """GPU 0 with three 8-byte slots at 0, 8 and 16; w starts in host storage.

    a is evicted to make room for b, offloaded (2) and reloaded (5) for d; a is evicted again for e
    (host memory holds it: no offload) and reloaded (8) for f; c is cleared without being overwritten
    before its reload (10): a repack."""
    graph = MemGraph(1, 24)
    graph.nodes = [
        _node(0, "input", "x", 0, loc=(0, 8)),
        _node(1, "kernel", "a", 0, loc=(8, 8), inputs=[0]),
        _node(2, "offload", "a", 0, storage=(0, 8), inputs=[1]),
        _node(3, "kernel", "b", 0, loc=(8, 8), inputs=[0]),       # over a
        _node(4, "input", "w", None, storage=(8, 8)),
        _node(5, "reload", "a", 0, loc=(16, 8), inputs=[2]),
        _node(6, "kernel", "d", 0, loc=(0, 8), inputs=[5, 3]),    # over x
        _node(7, "kernel", "e", 0, loc=(16, 8), inputs=[6]),      # over the reloaded a
        _node(8, "reload", "a", 0, loc=(8, 8), inputs=[2]),       # over b
        _node(9, "kernel", "f", 0, loc=(0, 8), inputs=[8, 7]),    # over d
        _node(10, "reload", "w", 0, loc=(16, 8), inputs=[4]),     # over e
        _node(11, "kernel", "g", 0, loc=(8, 8), inputs=[10, 9]),  # over the second a
        _node(12, "offload", "g", 0, storage=(16, 8), inputs=[11]),
    ]
    graph.outputs = {"g": 12}
    return graph


def test_each_cause_is_named_exactly() -> None:
    report = explain_offloads(_plan())
    first, second, host = report.reloads
    assert (first.cause, first.evicted_copy, first.displaced_by, first.offload, first.needed_by) == ("evicted", 1, 3, 2, 6)
    assert first.kernels_away == 0  # b (3) evicted it; d (6) needs it next, with no kernel between
    assert (second.cause, second.evicted_copy, second.displaced_by, second.offload, second.needed_by) == ("evicted", 5, 7, None, 9)
    assert (host.cause, host.evicted_copy, host.needed_by) == ("host input", None, 11)
    assert report.kept_in_host == [12]
    lines = [report.line(r) for r in report.reloads]
    assert lines[0] == ("node 5 reload a (8 B, GPU 0) for d (relu): evicted at node 3 to make room for b (relu), "
                        "used again after 0 other kernels; offloaded by node 2")
    assert lines[1].endswith("evicted at node 7 to make room for e (relu), used again after 0 other kernels; host memory already held it")
    assert lines[2] == "node 10 reload w (8 B, GPU 0) for g (relu): starts in host memory"
    summary = "\n".join(report.summary_lines())
    assert "2 offloads (16 B), 3 reloads (24 B)" in summary
    assert "1 reload of inputs that start in host memory" in summary
    assert "2 reloads after an eviction (16 B): 1 offloaded when evicted, 1 dropped because host memory held them" in summary
    assert "1 offload never reloaded" in summary


def test_a_copy_cleared_without_an_overwrite_is_a_repack() -> None:
    graph = MemGraph(1, 16)
    graph.nodes = [
        _node(0, "input", "x", 0, loc=(0, 8)),
        _node(1, "kernel", "a", 0, loc=(8, 8), inputs=[0]),
        _node(2, "offload", "a", 0, storage=(0, 8), inputs=[1]),
        _node(3, "kernel", "b", 0, loc=(0, 8), inputs=[0]),      # over x, not over a
        _node(4, "kernel", "c", 0, loc=(0, 8), inputs=[3]),
        _node(5, "reload", "a", 0, loc=(8, 8), inputs=[2]),      # a's old place, overwritten only now
        _node(6, "kernel", "d", 0, loc=(0, 8), inputs=[5, 4]),
    ]
    (reload,) = explain_offloads(graph).reloads
    assert (reload.cause, reload.displaced_by, reload.offload) == ("evicted", None, 2)
    assert reload.kernels_away == 2  # from a's last reader (none: a itself, node 1) to d: b and c between
    assert "evicted after node 1 to repack the GPU" in explain_offloads(graph).line(reload)


def _overlaps(a: MemNode, b: MemNode) -> bool:
    return a.device == b.device and a.loc[0] < b.loc[0] + max(b.loc[1], 1) and b.loc[0] < a.loc[0] + max(a.loc[1], 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3), st.sampled_from((1.0, 1.1, 1.5)), st.sampled_from(("gpu", "host")))
def test_compiled_plans_are_explained_by_the_definitions(seed: int, devices: int, factor: float, inputs: str) -> None:
    """Brute force, independent of the sweep: every reload once; a host input had no GPU copy before;
    an eviction's copy is the last GPU copy of the tensor on that GPU, its displacer the first later
    writer over it (before the reload), its offload reads it, and without one host memory held it."""
    graph = place_devices(random_taskgraph(seed, tasks=40, devices=devices, sizes=(8, 16, 24), move_prob=0.2))
    memgraph = compile_taskgraph(graph, int(minimum_budget(graph) * factor), inputs=inputs)
    nodes = memgraph.nodes
    report = explain_offloads(memgraph)
    assert [r.node for r in report.reloads] == [n.id for n in nodes if n.op == "reload"]
    for r in report.reloads:
        k = r.node
        copies = [n for n in nodes[:k] if n.task == r.task and n.device == r.device and n.loc is not None]
        readers = [n.id for n in nodes if k in n.inputs]
        assert r.needed_by == (readers[0] if readers else None)
        if r.cause == "host input":
            assert not copies
            assert any(n.task == r.task and n.storage is not None for n in nodes[:k])
            continue
        copy = copies[-1]
        assert r.evicted_copy == copy.id
        writers = [n for n in nodes[copy.id + 1:] if n.loc is not None and _overlaps(n, copy)]
        assert r.displaced_by == (writers[0].id if writers and writers[0].id < k else None)
        offloads = [n.id for n in nodes if n.op == "offload" and n.inputs == (copy.id,)]
        assert r.offload == (offloads[0] if offloads else None)
        if r.offload is None:
            assert any(n.task == r.task and n.storage is not None for n in nodes[:k])
        assert r.kernels_away is None or r.kernels_away >= 0
    for k in report.kept_in_host:
        offload = nodes[k]
        assert not any(n.op == "reload" and n.task == offload.task and n.device == offload.device for n in nodes[k:])


def test_the_command_prints_the_summary_and_the_reasons(capsys) -> None:
    assert main(["explain", "examples/blocked_matmul.json", "--memory", "300KiB", "--backend", "cpu", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "GPU 1: budget 300.00 KiB; 3 offloads (192.00 KiB), 3 reloads (192.00 KiB)" in out
    assert "node 20 reload B[0,0] (64.00 KiB, GPU 0) for B[0,0].to1 (move): evicted at node 12 to make room for C[0,0] (add)" in out
    assert out.rstrip().endswith("... 3 more reloads (--limit 0 prints every one)")


def test_the_command_filters_and_writes_json(tmp_path, capsys) -> None:
    plan = tmp_path / "plan.json"
    assert main(["explain", "examples/ffn.json", "--memory", "400000", "--backend", "cpu", "--tensor", "w2.*",
                 "--limit", "0", "--json", str(plan)]) == 0
    out = capsys.readouterr().out
    reload_lines = [line for line in out.splitlines() if line.startswith("node ")]
    assert len(reload_lines) == 3 and all(" reload w2." in line for line in reload_lines)
    doc = json.loads(plan.read_text())
    assert len(doc["reloads"]) == 6 and {r["cause"] for r in doc["reloads"]} == {"host input"}


@pytest.mark.parametrize("argv, message", [
    (["explain", "missing.json"], "turnip explain: error: missing.json: no such file"),
    (["explain", "examples/ffn.json"], "a taskgraph needs --memory to be compiled"),
    (["explain", "examples/ffn.json", "--memory", "400000", "--backend", "cpu", "--tensor", "zz*"], "--tensor 'zz*': no reload"),
    (["explain", "examples/ffn.json", "--memory", "400000", "--backend", "cpu", "--gpu", "3"], "--gpu 3: the plan has GPUs 0 to 0"),
    (["explain", "examples/ffn.json", "--memory", "10", "--backend", "cpu"], "needs"),
])
def test_bad_input_is_one_line(argv, message, capsys) -> None:
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_pictures_reloads_carry_their_reason_as_a_tooltip() -> None:
    from turnip_ir.dot import memgraph_dot

    source = memgraph_dot(_plan()).source
    assert 'tooltip="node 10 reload w (8 B, GPU 0) for g (relu): starts in host memory"' in source
    assert source.count("tooltip=") == 3

"""Inputs read only in part (`execute(..., partial=...)`): a run that reads only the leading rows of an
input places and reloads only those (a decode step's last cache column, filled only so far).

What must hold: the outputs are the same as a run that copies everything, whatever the rest of the
tensor's memory holds; the bytes counted and (on the sim) the time charged are those of the rows moved;
a session's decode gives the same tokens with fewer bytes reloaded than whole columns would take."""

from __future__ import annotations

import numpy as np
import pytest

import runtime.api
from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.backends import make_backend
from runtime.residency import copy_limits, leading_flat_rows, partial_placements
from runtime.graph import build_exec_graph
from turnip import Session
from turnip_ir.taskgraph import TaskGraph

ROWS, WIDTH, READ = 32, 16, 5


def _graph() -> TaskGraph:
    """x [ROWS, 2, WIDTH]: one kernel reads its first READ rows (kernel `rows`), another uses all of w."""
    g = TaskGraph()
    x = g.input((ROWS, 2, WIDTH), "float64", id="x")
    w = g.input((64, WIDTH), "float64", id="w")
    head = g.kernel("rows", x, start=0, stop=READ, id="head")
    g.kernel("relu", w, id="y")
    g.output(head, "y")
    return g


def _inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((ROWS, 2, WIDTH)), "w": rng.standard_normal((64, WIDTH))}


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("start", ["host", "recur", "gpu"], ids=["host-start", "recur-start", "device-start"])
def test_a_partial_input_gives_the_same_outputs_and_counts_what_moved(start, backend):
    """On the cpu backend and the cuda one (numba-cuda's simulator: its limited copies are sliced views)."""
    plan = compile_taskgraph(_graph(), 64 * WIDTH * 8 * 3, inputs=start)
    values = _inputs()
    whole = execute(plan, backend, order="random", seed=1, inputs=values)
    part = execute(plan, backend, order="random", seed=1, inputs=values, partial={"x": READ})
    for name in ("head", "y"):
        np.testing.assert_array_equal(part.outputs[name], whole.outputs[name])
    np.testing.assert_array_equal(part.outputs["head"], values["x"][:READ])
    row = 2 * WIDTH * 8
    saved = whole.summary.bytes_reloaded - part.summary.bytes_reloaded
    placed = whole.summary.bytes_placed + whole.summary.bytes_staged - part.summary.bytes_placed - part.summary.bytes_staged
    assert saved + placed > 0 and (saved + placed) % ((ROWS - READ) * row) == 0  # each copy of x moved READ rows, not ROWS


def test_partial_rows_past_the_prefix_are_never_copied_on_a_prepared_backend():
    """Run once whole, then with x's tail poisoned (NaN) and only its head read: the head's outputs are
    the new values, and nothing NaN reached the output (the kernel reads no row past READ)."""
    plan = compile_taskgraph(_graph(), 64 * WIDTH * 8 * 3, inputs="host")
    backend = make_backend("cpu", seed=0)
    try:
        first = _inputs(0)
        execute(plan, backend, inputs=first, close=False, verify=False)
        second = _inputs(1)
        second["x"][READ:] = np.nan
        got = execute(plan, backend, order="random", seed=3, inputs=second, close=False, verify=False, partial={"x": READ})
        np.testing.assert_array_equal(got.outputs["head"], second["x"][:READ])
    finally:
        backend.close()


def test_the_sim_charges_only_the_rows_moved():
    g = TaskGraph()  # x's reload (16 MiB) is the run: a quarter of it read is about a quarter of the time
    x = g.input((4096, 2, 256), "float64", id="x")
    g.output(g.kernel("rows", x, start=0, stop=1024, id="head"))
    plan = compile_taskgraph(g, 64 << 20, inputs="host")
    whole = execute(plan, "sim", inputs=None)
    part = execute(plan, "sim", inputs=None, partial={"x": 1024})
    assert part.summary.bytes_reloaded * 4 == whole.summary.bytes_reloaded == 16 << 20
    assert part.summary.makespan < 0.4 * whole.summary.makespan


def test_copy_limits_name_only_reloads_of_partial_inputs_and_placements_only_their_rows():
    plan = compile_taskgraph(_graph(), 64 * WIDTH * 8 * 3, inputs="host")
    graph = build_exec_graph(plan)
    limits = copy_limits(graph, {"x": READ, "w": 1000})
    assert limits and all(graph.node(v).op == "reload" and graph.node(graph.sources[v][0]).task == "x" for v in limits)
    assert set(limits.values()) == {READ}
    assert copy_limits(graph, {"x": ROWS}) == {}  # every row read: nothing to limit
    head = leading_flat_rows((ROWS, 2, WIDTH), READ)
    assert partial_placements(plan, {"x": READ}, {}, {}) == ({"x": [(0, head)]}, {"x": READ})
    assert partial_placements(plan, {"x": READ}, {"x": None}, {}) == ({"x": None}, {})  # in place whole: nothing to copy
    # in place only to 3 rows, one row written since (flat rows 8-9): rows 3 to READ are copied with it
    assert partial_placements(plan, {"x": READ}, {"x": [(8, 10)]}, {"x": 3}) == ({"x": [(6, head)]}, {"x": READ})
    assert partial_placements(plan, {}, {"x": None}, {"x": 3}) == ({"x": [(6, 2 * ROWS)]}, {})  # read whole now
    assert leading_flat_rows((ROWS, 2, WIDTH), 3) == 6 and leading_flat_rows((7,), 3) == 3


def test_a_session_decodes_the_same_tokens_moving_less(monkeypatch):
    """tiny-gqa under a budget that streams the cache: the same tokens as with whole columns, fewer bytes."""
    prompts = [np.arange(1, 20) % 200, np.arange(3, 12) % 200]

    def run():
        with Session(config="tiny-gqa", memory=100 << 10, backend="cpu", order="random", seed=2, kv_block=16) as s:
            return s.generate(prompts, 6)

    part = run()
    monkeypatch.setattr(runtime.api, "copy_limits", lambda graph, partial: {})
    monkeypatch.setattr(runtime.api, "partial_placements", lambda memgraph, partial, kept, valid, inputs=None, rows_of=None: (kept, {}))
    whole = run()
    np.testing.assert_array_equal(part.tokens, whole.tokens)
    assert whole.bytes_reloaded > 0
    assert part.bytes_reloaded + part.bytes_placed < whole.bytes_reloaded + whole.bytes_placed


def test_an_input_in_place_only_in_part_is_completed_when_a_run_reads_more():
    """Run 1 places x's first 5 rows only (it claims its kernel reads no more); run 2 says x is unchanged
    and reads 10 rows: the 5 rows never placed are copied then, not taken as in place."""
    g = TaskGraph()
    x = g.input((ROWS, 2, WIDTH), "float64", id="x")
    g.output(g.kernel("rows", x, start=0, stop=10, id="head"))
    plan = compile_taskgraph(g, 1 << 20, inputs="recur")
    values = {"x": _inputs()["x"]}
    backend = make_backend("cpu", seed=0)
    try:
        execute(plan, backend, inputs=values, close=False, verify=False, partial={"x": 5})
        assert backend.held().rows == {"x": 5}
        got = execute(plan, backend, inputs=values, close=False, verify=False, unchanged=["x"], partial={"x": 10})
        np.testing.assert_array_equal(got.outputs["head"], values["x"][:10])
        assert got.summary.bytes_placed == 5 * 2 * WIDTH * 8 and backend.held().rows == {"x": 10}
        got = execute(plan, backend, inputs=values, close=False, verify=False, unchanged=["x"])  # whole now
        np.testing.assert_array_equal(got.outputs["head"], values["x"][:10])
        assert got.summary.bytes_placed == (ROWS - 10) * 2 * WIDTH * 8 and backend.held().rows == {}
    finally:
        backend.close()

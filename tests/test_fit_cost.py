"""The cost-model fit (bench/fit_cost.py) and the sim's host time: the fit recovers the parameters that
made synthetic measurements, points are read from results files as bench/run.py writes them, and the
sim charges the event loop's time per vertex and the completion notice latency."""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.backends.sim import COPY_QUEUE_DEPTH, QUEUE_DEPTH, SimBackend
from turnip_ir.cost import CostModel
from turnip_ir.taskgraph import TaskGraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import fit_cost  # noqa: E402


def _chain(kind: str, n: int, size: int, dtype: str):
    """A compiled memgraph of `n` dependent kernels on one GPU: matmuls (x @ w) or relus."""
    g = TaskGraph(devices=1)
    x = g.input((size, size), dtype, device=0, id="x")
    w = g.input((size, size), dtype, device=0, id="w") if kind == "matmul" else None
    for _ in range(n):
        x = g.matmul(x, w) if kind == "matmul" else g.relu(x)
    g.output(x)
    return compile_taskgraph(g, 1 << 34)


def _point(workload: str, measured: float) -> fit_cost.Point:
    return fit_cost.Point(workload, "float16", 0, 1.0, "nondet", "given", measured, (measured,), ("synthetic",))


def test_the_fit_recovers_the_parameters_that_made_the_measurements():
    graphs = {"gemm": _chain("matmul", 8, 2048, "float16"), "tiny": _chain("relu", 40, 64, "float16")}
    no_host = CostModel(host_per_vertex=0.0, notify_latency=0.0)
    truth = replace(no_host, half_flops=610e12, launch=6e-6)

    def simulate(point, cost):
        return execute(graphs[point.workload], backend="sim", cost=cost, verify=False).summary.makespan

    points = [_point(name, simulate(_point(name, 1.0), truth)) for name in graphs]
    start = replace(no_host, half_flops=750e12, launch=10e-6)
    assert fit_cost.worst_error(points, simulate, start)[0] > 0.1  # the start is far off
    fitted = fit_cost.fit(points, simulate, start, free=("half_flops", "launch"))
    assert fitted.half_flops == pytest.approx(610e12, rel=0.02)
    assert fitted.launch == pytest.approx(6e-6, rel=0.02)
    assert fit_cost.worst_error(points, simulate, fitted)[0] < 0.005


def _run(**fields) -> dict:
    base = {"workload": "llama", "tokens": 8192, "budget": 2.0, "system": "turnip-nondet", "gpus": 1,
            "notifier": "hostfunc-side", "attention": "auto", "copy_depth": 4, "schedule": "given"}
    return base | fields


def test_points_are_the_current_runtimes_runs_one_per_point_at_the_median_of_its_calls(tmp_path):
    calls = [[_run(seconds=0.25), _run(system="turnip-fixed", seconds=0.24), _run(system="floor", seconds=0.2)],
             [_run(seconds=0.27), _run(notifier="hostfunc", seconds=0.30), _run(workload="llama-bfloat16", seconds=0.26)],
             [_run(seconds=0.24), _run(gpus=2, seconds=0.15), _run(budget=1.0, error="does not fit")]]
    paths = []
    for i, runs in enumerate(calls):
        paths.append(tmp_path / f"h200-call{i}.json")
        paths[-1].write_text(json.dumps({"runs": runs}))
    points = {p.label: p for p in fit_cost.measured_points(paths)}
    assert sorted(points) == ["llama 8k 2 GiB fixed", "llama 8k 2 GiB nondet", "llama bfloat16 8k 2 GiB nondet"]
    assert points["llama 8k 2 GiB nondet"].measured == 0.25 and points["llama 8k 2 GiB nondet"].calls == (0.25, 0.27, 0.24)


def test_points_carry_llamas_build_and_leave_out_plans_that_start_weights_on_the_gpu(tmp_path):
    plain = tmp_path / "h200-plain.json"
    plain.write_text(json.dumps({"runs": [_run(seconds=0.25), _run(inputs="gpu", seconds=0.22)]}))
    halves = tmp_path / "h200-halves.json"
    halves.write_text(json.dumps({"workloads": {"8192": {"block": 2048, "layer_order": "halves", "query_group": 2}},
                                  "runs": [_run(seconds=0.3)]}))
    points = {p.label: p for p in fit_cost.measured_points([plain, halves])}
    assert sorted(points) == ["llama 8k 2 GiB nondet", "llama 8k 2 GiB nondet, block 2048, halves, query group 2"]
    assert points["llama 8k 2 GiB nondet"].calls == (0.25,)  # the GPU-start run is not the same plan
    built = points["llama 8k 2 GiB nondet, block 2048, halves, query group 2"]
    assert (built.block, built.layer_order, built.query_group) == (2048, "halves", 2)


def test_runs_on_a_disturbed_link_are_not_points_and_the_lanes_depth_is_part_of_a_point(tmp_path):
    """A run whose copies moved under 90% of its call's H2D ceiling while its copy engine was busy 90% or
    more is tabled apart (`on_disturbed_machine`); so slow a rate on an idle engine, or a rate at 90%, counts.
    The compute lanes' depth splits points, and the sim runs each at its own."""
    busy, idle = {"h2d": 0.99}, {"h2d": 0.5}
    runs = [_run(seconds=0.25, h2d_rate=54.9e9, engine_busy=busy),
            _run(system="turnip-fixed", seconds=0.27, h2d_rate=48.1e9, engine_busy=busy),
            _run(budget=4.0, seconds=0.24, h2d_rate=48.1e9, engine_busy=idle),
            _run(budget=8.0, seconds=0.24, h2d_rate=49.9e9, engine_busy=busy),
            _run(budget=8.0, seconds=0.22, queue_depth=3)]
    path = tmp_path / "h200-call.json"
    path.write_text(json.dumps({"ceilings": {"h2d": 55.4e9}, "runs": runs}))
    points = {p.label: p for p in fit_cost.measured_points([path])}
    assert set(points) == {"llama 8k 2 GiB nondet", "llama 8k 4 GiB nondet", "llama 8k 8 GiB nondet", "llama 8k 8 GiB nondet, lanes 3 deep"}
    assert points["llama 8k 8 GiB nondet, lanes 3 deep"].queue_depth == 3 and points["llama 8k 8 GiB nondet"].queue_depth == 2
    assert {p.label for p in fit_cost.measured_points([path], keep=fit_cost.on_disturbed_machine)} == {"llama 8k 2 GiB fixed"}
    unknown = tmp_path / "h200-old.json"  # no ceiling in the file: nothing to judge the rate by
    unknown.write_text(json.dumps({"runs": runs[1:2]}))
    assert {p.label for p in fit_cost.measured_points([unknown])} == {"llama 8k 2 GiB fixed"}


def test_runs_whose_repeats_spread_beyond_seven_percent_are_tabled_apart(tmp_path):
    """Five repeats of one plan from 0.240 to 0.268 s (11.7%) are unsteady: not a point, tabled apart; 6%
    is a point, and so is a run of two repeats however far apart (too few to judge)."""
    runs = [_run(seconds=0.25, makespans=[0.240, 0.250, 0.268, 0.245, 0.25]),
            _run(budget=4.0, seconds=0.24, makespans=[0.240, 0.2544, 0.245]),
            _run(budget=8.0, seconds=0.24, makespans=[0.20, 0.30])]
    path = tmp_path / "h200-call.json"
    path.write_text(json.dumps({"ceilings": {"h2d": 55.4e9}, "runs": runs}))
    assert {p.label for p in fit_cost.measured_points([path])} == {"llama 8k 4 GiB nondet", "llama 8k 8 GiB nondet"}
    assert {p.label for p in fit_cost.measured_points([path], keep=fit_cost.on_disturbed_machine)} == {"llama 8k 2 GiB nondet"}


def test_the_sim_prices_rope_as_the_runs_read_it(tmp_path):
    """Runs that do not say how rope ran read it element by element, and the sim prices their rope at
    ELEMENT_ROPE_SHARE of HBM; runs by quads at the model's own share."""
    path = tmp_path / "h200-call.json"
    path.write_text(json.dumps({"runs": [_run(seconds=0.25), _run(seconds=0.24, rope="quads")]}))
    points = {p.rope: p for p in fit_cost.measured_points([path])}
    assert set(points) == {"elements", "quads"} and points["quads"].label == "llama 8k 2 GiB nondet, rope by quads"
    g = TaskGraph(devices=1)
    x = g.input((4096, 4096), "float16", device=0, id="x")
    c = g.input((4096, 128), "float16", device=0, id="c")
    g.output(g.rope(x, c, c, device=0))
    memgraph = compile_taskgraph(g, 1 << 30)
    simulate = fit_cost.Simulator()
    simulate.memgraphs = {k: memgraph for k in ((p.workload, p.dtype, p.tokens, p.budget, p.schedule, p.block, p.layer_order,
                                                 p.query_group, p.arena, p.inputs) for p in points.values())}
    cost = CostModel(host_per_vertex=0.0, notify_latency=0.0)
    slow, fast = simulate(points["elements"], cost), simulate(points["quads"], cost)
    assert cost.memory_share("rope") > fit_cost.ELEMENT_ROPE_SHARE
    assert slow / fast == pytest.approx(cost.memory_share("rope") / fit_cost.ELEMENT_ROPE_SHARE, rel=0.05)


def test_the_sim_charges_the_loop_more_for_half_precision_attention_links():
    def links(dtype: str):
        g = TaskGraph(devices=1)
        q = g.input((16, 64), dtype, device=0, id="q")
        prev = g.attention(q, q, q, heads=2, kv_heads=2, final=False)
        for _ in range(9):
            prev = g.attention(q, q, q, prev, heads=2, kv_heads=2, final=False)
        g.output(prev)
        return compile_taskgraph(g, 1 << 30)

    def makespan(memgraph, extra: float) -> float:
        cost = CostModel(host_per_vertex=0.0, notify_latency=0.0, host_per_attention=extra)
        return execute(memgraph, backend="sim", cost=cost, verify=False).summary.makespan

    half, single = links("float16"), links("float32")
    assert makespan(half, 1e-3) >= 9 * 1e-3 > makespan(half, 0.0)  # ten tiny links a millisecond of loop each: nine gaps
    assert makespan(single, 1e-3) == makespan(single, 0.0)  # no torch launch there


def test_the_physical_rates_come_from_the_measured_results():
    rates = fit_cost.physical_rates()
    assert 50e9 < rates["h2d_bw"] < 60e9 and 50e9 < rates["d2h_bw"] < 60e9
    assert 600e12 < rates["half_flops"] < 800e12  # the FFN trace's GEMMs on the H200
    assert 10e-6 < rates["host_per_vertex"] < 100e-6 and 0 < rates["notify_latency"] < 100e-6


def test_many_tiny_vertices_take_at_least_the_host_time_of_each():
    memgraph = _chain("relu", 200, 8, "float32")
    host = 50e-6
    cost = CostModel(host_per_vertex=host, notify_latency=0.0)
    makespan = execute(memgraph, backend="sim", cost=cost, verify=False).summary.makespan
    free = execute(memgraph, backend="sim", cost=replace(cost, host_per_vertex=0.0), verify=False).summary.makespan
    assert makespan >= 199 * host  # the first starts after its own submit: 200 submits, 199 gaps
    assert free < 200 * cost.launch * 1.01 < 199 * host


def test_a_plain_event_loop_pays_host_time_and_notice_latency_between_dependent_vertices():
    memgraph = _chain("relu", 10, 8, "float32")
    cost = CostModel(host_per_vertex=30e-6, notify_latency=20e-6)
    backend = SimBackend(cost=cost, lookahead=False)
    result = execute(memgraph, backend=backend, cost=cost, verify=False)
    kernel = cost.launch + 2 * 8 * 8 * 4 / cost.hbm_bw
    # each vertex is submitted when the loop has learned that the one before ended: 10 kernels, 9 round trips
    assert result.summary.makespan == pytest.approx(10 * kernel + 9 * (20e-6 + 30e-6), rel=1e-9)


def test_the_sim_is_deterministic_for_a_seed_with_host_time_and_jitter():
    memgraph = _chain("relu", 30, 8, "float32")
    runs = [execute(memgraph, backend=SimBackend(jitter=0.3, seed=seed), verify=False).summary.makespan for seed in (5, 5, 6)]
    assert runs[0] == runs[1] != runs[2]


def test_the_sims_queue_depths_are_the_cuda_backends():
    from runtime.backends.cuda import CudaBackend

    defaults = inspect.signature(CudaBackend.__init__).parameters
    assert (QUEUE_DEPTH, COPY_QUEUE_DEPTH) == (defaults["queue_depth"].default, defaults["copy_queue_depth"].default)


@pytest.mark.parametrize("order", ["nondet", "fixed", "random"])
def test_queued_ahead_no_vertex_starts_before_its_dependencies_end(order):
    from tools.synthetic import random_memgraph

    memgraph = random_memgraph(3, vertices=300, devices=2)
    result = execute(memgraph, backend="sim", order=order, seed=2, verify=False)
    spans = {c.vertex: (c.start, c.end) for c in result.recorder.completions}
    index = {node.id: i for i, node in enumerate(memgraph.nodes)}
    checked = 0
    for i, node in enumerate(memgraph.nodes):
        for dep in node.deps():
            if index[dep] in spans and i in spans:
                assert spans[i][0] >= spans[index[dep]][1] - 1e-12, (node.id, dep)
                checked += 1
    assert checked > 100

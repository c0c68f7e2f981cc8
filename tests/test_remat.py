"""Rematerialization (`remat`): the planner recomputes an evicted tensor at its next use instead of
offloading and reloading it, where its cost model says that is cheaper.

A hand-made case where the recompute must be chosen (a slow host link) and two where it must not (the
H200 rates on tiny tiles; an operand nobody needs any more); the plan runs on every backend; the
verifier and the oracle reject a recompute whose operand was overwritten; and hypothesis over random
taskgraphs, budgets and schedules with remat on: every plan verifies, satisfies the oracle and equals the
float64 formulas in random orders, by the sequential interpreter and by the cpu backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interp import execute as interpret
from interp import input_values
from kernel_formulas import evaluate
from oracle import violations

from passes import planner
from passes.compile_stats import CompileStats
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from passes.schedules import SCHEDULES
from runtime import execute
from tools.random_graphs import random_taskgraph
from turnip_ir.cost import CostModel
from turnip_ir.dot import memgraph_dot
from turnip_ir.errors import VerifyError
from turnip_ir.explain import explain_offloads
from turnip_ir.io import graph_text, module_to_graph, parse_ir, parse_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.verifier import verify_memgraph

TILE = 16 * 16 * 4
SLOW_LINK = CostModel(h2d_bw=1e6, d2h_bw=1e6, launch=0.0)
"""A host link so slow that recomputing beats moving whenever the operands are at hand."""


def _b_needed_again() -> TaskGraph:
    """Five tiles live at 'd' with room for four: 'b' (scale of x), needed again by 'f', must leave after
    'c' reads it; 'x', its operand, is read by 'd' anyway, so recomputing 'b' needs nothing moved."""
    g = TaskGraph(1)
    x = g.input((16, 16), id="x")
    a = g.relu(x, device=0, id="a")
    b = g.scale(x, 0.5, device=0, id="b")
    c = g.add(a, b, device=0, id="c")
    d = g.mul(c, x, device=0, id="d")
    e = g.add(d, a, device=0, id="e")
    g.add(e, b, device=0, id="f")
    g.output("f")
    return g


def _ops(memgraph: MemGraph, task: str) -> list[str]:
    return [node.op for node in memgraph.nodes if node.task == task]


def test_a_slow_link_recomputes_instead_of_moving():
    graph = _b_needed_again()
    stats = CompileStats()
    memgraph = compile_taskgraph(graph, 4 * TILE, remat=True, cost=SLOW_LINK, stats=stats)
    assert _ops(memgraph, "b") == ["kernel", "kernel"]  # no offload, no reload
    again = memgraph.recomputes()
    assert [node.task for node in again] == ["b"]
    assert memgraph.by_id()[again[0].inputs[0]].task == "x"
    assert (stats.recomputes, stats.bytes_recomputed, stats.ops["offload"], stats.ops["reload"]) == (1, TILE, 0, 0)
    assert "recomputes" in stats.table()
    verify_memgraph(memgraph, place_devices(graph))
    assert violations(memgraph, place_devices(graph)) == []


def test_without_remat_the_same_graph_moves_b():
    memgraph = compile_taskgraph(_b_needed_again(), 4 * TILE, cost=SLOW_LINK)
    assert _ops(memgraph, "b") == ["kernel", "offload", "reload"]
    assert memgraph.recomputes() == []


def test_on_h200_rates_a_tiny_kernel_is_not_worth_recomputing():
    """The launch alone (10 us) costs more than moving a 1 KiB tile: the plan is the plan without remat."""
    graph = _b_needed_again()
    planned = compile_taskgraph(graph, 4 * TILE, remat=True)
    assert planned.dumps() == compile_taskgraph(graph, 4 * TILE).dumps()


def test_an_operand_needed_by_nobody_else_is_not_kept_for_a_recompute():
    """'b' = scale(w), and nothing else reads 'w': recomputing 'b' would keep or reload a tile as large
    as 'b' itself on top of the kernel, so even a slow link moves 'b'."""
    g = TaskGraph(1)
    x = g.input((16, 16), id="x")
    w = g.input((16, 16), id="w")
    b = g.scale(w, 0.5, device=0, id="b")
    a = g.relu(x, device=0, id="a")
    c = g.add(a, b, device=0, id="c")
    d = g.mul(c, x, device=0, id="d")
    e = g.add(d, a, device=0, id="e")
    g.add(e, b, device=0, id="f")
    g.output("f")
    memgraph = compile_taskgraph(g, 4 * TILE, remat=True, cost=SLOW_LINK)
    assert memgraph.recomputes() == []
    assert "reload" in _ops(memgraph, "b")


@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_the_recompute_runs_and_is_counted(backend):
    graph = _b_needed_again()
    memgraph = compile_taskgraph(graph, 4 * TILE, remat=True, cost=SLOW_LINK)
    inputs = {"x": np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)}
    for seed in range(3):
        result = execute(memgraph, backend=backend, order="random", seed=seed, inputs=inputs)
        assert (result.summary.recomputes, result.summary.bytes_recomputed) == (1, TILE)
        assert any(line.startswith("recomputed 1 kernels") for line in result.summary.lines())
        if backend == "cpu":
            x = inputs["x"].astype(np.float64)
            a, b = np.maximum(x, 0), 0.5 * x
            np.testing.assert_allclose(result.outputs["f"], (a + b) * x + a + b, rtol=1e-5)


def test_explain_viz_and_the_ir_round_trip_keep_the_second_kernel_node():
    memgraph = compile_taskgraph(_b_needed_again(), 4 * TILE, remat=True, cost=SLOW_LINK)
    assert any("1 recompute instead of a reload" in line for line in explain_offloads(memgraph).summary_lines())
    again = memgraph.recomputes()[0]
    assert f'{again.id} [label="{again.id}: b\\nscale @' in memgraph_dot(memgraph).source
    assert memgraph_dot(memgraph).source.count("(recompute)") == 1
    for back in (module_to_graph(parse_ir(graph_text(memgraph, "mlir"))), parse_json(graph_text(memgraph, "json"))):
        assert back.dumps() == memgraph.dumps()
        verify_memgraph(back, place_devices(_b_needed_again()))


def test_the_verifier_rejects_a_recompute_whose_operand_was_overwritten():
    """'e' written over 'x' before the recompute of 'b' reads 'x': the operand is not available."""
    graph = _b_needed_again()
    memgraph = compile_taskgraph(graph, 4 * TILE, remat=True, cost=SLOW_LINK)
    nodes = memgraph.by_id()
    again = memgraph.recomputes()[0]
    x = nodes[again.inputs[0]]
    writer = next(node for node in memgraph.nodes if node.task == "e")
    writer.loc = x.loc
    with pytest.raises(VerifyError, match=f"race: .* before node {again.id} \\(scale 'b'\\) has read node {x.id}"):
        verify_memgraph(memgraph)
    assert any(problem.startswith("race") for problem in violations(memgraph))


def test_the_verifier_rejects_a_recompute_of_the_wrong_operand():
    graph = _b_needed_again()
    memgraph = compile_taskgraph(graph, 4 * TILE, remat=True, cost=SLOW_LINK)
    again = memgraph.recomputes()[0]
    other = next(node for node in memgraph.nodes if node.task == "d")
    again.inputs = (other.id,)
    with pytest.raises(VerifyError, match="node 6 \\(scale 'b'\\): operand 0 comes from 'd', not 'x'"):
        verify_memgraph(memgraph, place_devices(graph))


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 10_000))
    tasks = draw(st.integers(3, 60))
    graph = random_taskgraph(seed, tasks=tasks, devices=draw(st.integers(1, 3)),
                             sizes=draw(st.sampled_from([(8,), (8, 16), (4, 12, 20)])), move_prob=0.2,
                             dtype="float64", mixed=True)
    factor = draw(st.sampled_from((1.0, 1.05, 1.3, 2.0)))
    cost = draw(st.sampled_from((SLOW_LINK, CostModel(h2d_bw=1e8, d2h_bw=1e8, launch=0.0), CostModel())))
    return graph, factor, draw(st.sampled_from(SCHEDULES)), cost, seed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_plans_with_remat_verify_and_compute_the_reference(case):
    graph, factor, schedule, cost, seed = case
    placed = place_devices(graph)
    memgraph = compile_taskgraph(graph, int(minimum_budget(placed) * factor), schedule, remat=True, cost=cost)
    verify_memgraph(memgraph, placed)
    assert violations(memgraph, placed) == []
    inputs = input_values(graph, seed)
    expected = evaluate(graph, inputs)
    got = interpret(memgraph, inputs, seed=seed)
    result = execute(memgraph, backend="cpu", order="random", seed=seed, inputs=inputs, jitter=0.0002, verify=False)
    for task, value in expected.items():
        np.testing.assert_allclose(got[task], value, rtol=1e-6, atol=1e-9, err_msg=f"output '{task}'")
        np.testing.assert_allclose(result.outputs[task], value, rtol=1e-6, atol=1e-9, err_msg=f"cpu, output '{task}'")


def test_random_graphs_at_tight_budgets_do_recompute():
    """The property above is not vacuous: on a slow link, most tight random plans hold a recompute."""
    with_recompute = 0
    for seed in range(20):
        graph = random_taskgraph(seed, tasks=40, devices=1, sizes=(8, 16), dtype="float64", mixed=True)
        budget = minimum_budget(place_devices(graph))
        with_recompute += bool(compile_taskgraph(graph, budget, "memory", remat=True, cost=SLOW_LINK).recomputes())
    assert with_recompute >= 10


def test_the_cuda_backend_writes_the_recompute_into_its_own_location():
    from runtime.backends.cuda import CudaBackend, simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")
    memgraph = compile_taskgraph(_b_needed_again(), 4 * TILE, remat=True, cost=SLOW_LINK)
    x = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    result = execute(memgraph, backend=CudaBackend(), order="random", seed=2, inputs={"x": x})
    a, b = np.maximum(x, 0), 0.5 * x
    np.testing.assert_allclose(result.outputs["f"], (a + b) * x + a + b, rtol=1e-5)


def test_the_commands_pass_remat_to_the_compiler(monkeypatch, tmp_path, capsys):
    from turnip_cli import main, opt, planning

    seen = []
    compile_real = planning.compile_taskgraph

    def spy(graph, budget, schedule="given", **options):
        seen.append(options.get("remat", False))
        return compile_real(graph, budget, schedule, **options)

    monkeypatch.setattr(planning, "compile_taskgraph", spy)
    assert main.main(["run", "examples/ffn.json", "--memory", "300000", "--backend", "sim", "--remat"]) == 0
    assert main.main(["llama", "--config", "tiny", "--tokens", "32", "--memory", "100KiB", "--backend", "sim", "--remat",
                      "--block", "auto"]) == 0
    assert main.main(["explain", "examples/ffn.json", "--memory", "300000", "--backend", "cpu"]) == 0
    assert seen and seen[0] is True and all(seen[:-1]) and seen[-1] is False
    assert main.main(["build", "llama", "--remat", "-o", str(tmp_path / "g.json")]) == 1
    assert "--remat applies to the auto choices" in capsys.readouterr().err
    out = tmp_path / "ffn.mem.json"
    assert opt.main(["examples/ffn.json", "-p", "turnip-memgraph{budget=300000 remat=true}", "--emit", "json", "-o", str(out)]) == 0
    assert out.exists()


def test_a_dead_operand_is_computed_again_before_the_tensor_that_needs_it():
    """'g' = scale(n) with n = relu(x) read by nobody else (the MLP's gate behind its normed input): when 'g'
    must leave, a slow link recomputes 'n' from 'x' (read again by 'f' anyway), then 'g', rather than
    moving 'g'; the plan verifies and computes the formulas."""
    g = TaskGraph(1)
    x = g.input((16, 16), id="x")
    n = g.relu(x, device=0, id="n")
    gate = g.scale(n, 0.5, device=0, id="g")
    a = g.exp(x, device=0, id="a")
    c = g.add(a, gate, device=0, id="c")
    d = g.mul(c, a, device=0, id="d")
    e = g.add(d, a, device=0, id="e")
    f = g.mul(e, x, device=0, id="f")
    g.add(f, gate, device=0, id="h")
    g.output("h")
    placed = place_devices(g)
    memgraph = compile_taskgraph(g, 4 * TILE, remat=True, cost=SLOW_LINK)
    assert [node.task for node in memgraph.recomputes()] == ["n", "g"]
    assert "offload" not in _ops(memgraph, "g") and "offload" not in _ops(memgraph, "n")
    again_n, again_g = memgraph.recomputes()
    assert again_g.inputs == (again_n.id,)
    verify_memgraph(memgraph, placed)
    assert violations(memgraph, placed) == []
    inputs = {task: value.astype(np.float32) for task, value in input_values(g, 0).items()}
    result = execute(memgraph, backend="cpu", order="random", seed=0, inputs=inputs, verify=False)
    np.testing.assert_allclose(result.outputs["h"], evaluate(g, inputs)["h"], rtol=1e-5)


def test_random_graphs_at_tight_budgets_recompute_dead_operands_too():
    """The property above covers chained recomputes: in some tight random plans a recompute reads another."""
    chained = 0
    for seed in range(40):
        graph = random_taskgraph(seed, tasks=40, devices=1, sizes=(8, 16), dtype="float64", mixed=True)
        memgraph = compile_taskgraph(graph, minimum_budget(place_devices(graph)), "memory", remat=True, cost=SLOW_LINK)
        again = {node.id for node in memgraph.recomputes()}
        chained += any(i in again for node in memgraph.recomputes() for i in node.inputs)
    assert chained >= 3


@st.composite
def advance_cases(draw):
    """Larger graphs than `cases`: a pending recompute due after another's is rare below 100 tasks."""
    seed = draw(st.integers(0, 10_000))
    graph = random_taskgraph(seed, tasks=draw(st.integers(100, 200)), devices=draw(st.integers(1, 2)),
                             sizes=draw(st.sampled_from([(8, 16), (4, 12, 20)])), move_prob=0.2, dtype="float64", mixed=True)
    factor = draw(st.sampled_from((1.0, 1.05, 1.3)))
    cost = draw(st.sampled_from((SLOW_LINK, CostModel(h2d_bw=1e8, d2h_bw=1e8, launch=0.0))))
    return graph, factor, draw(st.sampled_from(SCHEDULES)), cost, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=advance_cases())
def test_plans_that_advance_pending_recomputes_verify_and_compute_the_reference(monkeypatch, case):
    """`REMAT_ADVANCE` with two levels of dead operands (off by default): a drop may move a pending recompute
    it reads to its own step; the plans keep the seed's conditions and the values."""
    monkeypatch.setattr(planner, "REMAT_ADVANCE", True)
    monkeypatch.setattr(planner, "REMAT_DEPTH", 2)
    test_plans_with_remat_verify_and_compute_the_reference.hypothesis.inner_test(case)


def test_random_graphs_at_tight_budgets_advance_pending_recomputes(monkeypatch):
    """The property above is not vacuous: on a slow link, some tight random plans move a recompute earlier."""
    advanced = 0
    original = planner.Planner._advance

    def counting(self, x, use):
        nonlocal advanced
        advanced += self.due[x] > use
        return original(self, x, use)

    monkeypatch.setattr(planner, "REMAT_ADVANCE", True)
    monkeypatch.setattr(planner, "REMAT_DEPTH", 2)
    monkeypatch.setattr(planner.Planner, "_advance", counting)
    for seed in range(30):
        graph = random_taskgraph(seed, tasks=200, devices=1, sizes=(4, 12, 20), dtype="float64", mixed=True)
        compile_taskgraph(graph, minimum_budget(place_devices(graph)), "memory", remat=True, cost=SLOW_LINK)
    assert advanced >= 3

"""Property tests: every compiled random taskgraph verifies and computes the right values in random orders,
and the verifier catches deliberately broken memgraphs (a dropped edge, a shifted location, a cycle).

The graphs hold every tensor kind and op (`random_taskgraph(mixed=True)`: broadcasting, einsum, rmsnorm
with a weight, zero-size tensors). Each plan is proved twice, by the fast verifier and by the oracle
(tests/oracle.py, which shares no code with the compiler), and its values are checked twice against the
float64 formulas of tests/kernel_formulas.py: with `interp` (a sequential interpreter over NaN-filled
arenas, random topological order) and with the runtime's real cpu backend (threads, random order, jitter).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from interp import execute, input_values
from oracle import violations
from kernel_formulas import evaluate

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.schedules import SCHEDULES
from turnip_ir.verifier import verify_memgraph
from runtime import execute as run_on_cpu
from turnip_ir.errors import VerifyError
from tools.random_graphs import random_taskgraph

FACTORS = (1.0, 1.05, 1.3, 2.0, 100.0)
TIGHT = (1.0, 1.05, 1.3)
"""Budget factors at which a plan reuses memory, so it has memory edges to break."""


@st.composite
def cases(draw, factors=FACTORS):
    seed = draw(st.integers(0, 10_000))
    devices = draw(st.integers(1, 4))
    sizes = draw(st.sampled_from([(8,), (8, 16), (4, 12, 20), (16, 8, 24)]))
    # float64 graphs: a wrong plan reads the wrong bytes and is off by far more than rounding, while
    # float32 rounding through 80 chained ops can cancel to 10% errors that prove nothing; the smaller
    # float32 graphs keep the float32 kernels honest too
    tasks = draw(st.integers(3, 80))
    dtype = "float32" if tasks <= 30 and draw(st.booleans()) else "float64"
    graph = random_taskgraph(seed, tasks=tasks, devices=devices, sizes=sizes, move_prob=0.2, dtype=dtype, mixed=True)
    if draw(st.booleans()):
        for node in graph.nodes.values():
            if node.op not in ("input", "move") and random.Random(seed + len(node.id)).random() < 0.5:
                node.device = None
    factor = draw(st.sampled_from(factors))
    schedule = draw(st.sampled_from(SCHEDULES))
    return graph, factor, schedule, seed


def _compile(graph, factor, schedule):
    from passes.place_devices import place_devices

    placed = place_devices(graph)
    budget = int(minimum_budget(placed) * factor)
    return placed, compile_taskgraph(graph, budget, schedule=schedule)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_compiled_memgraph_verifies_and_computes_the_reference(case):
    graph, factor, schedule, seed = case
    placed, memgraph = _compile(graph, factor, schedule)
    verify_memgraph(memgraph, placed)
    assert violations(memgraph, placed) == []
    dtype = next(iter(graph.nodes.values())).dtype
    tol = {"rtol": 1e-6, "atol": 1e-9} if dtype == "float64" else {"rtol": 2e-3, "atol": 2e-4}
    inputs = {task: value.astype(dtype) for task, value in input_values(graph, seed).items()}
    expected = evaluate(graph, inputs)
    for run in range(2):
        got = execute(memgraph, inputs, seed=seed * 7 + run)
        for task, value in expected.items():
            np.testing.assert_allclose(got[task], value, **tol, err_msg=f"output '{task}'")
    result = run_on_cpu(memgraph, backend="cpu", order="random", seed=seed, inputs=inputs, jitter=0.0002, verify=False)
    for task, value in expected.items():
        np.testing.assert_allclose(result.outputs[task], value, **tol, err_msg=f"cpu backend, output '{task}'")


@settings(max_examples=150, deadline=None)
@given(cases(TIGHT), st.randoms(use_true_random=False))
def test_verifier_catches_a_dropped_memory_edge(case, rng):
    graph, factor, schedule, _ = case
    _, memgraph = _compile(graph, factor, schedule)
    edges = [(n, d) for n in memgraph.nodes if n.op != "offload" for d in n.mem_deps]
    assume(edges)
    node, dep = rng.choice(edges)
    node.mem_deps = tuple(d for d in node.mem_deps if d != dep)
    with pytest.raises(VerifyError, match="race"):
        verify_memgraph(memgraph)
    assert any(problem.startswith(("race", "output")) for problem in violations(memgraph))


@settings(max_examples=150, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_verifier_catches_a_location_shifted_onto_an_operand(case, rng):
    graph, factor, schedule, _ = case
    _, memgraph = _compile(graph, factor, schedule)
    by_id = memgraph.by_id()
    candidates = [n for n in memgraph.nodes if n.op == "kernel" and n.inputs and by_id[n.inputs[0]].loc[1] >= n.loc[1] > 0]
    assume(candidates)
    node = rng.choice(candidates)
    node.loc = (by_id[node.inputs[0]].loc[0], node.loc[1])
    with pytest.raises(VerifyError, match="race"):
        verify_memgraph(memgraph)
    assert any(problem.startswith("race") for problem in violations(memgraph))


@settings(max_examples=100, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_verifier_catches_an_added_cycle(case, rng):
    graph, factor, schedule, _ = case
    _, memgraph = _compile(graph, factor, schedule)
    edges = [(n, d) for n in memgraph.nodes for d in n.inputs]
    assume(edges)
    node, dep = rng.choice(edges)
    source = memgraph.by_id()[dep]
    source.mem_deps = source.mem_deps + (node.id,)
    with pytest.raises(VerifyError, match="cycle"):
        verify_memgraph(memgraph)
    assert violations(memgraph)[0].startswith("cycle")


@settings(max_examples=150, deadline=None)
@given(cases())
def test_no_budget_error_at_the_minimum_budget(case):
    graph, _, schedule, _ = case
    _compile(graph, 1.0, schedule)

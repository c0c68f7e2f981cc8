"""Runtime outputs equal a float64 numpy reference, under every policy, tight plans, offloads and jitter."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_formulas import evaluate
from runtime_plans import assert_matches_reference, naive_memgraph, reuse_memgraph

from runtime import execute
from runtime.inputs import input_specs, make_inputs
from tools.random_graphs import random_taskgraph
from frontend.workloads import ffn, matmul


def _check(taskgraph, result, memgraph, seed):
    assert set(result.outputs) == set(taskgraph.effective_outputs())
    assert_matches_reference(taskgraph, memgraph, result, seed)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("plan", ["naive", "reuse", "reuse-offload"])
def test_random_order_matches_reference(seed, plan):
    taskgraph = random_taskgraph(seed, tasks=40, devices=2, mixed=True)
    memgraph = {"naive": naive_memgraph, "reuse": reuse_memgraph}.get(plan, lambda g: reuse_memgraph(g, True))(taskgraph)
    result = execute(memgraph, order="random", seed=seed, jitter=0.0003)
    _check(taskgraph, result, memgraph, seed)


@pytest.mark.parametrize("seed", range(4))
def test_nondet_with_jitter_matches_reference(seed):
    taskgraph = random_taskgraph(100 + seed, tasks=60, devices=3, sizes=(8, 16, 32), mixed=True)
    memgraph = reuse_memgraph(taskgraph, offload_inputs=True)
    result = execute(memgraph, order="nondet", seed=seed, jitter=0.0005, streams=3)
    _check(taskgraph, result, memgraph, seed)


@pytest.mark.parametrize("build", [
    lambda: ffn.build(ffn.FfnConfig(layers=3, gpus=2, placement="layers")).taskgraph(),
    lambda: matmul.build(matmul.PRESETS["small"]).taskgraph(),
])
def test_fixed_and_nondet_give_identical_outputs(build):
    taskgraph = build()
    memgraph = reuse_memgraph(taskgraph, offload_inputs=True)
    fixed = execute(memgraph, order="fixed", seed=3)
    nondet = execute(memgraph, order="nondet", seed=3, jitter=0.0005)
    for task in fixed.outputs:
        np.testing.assert_array_equal(fixed.outputs[task], nondet.outputs[task])
    _check(taskgraph, nondet, memgraph, 3)


def test_float16_graph_runs_close_to_reference():
    taskgraph = ffn.build(ffn.FfnConfig(layers=2, tokens=16, hidden=32, ffn=64, block=16, dtype="float16")).taskgraph()
    memgraph = reuse_memgraph(taskgraph)
    result = execute(memgraph, order="random", seed=1)
    reference = evaluate(taskgraph, make_inputs(input_specs(memgraph), None, 1))
    for task, expected in reference.items():
        assert result.outputs[task].dtype == np.float16
        atol = 1e-2 * max(1.0, float(np.abs(expected).max(initial=0.0)))
        np.testing.assert_allclose(result.outputs[task], expected, rtol=2e-2, atol=atol)


def test_given_inputs_are_used():
    taskgraph = ffn.build(ffn.FfnConfig(layers=1, tokens=4, hidden=8, ffn=16, block=4)).taskgraph()
    memgraph = naive_memgraph(taskgraph)
    given = {"x": np.ones((4, 8), dtype=np.float32)}
    result = execute(memgraph, inputs=given, seed=5)
    inputs = make_inputs(input_specs(memgraph), given, 5)
    np.testing.assert_allclose(result.outputs["y"], evaluate(taskgraph, inputs)["y"], rtol=1e-5, atol=1e-6)

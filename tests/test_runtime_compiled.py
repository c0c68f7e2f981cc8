"""Property tests over compiled memgraphs: random taskgraphs x tight budgets x policies equal a reference."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_plans import assert_matches_reference

from passes.pipeline import compile_taskgraph
from runtime import execute
from turnip_ir.errors import BudgetError
from tools.random_graphs import random_taskgraph
from frontend.workloads import ffn, matmul


def _working_set(taskgraph) -> int:
    """The largest bytes one op needs at once: its operands plus its result."""
    nodes = taskgraph.nodes
    return max(node.nbytes + sum(nodes[i].nbytes for i in node.inputs) for node in nodes.values())


def _tight_memgraphs(taskgraph):
    """Compiled plans at 1x to 2x the largest working set; tight enough that most of them offload."""
    plans = []
    for factor in (1.0, 1.25, 1.5, 2.0):
        try:
            plans.append(compile_taskgraph(taskgraph, int(_working_set(taskgraph) * factor) + 1024))
        except BudgetError:
            continue
    assert len(plans) >= 2, "the compiler should plan random graphs at 1.5x their largest working set"
    return plans


@pytest.mark.parametrize("seed", range(5))
def test_compiled_random_graphs_under_tight_budgets(seed):
    taskgraph = random_taskgraph(seed, tasks=40, devices=2, sizes=(8, 16, 24), mixed=True)
    plans = _tight_memgraphs(taskgraph)
    assert any(plan.count("offload") + plan.count("reload") for plan in plans)
    for memgraph in plans:
        for run_seed in range(3):
            result = execute(memgraph, order="random", seed=run_seed, jitter=0.0002)
            assert_matches_reference(taskgraph, memgraph, result, run_seed)
        result = execute(memgraph, order="nondet", seed=seed, jitter=0.0005, streams=3)
        assert_matches_reference(taskgraph, memgraph, result, seed)


@pytest.mark.parametrize("build", [
    lambda: ffn.build(ffn.FfnConfig(layers=4, gpus=2, placement="layers")).taskgraph(),
    lambda: matmul.build(matmul.MatmulConfig(m=96, k=96, n=96, block=32)).taskgraph(),
])
def test_compiled_models_fixed_equals_nondet(build):
    taskgraph = build()
    memgraph = _tight_memgraphs(taskgraph)[0]
    fixed = execute(memgraph, order="fixed", seed=2)
    nondet = execute(memgraph, order="nondet", seed=2, jitter=0.0005)
    for task in fixed.outputs:
        np.testing.assert_array_equal(fixed.outputs[task], nondet.outputs[task])
    assert_matches_reference(taskgraph, memgraph, nondet, 2)

"""Inputs named to start on the GPU under inputs=host (`compile_taskgraph(start_on_gpu=...)`): the
activations a run is fed from GPU work before it, where only the weights live in host memory. The named
inputs start on their GPU (while they fit), every other input in CPU storage; plans verify and match the
float64 reference in random orders; bad names and modes are one-line errors; bench/run.py's `--inputs
weights` starts llama's embedded tokens and RoPE tables that way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle import violations
from runtime_plans import assert_matches_reference

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from tools.random_graphs import random_taskgraph
from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.verifier import verify_memgraph

ROOT = Path(__file__).resolve().parents[1]


def _started(memgraph: MemGraph) -> tuple[set[str], set[str]]:
    """(inputs that start on a GPU, inputs that start in CPU storage)."""
    on_gpu = {n.task for n in memgraph.nodes if n.op == "input" and n.loc is not None}
    stored = {n.task for n in memgraph.nodes if n.op == "input" and n.storage is not None}
    return on_gpu, stored


def _inputs(graph) -> list[str]:
    return [node.id for node in graph.nodes.values() if node.op == "input"]


def test_only_the_named_inputs_start_on_the_gpu():
    graph = random_taskgraph(3, tasks=30, devices=1)
    inputs = _inputs(graph)
    named = set(inputs[: len(inputs) // 2])
    budget = 64 * minimum_budget(graph)  # roomy: every named input fits
    on_gpu, stored = _started(compile_taskgraph(graph, budget, inputs="host", start_on_gpu=named))
    assert on_gpu == named
    assert stored == set(inputs) - named
    assert _started(compile_taskgraph(graph, budget, inputs="host"))[0] == set()  # without names: all in storage


def test_named_inputs_cut_the_bytes_reloaded():
    graph = random_taskgraph(5, tasks=40, devices=1)
    budget = 64 * minimum_budget(graph)
    reloaded = lambda m: sum(n.nbytes for n in m.nodes if n.op == "reload")  # noqa: E731
    named = set(_inputs(graph))
    assert reloaded(compile_taskgraph(graph, budget, inputs="host", start_on_gpu=named)) < reloaded(
        compile_taskgraph(graph, budget, inputs="host"))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), factor=st.sampled_from([1.0, 1.3, 2.0, 8.0]), share=st.floats(0.0, 1.0))
def test_random_plans_with_named_inputs_verify_and_match_the_reference_in_random_orders(seed, factor, share):
    graph = random_taskgraph(seed, tasks=40, devices=2, mixed=True)
    inputs = _inputs(graph)
    named = set(inputs[: round(share * len(inputs))])
    memgraph = compile_taskgraph(graph, int(minimum_budget(graph) * factor), inputs="host", start_on_gpu=named)
    assert _started(memgraph)[0] <= named  # a named input that does not fit starts in storage
    verify_memgraph(memgraph)
    assert violations(memgraph, graph) == []
    for order_seed in range(3):
        assert_matches_reference(graph, memgraph, execute(memgraph, order="random", seed=order_seed), order_seed)


def test_a_name_that_is_no_input_is_a_one_line_error():
    graph = random_taskgraph(1, tasks=10, devices=1)
    task = next(node.id for node in graph.nodes.values() if node.op != "input")
    for name in ("nowhere", task):
        with pytest.raises(InputError, match=f"'{name}', named to start on the GPU, is not an input of the taskgraph"):
            compile_taskgraph(graph, 64 * minimum_budget(graph), inputs="host", start_on_gpu=[name])


def test_names_need_inputs_host():
    graph = random_taskgraph(1, tasks=10, devices=1)
    for mode in ("gpu", "recur"):
        with pytest.raises(InputError, match=f"need inputs=host, not '{mode}'"):
            compile_taskgraph(graph, 64 * minimum_budget(graph), inputs=mode, start_on_gpu=_inputs(graph)[:1])


def test_llamas_activations_are_its_embedded_tokens_and_rope_tables():
    from frontend.workloads import llama

    built = llama.build_llama(llama.load_config("tiny"), 64, 32)
    ids = built.activation_ids
    assert ids and all(i.split("[")[0] in llama.graph.ACTIVATIONS for i in ids)
    weights = {name for name in _inputs(built.graph) if name not in ids}
    assert weights and all("weight" in name for name in weights)
    with pytest.raises(InputError, match="no input named 'nope'"):
        built.program.input_ids(["nope"])


def test_bench_inputs_weights_starts_the_activations_on_the_gpu_and_the_weights_on_the_host():
    sys.path.insert(0, str(ROOT / "bench"))
    import run
    from frontend.workloads import llama

    built = llama.build_llama(llama.load_config("tiny"), 64, 32)
    assert run.INPUTS == "weights"
    assert run.start_options("weights", built.activation_ids) == ("host", frozenset(built.activation_ids))
    assert run.start_options("host", built.activation_ids) == ("host", frozenset())
    memgraph = compile_taskgraph(built.graph, 1 << 30, inputs="host", start_on_gpu=built.activation_ids)
    on_gpu, stored = _started(memgraph)
    assert on_gpu == built.activation_ids
    assert stored == set(_inputs(built.graph)) - built.activation_ids


def test_named_inputs_are_activations_whose_room_is_not_held_for_weights(monkeypatch):
    """inputs=gpu holds a dead started input's room for the next weight's reload (`Planner._hold`); the
    inputs named under inputs=host are activations, and holding their room left a tight llama plan 4-10%
    slower in the sim, so it is not held."""
    import passes.planner as planner
    from frontend.workloads import llama

    built = llama.build_llama(llama.load_config("tiny"), 64, 32)
    held = []
    hold = planner.Planner._hold
    monkeypatch.setattr(planner.Planner, "_hold", lambda self, *a: (held.append(a[0]), hold(self, *a)))
    budget = 4 * minimum_budget(built.graph)
    compile_taskgraph(built.graph, budget, inputs="gpu")
    assert held  # the spy sees inputs=gpu hold room
    held.clear()
    compile_taskgraph(built.graph, budget, inputs="host", start_on_gpu=built.activation_ids)
    assert held == []

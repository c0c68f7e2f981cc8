"""Inputs kept across runs (runtime/residency.py, the planner's `inputs="recur"`): a plan that runs again
and again keeps the inputs that survive a run on the GPU, and the backend copies only what changed.

The property: on one prepared cpu backend, any sequence of runs of two plans of a random graph (a
`recur` plan and an ordinary one, whose locations overlap), each in a random dispatch order, with the
inputs it claims unchanged kept, computes the float64 reference every time, and a run of the same
`recur` plan right after itself copies nothing onto the GPU that survived."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interp import input_values
from kernel_formulas import evaluate

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from runtime import execute
from runtime.backends import make_backend
from runtime.residency import Residency
from tools.random_graphs import random_taskgraph
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.verifier import verify_memgraph


def _node(i, op, task, loc=None, inputs=(), storage=None):
    return MemNode(i, op, task, 0 if loc else None, loc, storage, inputs, (), "relu" if op == "kernel" else None, (4,), "float32", {})


def test_an_input_survives_only_where_nothing_overlaps_it():
    mg = MemGraph(1, 1024)
    for node in (_node(0, "input", "a", (0, 16)), _node(1, "input", "b", (16, 16)), _node(2, "input", "c", (64, 16)),
                 _node(3, "kernel", "x", (20, 8), (1,)), _node(4, "input", "d", None, storage=(0, 16)),
                 _node(5, "kernel", "y", (80, 16), (2,))):
        mg.add(node)
    assert mg.surviving_inputs() == {"a": (0, 0, 16), "c": (0, 64, 16)}  # b is overwritten by x; d is in storage


def test_residency_keeps_only_unchanged_inputs_at_the_same_place():
    mg = MemGraph(1, 1024)
    for node in (_node(0, "input", "a", (0, 16)), _node(1, "input", "b", (16, 16)), _node(2, "input", "s", None, storage=(0, 16))):
        mg.add(node)
    held = Residency()
    assert held.kept(mg, ["a", "b", "s"]) == set()
    held.ran(mg)
    assert held.kept(mg, ["a", "s"]) == {"a", "s"}
    other = MemGraph(1, 1024)
    for node in (_node(0, "input", "a", (0, 16)), _node(1, "input", "b", (32, 16)), _node(2, "input", "s", None, storage=(0, 16))):
        other.add(node)
    assert held.kept(other, ["a", "b", "s"]) == {"a"}  # b moved; s's storage belongs to another plan


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 10_000))
    graph = random_taskgraph(seed, tasks=draw(st.integers(3, 40)), devices=draw(st.integers(1, 3)),
                             sizes=draw(st.sampled_from([(8,), (8, 16), (4, 12, 20)])), dtype="float64", mixed=True)
    factor = draw(st.sampled_from((1.0, 1.3, 2.0, 100.0)))
    runs = draw(st.lists(st.sampled_from(("recur", "gpu")), min_size=2, max_size=5))
    return graph, factor, runs, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_runs_with_kept_inputs_compute_the_reference(case):
    graph, factor, runs, seed = case
    budget = int(minimum_budget(place_devices(graph)) * factor)
    plans = {inputs: compile_taskgraph(graph, budget, inputs=inputs) for inputs in ("recur", "gpu")}
    recur = plans["recur"]
    verify_memgraph(recur)
    inputs = input_values(graph, seed)
    expected = evaluate(graph, inputs)
    backend = make_backend("cpu", seed=seed)
    try:
        last = None
        for k, which in enumerate(runs):
            result = execute(plans[which], backend, order="random", seed=seed + k, inputs=inputs,
                             close=False, verify=False, unchanged=list(inputs))
            for task, value in expected.items():
                np.testing.assert_allclose(result.outputs[task], value, rtol=1e-9, atol=1e-12, err_msg=f"run {k} ({which}): {task}")
            if which == last == "recur":
                survivors = recur.surviving_inputs()
                copied = sum(n.nbytes for n in recur.nodes if n.op == "input" and n.loc is not None and n.task not in survivors)
                assert result.summary.bytes_placed == copied
                assert result.summary.bytes_staged == 0
            last = which
    finally:
        backend.close()


def test_a_recurring_plan_keeps_its_starting_inputs_to_the_end():
    """With room for everything, every input starts on the GPU and survives, so a second run copies nothing."""
    graph = random_taskgraph(7, tasks=30, devices=2, sizes=(8, 16), dtype="float64", mixed=True)
    memgraph = compile_taskgraph(graph, 1 << 20, inputs="recur")
    started = {n.task for n in memgraph.nodes if n.op == "input" and n.loc is not None}
    assert started == set(memgraph.surviving_inputs())
    backend = make_backend("cpu")
    inputs = input_values(graph, 7)
    try:
        first = execute(memgraph, backend, inputs=inputs, close=False, unchanged=list(inputs))
        second = execute(memgraph, backend, inputs=inputs, close=False, unchanged=list(inputs))
        changed = execute(memgraph, backend, inputs=inputs, close=False, unchanged=[])
    finally:
        backend.close()
    assert first.summary.bytes_placed > 0 and second.summary.bytes_placed == 0 == second.summary.bytes_staged
    assert changed.summary.bytes_placed == first.summary.bytes_placed


def test_a_recurring_plan_under_a_tight_budget_starts_only_survivors():
    from frontend.workloads import ffn

    graph = ffn.build(ffn.FfnConfig(layers=4, tokens=32, hidden=64, ffn=128, block=32)).taskgraph()
    budget = int(minimum_budget(place_devices(graph)) * 2.5)
    memgraph = compile_taskgraph(graph, budget, inputs="recur")
    started = {n.task for n in memgraph.nodes if n.op == "input" and n.loc is not None}
    assert started and started <= set(memgraph.surviving_inputs())
    ordinary = compile_taskgraph(graph, budget)
    assert not {n.task for n in ordinary.nodes if n.op == "input" and n.loc is not None} <= set(ordinary.surviving_inputs())


@pytest.mark.parametrize("backend_name", ["cpu", "cuda"])
def test_refreshed_rows_are_copied_into_a_kept_input(backend_name):
    """`refresh`: an input kept in place but for some rows (a cache column a decode step wrote into) gets
    only those rows copied, and the run computes the new values; the same rows named `unchanged` instead
    would leave the old ones (the test can tell)."""
    from runtime.backends.cuda import simulated

    if backend_name == "cuda" and not simulated():
        pytest.skip("runs numba-cuda's simulator")
    graph = random_taskgraph(7, tasks=12, devices=1, sizes=(8,), dtype="float64")
    memgraph = compile_taskgraph(graph, 1 << 20, inputs="recur")
    inputs = input_values(graph, 7)
    name = next(n.task for n in memgraph.nodes if n.op == "input" and n.loc is not None and len(n.shape) == 2 and n.shape[0] >= 4)
    changed = {**inputs, name: inputs[name].copy()}
    changed[name][1:3] += 1.0
    backend = make_backend(backend_name)
    try:
        execute(memgraph, backend, inputs=inputs, close=False, unchanged=list(inputs))
        others = [n for n in inputs if n != name]
        result = execute(memgraph, backend, inputs=changed, close=False, unchanged=others, refresh={name: [(1, 3)]})
        row_bytes = inputs[name][0].nbytes
        assert result.summary.bytes_placed == 2 * row_bytes
        for task, value in evaluate(graph, changed).items():
            np.testing.assert_allclose(result.outputs[task], value, rtol=1e-9, atol=1e-12)
        again = {**changed, name: changed[name].copy()}
        again[name][1:3] -= 3.0
        stale = execute(memgraph, backend, inputs=again, close=False, unchanged=others, refresh={name: [(1, 2)]})
        assert stale.summary.bytes_placed == row_bytes  # row 2 stays as it was: the results differ
        assert any(not np.allclose(stale.outputs[t], v) for t, v in evaluate(graph, again).items())
    finally:
        backend.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_plan_compiled_with_kept_starts_inputs_where_they_are_and_computes_the_reference(case):
    """`compile_taskgraph(..., inputs="recur", kept=backend.held().gpu)`: the new plan (another budget here)
    starts a held input where it is held when it starts on the GPU and that room is free and aligned; it
    verifies, and run after the first plan with everything unchanged it computes the reference, copying
    exactly the inputs it starts on the GPU elsewhere."""
    graph, factor, runs, seed = case
    floor = minimum_budget(place_devices(graph))
    first = compile_taskgraph(graph, int(floor * factor), inputs="recur")
    inputs = input_values(graph, seed)
    expected = evaluate(graph, inputs)
    backend = make_backend("cpu", seed=seed)
    try:
        execute(first, backend, inputs=inputs, close=False, verify=False, unchanged=list(inputs))
        held = backend.held().gpu
        second = compile_taskgraph(graph, int(floor * (factor + 0.5)), inputs="recur", kept=held)
        verify_memgraph(second)
        result = execute(second, backend, inputs=inputs, close=False, verify=False, unchanged=list(inputs))
        for task, value in expected.items():
            np.testing.assert_allclose(result.outputs[task], value, rtol=1e-9, atol=1e-12, err_msg=task)
        kept_bytes = sum(n.nbytes for n in second.nodes if n.op == "input" and n.loc is not None
                         and held.get(n.task) == (n.device, n.loc[0], n.loc[1]))
        started = sum(n.nbytes for n in second.nodes if n.op == "input" and n.loc is not None)
        assert result.summary.bytes_placed == started - kept_bytes
    finally:
        backend.close()


@pytest.mark.parametrize("read_in_place", [True, False])
def test_cuda_reads_page_locked_storage_inputs_where_they_are(read_in_place):
    """The cuda backend (simulator: every host array counts as page-locked) reads an input the plan keeps
    in host storage from the caller's array, so a new plan stages nothing; with `external_inputs=False`
    it stages as before. Either way the runs compute the reference, also after the caller changes an
    array in place (read where it is) or passes a new array to the same plan (bound again)."""
    from runtime.backends.cuda import CudaBackend, simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    graph = random_taskgraph(3, tasks=24, devices=1, sizes=(8, 16), dtype="float64")
    budget = int(minimum_budget(place_devices(graph)) * 1.5)
    plans = [compile_taskgraph(graph, budget, inputs=inputs) for inputs in ("recur", "host")]
    stored = {n.task for n in plans[1].nodes if n.op == "input" and n.storage is not None}
    assert stored, "the plan keeps some inputs in host storage"
    inputs = input_values(graph, 3)
    backend = CudaBackend(external_inputs=read_in_place)
    try:
        for plan in plans:
            result = execute(plan, backend, inputs=inputs, close=False)
            staged = sum(n.nbytes for n in plan.nodes if n.op == "input" and n.storage is not None)
            assert result.summary.bytes_staged == (0 if read_in_place else staged)
            assert backend.external_inputs() == ({n.task for n in plan.nodes if n.op == "input" and n.storage is not None} if read_in_place else set())
            for task, value in evaluate(graph, inputs).items():
                np.testing.assert_allclose(result.outputs[task], value, rtol=1e-9, atol=1e-12)
        name = sorted(stored)[0]
        inputs[name][...] += 1.0  # the same array, changed: the next run of the same plan reads it
        again = execute(plans[1], backend, inputs=inputs, close=False, unchanged=[t for t in inputs if t != name])
        for task, value in evaluate(graph, inputs).items():
            np.testing.assert_allclose(again.outputs[task], value, rtol=1e-9, atol=1e-12)
        fresh = {**inputs, name: inputs[name] * 2.0}  # a new array for the same plan
        moved = execute(plans[1], backend, inputs=fresh, close=False, unchanged=[t for t in inputs if t != name])
        for task, value in evaluate(graph, fresh).items():
            np.testing.assert_allclose(moved.outputs[task], value, rtol=1e-9, atol=1e-12)
    finally:
        backend.close()


def test_a_recurring_plan_spreads_the_inputs_it_keeps_over_the_run():
    """inputs="recur" keeps about the bytes the first-used inputs would take, but spread over the run (so a
    decode step streams a little of every layer from its start, passes/insert_offload.py `plan_recurring`):
    kept inputs come from both halves of the first-use order, where the first-used rule keeps a prefix."""
    from frontend.workloads import ffn
    from passes.insert_offload import insert_offload

    graph = place_devices(ffn.build(ffn.FfnConfig(layers=8, tokens=32, hidden=64, ffn=128, block=32)).taskgraph())
    budget = int(minimum_budget(graph) * 3)
    first_use = [node.id for node in graph.nodes.values() if node.op == "input"]
    order = {task: i for i, task in enumerate(first_use)}

    def kept(memgraph):
        return sorted(order[n.task] for n in memgraph.nodes if n.op == "input" and n.loc is not None)

    prefix = kept(insert_offload(graph, budget, inputs="recur", spread=False))
    spread = kept(compile_taskgraph(graph, budget, inputs="recur"))  # the default pipeline: verified
    assert prefix and spread and len(prefix) < len(first_use)
    assert max(prefix) < len(first_use) // 2 < max(spread)


def test_inputs_checked_before_are_not_checked_again_but_new_ones_are():
    from runtime.inputs import make_inputs
    from turnip_ir.errors import InputError

    specs = {"a": ((2, 3), "float32")}
    a = np.zeros((2, 3), np.float32)
    import weakref

    assert make_inputs(specs, {"a": a}, 0, checked={"a": weakref.ref(a)})["a"] is a
    with pytest.raises(InputError, match="input 'a': shape"):
        make_inputs(specs, {"a": np.zeros((3, 2), np.float32)}, 0, checked={"a": weakref.ref(a)})
    with pytest.raises(InputError, match="input 'a': dtype"):
        make_inputs(specs, {"a": np.zeros((2, 3))}, 0, checked={"a": weakref.ref(a)})


def test_outputs_left_in_the_backends_memory_are_the_copied_ones_until_the_next_run():
    """`execute(copy_outputs=False)` on a prepared cpu backend: the same values as the copies, held in the
    backend's own memory (a decode step uses them at once); a default run returns copies of its own."""
    graph = random_taskgraph(5, tasks=12, devices=1, sizes=(8, 16), dtype="float64")
    memgraph = compile_taskgraph(graph, 1 << 20)
    machine = make_backend("cpu")
    try:
        copied = execute(memgraph, backend=machine, close=False, seed=1)
        left = execute(memgraph, backend=machine, close=False, seed=1, copy_outputs=False)
        again = execute(memgraph, backend=machine, close=False, seed=1, copy_outputs=False)
    finally:
        machine.close()
    assert copied.outputs.keys() == left.outputs.keys() and copied.outputs
    for task, array in copied.outputs.items():
        np.testing.assert_array_equal(left.outputs[task], array)
        assert np.shares_memory(left.outputs[task], again.outputs[task])  # the backend's memory, not a copy
        assert not np.shares_memory(array, left.outputs[task])

"""CPU storage is planned: a dead offloaded tensor's region is reused by a later offload (ordered after
the old copy's reloads), inputs' and outputs' regions never are; and the cuda reserve counts the GPU page
tables for what a plan pins (`page_table_bytes`, `arena_budget(pinned=)`, `refit_arena`, `plan_within`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle import violations
from runtime_plans import assert_matches_reference

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import arena_budget, execute
from runtime.api import plan_within, refit_arena
from runtime.backends.cuda.devices import HOST_PAGE, PAGE_TABLE_ENTRY, library_allowance, page_table_bytes, reserve_bytes
from tools.random_graphs import random_taskgraph
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.verifier import verify_memgraph

TILE = 16 * 16 * 4


def _layers(layers: int = 4) -> TaskGraph:
    """Per layer, `keep` is read at the layer's start and end, with a chain of temporaries between: under a
    tight budget each layer offloads its `keep`, which dies at the layer's end."""
    g = TaskGraph(1)
    x = g.input((16, 16), id="x")
    w = g.input((16, 16), id="w")
    for i in range(layers):
        keep = g.relu(x, device=0, id=f"keep{i}")
        y = g.mul(keep, w, device=0, id=f"y{i}_0")
        for j in range(1, 4):
            y = g.add(g.scale(y, 0.5, device=0, id=f"s{i}_{j}"), w, device=0, id=f"y{i}_{j}")
        x = g.add(y, keep, device=0, id=f"x{i}")
    g.output(x)
    return g


def _runs_right(taskgraph: TaskGraph, memgraph: MemGraph, seeds) -> None:
    """The plan verifies, the independent oracle finds nothing, and random orders give the float64 outputs."""
    verify_memgraph(memgraph)
    assert violations(memgraph, taskgraph) == []
    for seed in seeds:
        assert_matches_reference(taskgraph, memgraph, execute(memgraph, order="random", seed=seed), seed)


def _regions(memgraph: MemGraph, op: str) -> list[tuple[str, int, int]]:
    return [(node.task, node.storage[0], node.storage[0] + node.storage[1]) for node in memgraph.nodes
            if node.storage is not None and node.op == op]


def test_a_dead_offloaded_tensors_storage_is_taken_by_the_next_offload_and_runs_right():
    graph = _layers()
    memgraph = compile_taskgraph(graph, 3 * TILE, inputs="host")
    offloads = _regions(memgraph, "offload")
    assert len({task for task, _, _ in offloads}) >= 3
    assert memgraph.storage_bytes < sum(end - start for _, start, end in offloads + _regions(memgraph, "input"))
    assert len({start for _, start, _ in offloads}) < len(offloads), offloads  # a region taken twice
    _runs_right(graph, memgraph, range(8))


def test_a_reused_region_is_written_only_after_every_reload_of_its_old_tensor():
    import networkx as nx

    memgraph = compile_taskgraph(_layers(), 3 * TILE, inputs="host")
    dag = nx.DiGraph((d, node.id) for node in memgraph.nodes for d in node.inputs + node.mem_deps)
    offloads = [i for i, node in enumerate(memgraph.nodes) if node.op == "offload"]
    checked = 0
    for a in offloads:
        for b in offloads:
            sa, sb = memgraph.nodes[a].storage, memgraph.nodes[b].storage
            if a < b and sa[0] < sb[0] + sb[1] and sb[0] < sa[0] + sa[1]:
                for reload in (i for i, node in enumerate(memgraph.nodes) if node.op == "reload" and a in node.inputs):
                    assert nx.has_path(dag, reload, b), (memgraph.nodes[reload].task, memgraph.nodes[b].task)
                    checked += 1
    assert checked


def test_input_and_output_regions_are_never_shared():
    memgraph = compile_taskgraph(_layers(6), 3 * TILE, inputs="host")
    kept = _regions(memgraph, "input") + [r for r in _regions(memgraph, "offload") if r[0] in memgraph.outputs]
    for task, start, end in kept:
        for node in memgraph.nodes:
            if node.storage is not None and node.task != task:
                assert end <= node.storage[0] or node.storage[0] + node.storage[1] <= start, (task, node.task)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), factor=st.sampled_from([1.0, 1.3, 2.0]))
def test_random_plans_with_reused_storage_verify_and_match_the_reference_in_random_orders(seed, factor):
    graph = random_taskgraph(seed, tasks=40, devices=2, mixed=True)
    memgraph = compile_taskgraph(graph, int(minimum_budget(graph) * factor), inputs="host")
    _runs_right(graph, memgraph, range(3))


def test_page_tables_are_an_eight_byte_entry_per_host_page():
    assert page_table_bytes(0) == 0
    assert page_table_bytes(1) == PAGE_TABLE_ENTRY
    assert page_table_bytes(HOST_PAGE + 1) == 2 * PAGE_TABLE_ENTRY
    assert page_table_bytes(1 << 30) == 2 << 20  # 2 MiB per GiB: what the H200 measured


def test_the_reserve_holds_back_the_page_tables_of_what_is_pinned():
    from frontend.workloads import llama

    graph = llama.build_llama(llama.load_config("tiny"), 64).graph
    nodes = list(graph.nodes.values())
    pinned = 12 << 30
    for provider in ("cublas", "torch-cudnn", "triton"):
        assert library_allowance(nodes, 2, provider, pinned) == library_allowance(nodes, 2, provider) + (24 << 20)
        assert reserve_bytes(nodes, 2, provider, pinned) == reserve_bytes(nodes, 2, provider) + (24 << 20)
    inputs = sum(node.nbytes for node in nodes if node.op == "input")
    budget = 1 << 30
    arena = arena_budget(graph, budget, "cuda", attention="triton")
    assert arena == budget - reserve_bytes(nodes, 2, "triton", inputs + inputs // 8)  # before planning: the inputs, an eighth more
    assert arena_budget(graph, budget, "cpu") == budget


def test_a_plan_that_pins_more_than_the_estimate_is_planned_again_within_the_budget():
    graph = _layers(8)
    budget = 400 << 20
    arena = arena_budget(graph, budget, "cuda", attention="triton")
    memgraph = compile_taskgraph(graph, arena, inputs="host")
    assert refit_arena(memgraph, graph, budget, "cuda", attention="triton") is None  # it pins little
    big = MemGraph(memgraph.devices, memgraph.budget)  # the same arena, pinning 64 GiB more
    big.nodes = list(memgraph.nodes) + [MemNode(len(memgraph.nodes), "input", "pad", None, None, (0, 64 << 30), ())]
    smaller = refit_arena(big, graph, budget, "cuda", attention="triton")
    assert smaller == arena_budget(graph, budget, "cuda", attention="triton", pinned=(64 << 30) * 9 // 8)
    assert smaller < memgraph.budget
    assert refit_arena(big, graph, budget, "cpu") is None

    calls = []

    def compile_at(a):
        calls.append(a)
        return big if len(calls) == 1 else compile_taskgraph(graph, a, inputs="host")

    planned, again = plan_within(graph, budget, compile_at, "cuda", attention="triton")
    assert again and calls == [arena, smaller] and planned.budget == smaller
    assert plan_within(graph, budget, lambda a: compile_taskgraph(graph, a, inputs="host"), "cuda", attention="triton")[1] is False


@pytest.mark.parametrize("placement", ["loosest", "first-fit"])
def test_storage_grows_only_when_no_freed_region_fits(placement):
    from passes.allocator import DeviceMemory

    storage = DeviceMemory(0, placement)
    a = storage.grow_for(512)
    storage.take(a, 512, 0)
    b = storage.grow_for(256)
    storage.take(b, 256, 1)
    assert (a, b, storage.capacity) == (0, 512, 768)
    storage.release(0, step=3)
    assert storage.place_free(256) == 0 and storage.place_free(1024) is None
    fresh = storage.grow_for(256, fresh=True)  # an input: bytes nothing used before
    assert fresh == 768 and storage.capacity == 1024
    storage.take(fresh, 256, 2)
    storage.release(2, step=4)
    assert storage.grow_for(512) == 768 and storage.capacity == 1280  # the trailing free segment, lengthened

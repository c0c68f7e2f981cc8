"""Streaming starts at once (issue 26): when weights start on the GPU, the room they free as the first
layers finish is held for the next weights' reloads, so the host link loads the first streamed layer
while the resident layers compute instead of waiting for the last of them. Checked on the plan's
structure (which kernels a reload waits for), not on timing."""

from __future__ import annotations

import re

import pytest

from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from turnip_ir.memgraph import MemGraph

GIB = 1 << 30


def _layer(node) -> int | None:
    """The decoder layer of a kernel ('l3.q[0,0]') or of a weight ('model.layers.3.mlp...'), else None."""
    match = re.match(r"l(\d+)\.", node.task) or re.match(r"model\.layers\.(\d+)\.", node.task)
    return int(match.group(1)) if match else None


def _kernels_before(memgraph: MemGraph, vertex: int) -> set[int]:
    """Every kernel `vertex` waits for, through data and memory edges."""
    seen, stack = set(), [vertex]
    while stack:
        for dep in memgraph.nodes[stack.pop()].deps():
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return {v for v in seen if memgraph.nodes[v].op == "kernel"}


@pytest.fixture(scope="module")
def plan_8k_2gib() -> MemGraph:
    graph = llama.build_llama(llama.load_config("7b"), 8192).graph
    return compile_taskgraph(graph, 2 * GIB, inputs="gpu")


def test_the_first_reload_waits_only_for_the_first_layer(plan_8k_2gib):
    memgraph = plan_8k_2gib
    first = next(node for node in memgraph.nodes if node.op == "reload")
    waits = {_layer(memgraph.nodes[k]) for k in _kernels_before(memgraph, first.id)}
    assert _layer(first) >= 2 and waits == {0}, (first.task, sorted(waits))


def test_the_first_streamed_layer_loads_while_the_later_resident_layers_compute(plan_8k_2gib):
    memgraph = plan_8k_2gib
    reloads = [node for node in memgraph.nodes if node.op == "reload"]
    streamed = _layer(reloads[0])  # the first layer whose weights come over the link; the ones before start on the GPU
    for node in reloads:
        if _layer(node) == streamed:
            waits = {_layer(memgraph.nodes[k]) for k in _kernels_before(memgraph, node.id)}
            assert max(waits) < streamed // 2, (node.task, sorted(waits))


def test_freed_at_is_the_newest_stamp_of_the_free_segments_a_placement_covers():
    from passes.allocator import DeviceMemory

    memory = DeviceMemory(4 * 256)
    for tensor in range(4):
        memory.take(tensor * 256, 256, tensor)
    memory.release(1, step=7)
    memory.release(2, step=3)
    assert memory.freed_at(256, 512) == 7 and memory.freed_at(512, 256) == 3
    assert DeviceMemory(256).freed_at(0, 256) == -1  # never used

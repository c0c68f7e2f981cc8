"""Cross-checks of the bitset graph algorithms against networkx on small graphs (networkx is too slow
for big ones: its transitive reduction took 46 s at 10k nodes, which is why the passes do not use it)."""

from __future__ import annotations

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.insert_offload import minimum_budget
from passes.minimize_memory_deps import minimize_memory_deps
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from passes.reduce_memory_deps import reduce_memory_deps
from turnip_ir.verifier import verify_memgraph
from tools.random_graphs import random_taskgraph


def _unreduced(seed: int, devices: int, factor: float):
    graph = place_devices(random_taskgraph(seed, tasks=30, devices=devices, sizes=(8, 16), window=8))
    budget = int(minimum_budget(graph) * factor)
    return graph, compile_taskgraph(graph, budget, minimize=False, reduce=False, verify=False)


def _digraph(memgraph) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(node.id for node in memgraph.nodes)
    g.add_edges_from((dep, node.id) for node in memgraph.nodes for dep in node.deps())
    return g


def _memory_only_edges(memgraph) -> set[tuple[int, int]]:
    return {(d, n.id) for n in memgraph.nodes for d in n.mem_deps if d not in n.inputs}


CASES = st.tuples(st.integers(0, 5000), st.integers(1, 3), st.sampled_from([1.0, 1.2, 1.6, 3.0]))


@settings(max_examples=200, deadline=None)
@given(CASES)
def test_reduction_keeps_exactly_the_memory_edges_networkx_keeps(case):
    taskgraph, memgraph = _unreduced(*case)
    expected = _memory_only_edges(memgraph) & set(nx.transitive_reduction(_digraph(memgraph)).edges)
    reachability = nx.transitive_closure_dag(_digraph(memgraph))
    reduce_memory_deps(memgraph)
    assert _memory_only_edges(memgraph) == expected
    assert set(nx.transitive_closure_dag(_digraph(memgraph)).edges) == set(reachability.edges)
    verify_memgraph(memgraph, taskgraph)


@settings(max_examples=200, deadline=None)
@given(CASES)
def test_minimization_preserves_reachability(case):
    taskgraph, memgraph = _unreduced(*case)
    reachability = set(nx.transitive_closure_dag(_digraph(memgraph)).edges)
    minimize_memory_deps(memgraph)
    assert set(nx.transitive_closure_dag(_digraph(memgraph)).edges) == reachability
    verify_memgraph(memgraph, taskgraph)

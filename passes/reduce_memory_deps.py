"""Transitive reduction of memory edges: remove every memory edge that another path already implies.

Data edges are never removed. Nodes are visited in topological order (`turnip_ir.ancestors`); a node's
predecessors are visited from the latest to the earliest, and one already among the ancestors of the
later ones is implied: if it is a memory edge it goes. Only the sources of memory edges still to be
visited are watched, so the ancestor sets hold about as many bits as memory edges span the current
node, not one per node: work is O(edges x watched / 64) word operations.
"""

from __future__ import annotations

from dataclasses import dataclass


from turnip_ir.ancestors import implied_predecessors
from passes.compact import drop_memory_edges
from turnip_ir.memarrays import MemArrays, csr_union
from passes.compilation import Compilation
from passes.compile_stats import add, timed
from passes.graph_pass import GraphPass, memgraph_of
from turnip_ir.memgraph import MemGraph


def reduce_memory_deps(graph: MemGraph, arrays: MemArrays | None = None) -> int:
    """Remove implied memory edges of `graph` in place; returns how many were removed."""
    arrays = arrays or MemArrays.build(graph.nodes)
    ptr, idx = csr_union(arrays.data_ptr, arrays.data_idx, arrays.mem_ptr, arrays.mem_idx, descending=True)
    implied = implied_predecessors(ptr, idx, arrays.mem_ptr, arrays.mem_idx)
    return drop_memory_edges(graph, arrays, ptr, idx, implied)


@dataclass(frozen=True)
class ReduceMemoryDepsPass(GraphPass):
    """Remove every memory edge that another path of data or memory edges implies.

    A transitive reduction restricted to memory edges; data edges are never removed. The shared
    ancestor sweep (turnip_ir/ancestors.py) visits each node's predecessors latest first; one that a
    later predecessor already reaches is implied, and if it is a memory edge it goes. Only the
    sources of memory edges still to be visited are watched.
    """

    name = "turnip-reduce-memory-deps"
    reads = ("graph", "arrays")
    adds = ("arrays",)

    def run(self, state: Compilation) -> None:
        graph = memgraph_of(state.graph, self.name)
        with timed(state.stats, "reduce"):
            removed = reduce_memory_deps(graph, state.memarrays())
        add(state.stats, edges_removed_reduce=removed)

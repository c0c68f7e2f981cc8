"""Memory-edge minimization: drop memory edges that a two-step path through another kept edge implies.

The placement half of minimization happens in the allocator (`passes.allocator`): among the free
regions that fit, it takes the one freed longest ago, which adds the loosest edges. This pass is the
cheap local half: for each node it visits its predecessors from the latest to the earliest and drops a
memory edge u -> w when u is a direct predecessor of a kept predecessor of w (u -> x -> w). The
typical case is reader -> offload -> new writer. Cost: one pass over the edges with set lookups;
`turnip-reduce-memory-deps` does the full transitive reduction afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from passes.compact import drop_memory_edges
from turnip_ir.memarrays import MemArrays, csr_union, data_entries
from passes.compilation import Compilation
from passes.compile_stats import add, timed
from passes.graph_pass import GraphPass, memgraph_of
from turnip_ir.memgraph import MemGraph


def minimize_memory_deps(graph: MemGraph, arrays: MemArrays | None = None) -> int:
    """Drop locally implied memory edges of `graph` in place; returns how many were removed."""
    arrays = arrays or MemArrays.build(graph.nodes)
    ptr, idx = csr_union(arrays.data_ptr, arrays.data_idx, arrays.mem_ptr, arrays.mem_idx, descending=True)
    has_mem = np.diff(arrays.mem_ptr) > 0
    return drop_memory_edges(graph, arrays, ptr, idx, _two_step(ptr, idx, data_entries(arrays, ptr, idx), has_mem))


@njit(cache=True)
def _two_step(ptr, idx, is_data, has_mem):
    """Per predecessor entry (rows latest first): a memory-only predecessor u of w that is a kept
    predecessor's own predecessor (u -> x -> w). Earlier nodes' drops count, as in one forward pass."""
    n = ptr.shape[0] - 1
    alive = np.ones(idx.shape[0], np.bool_)
    implied = np.zeros(idx.shape[0], np.bool_)
    longest = 1
    for w in range(n):
        longest = max(longest, ptr[w + 1] - ptr[w])
    kept = np.empty(longest, np.int64)
    for w in range(n):
        if not has_mem[w]:
            continue
        count = 0
        for e in range(ptr[w], ptr[w + 1]):
            u = idx[e]
            if not is_data[e] and _before_any(ptr, idx, alive, kept, count, u):
                implied[e] = True
                alive[e] = False
            else:
                kept[count] = u
                count += 1
    return implied


@njit(cache=True)
def _before_any(ptr, idx, alive, kept, count, u):
    """Is `u` a live predecessor of one of kept[:count]? (rows sorted descending: binary search)"""
    for k in range(count):
        lo, hi = ptr[kept[k]], ptr[kept[k] + 1]
        while lo < hi:
            mid = (lo + hi) // 2
            if idx[mid] > u:
                lo = mid + 1
            else:
                hi = mid
        if lo < ptr[kept[k] + 1] and idx[lo] == u and alive[lo]:
            return True
    return False


@dataclass(frozen=True)
class MinimizeMemoryDepsPass(GraphPass):
    """Drop memory edges implied by a two-step path through another kept edge.

    The cheap local half of minimization: visiting each node's predecessors latest first, a memory
    edge u -> w goes when u is a direct predecessor of a kept predecessor x of w (u -> x -> w), so
    each dropped edge is justified by a kept one. The typical case is reader -> offload -> new
    writer. Cheap: binary searches in sorted predecessor rows. The allocator already chose the
    loosest free regions, and turnip-reduce-memory-deps removes what longer paths imply.
    """

    name = "turnip-minimize-memory-deps"
    reads = ("graph", "arrays")
    adds = ("arrays",)

    def run(self, state: Compilation) -> None:
        graph = memgraph_of(state.graph, self.name)
        with timed(state.stats, "minimize"):
            removed = minimize_memory_deps(graph, state.memarrays())
        add(state.stats, edges_removed_minimize=removed)

"""Memory dependencies: when a location is reused, the new writer waits for the old occupant and its readers.

The last-writer sweep (turnip_ir/last_writer.py) tells, per space (each GPU, and CPU storage), which earlier
writes each node overwrites. A node that writes a range gets an edge from each last writer it
overlaps and from every reader of that writer placed before it, an offload included: offloads wait
for nothing but their tensor, so this is where the readers' safety lives. Only the last writer per
byte matters: older ones were already ordered before it the same way. An edge that a path of data
edges already implies is stored in `redundant_deps` (kept for pictures, ignored by the runtime)
instead of `mem_deps`; whether a source is a data ancestor is one question to turnip_ir/ancestors.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from turnip_ir.ancestors import ancestor_answers
from turnip_ir.memarrays import MemArrays, row_of
from passes.compilation import Compilation
from passes.compile_stats import add, timed
from passes.graph_pass import GraphPass, memgraph_of
from turnip_ir.last_writer import Overwrites
from turnip_ir.memgraph import MemGraph


def insert_memory_deps(graph: MemGraph, arrays: MemArrays | None = None) -> tuple[int, int]:
    """Add the reuse edges to `graph` in place; returns (edges added to mem_deps, edges marked redundant).

    `arrays`, when given, are `graph`'s (a pipeline builds them once) and are kept in step."""
    arrays = arrays or MemArrays.build(graph.nodes)
    over = Overwrites(arrays)
    ptr, sources = _sources(over.ptr, over.writer, arrays.read_ptr, arrays.read_idx, arrays.mem_ptr, arrays.mem_idx)
    implied = ancestor_answers(arrays.data_ptr, arrays.data_idx, ptr, sources)
    added = ~implied
    named = np.asarray(arrays.ids, dtype=np.int64)[sources]
    for w, deps in _rows(ptr, named, added):
        graph.nodes[w].mem_deps += deps
    for w, deps in _rows(ptr, named, implied):
        node = graph.nodes[w]
        node.redundant_deps = tuple(dict.fromkeys(node.redundant_deps + deps))
    arrays.set_mem(np.concatenate([row_of(arrays.mem_ptr), row_of(ptr)[added]]), np.concatenate([arrays.mem_idx, sources[added]]))
    redundant = int(np.count_nonzero(implied))
    return len(sources) - redundant, redundant


def _rows(ptr: np.ndarray, values: np.ndarray, keep: np.ndarray):
    """(row, tuple of its kept values in order) for each row of the CSR (ptr, values) that keeps any."""
    counts = np.bincount(row_of(ptr)[keep], minlength=len(ptr) - 1)
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    kept = values[keep].tolist()
    return ((w, tuple(kept[bounds[w] : bounds[w + 1]])) for w in np.flatnonzero(counts).tolist())


@njit(cache=True)
def _sources(over_ptr, writer, read_ptr, read_idx, mem_ptr, mem_idx):
    """Per node w, ascending: the last writers of the bytes w overwrites and their readers placed before w,
    without w itself and its existing memory dependencies (CSR)."""
    n = over_ptr.shape[0] - 1
    seen = np.full(n, -1, np.int64)
    ptr = np.zeros(n + 1, np.int64)
    out = np.empty(max(16, 4 * writer.shape[0]), np.int64)
    m = 0
    for w in range(n):
        seen[w] = w
        for e in range(mem_ptr[w], mem_ptr[w + 1]):
            seen[mem_idx[e]] = w
        start = m
        for k in range(over_ptr[w], over_ptr[w + 1]):
            x = writer[k]
            for e in range(read_ptr[x] - 1, read_ptr[x + 1]):
                u = x if e < read_ptr[x] else read_idx[e]
                if u < w and seen[u] != w:
                    seen[u] = w
                    if m == out.shape[0]:
                        bigger = np.empty(2 * m, np.int64)
                        for i in range(m):
                            bigger[i] = out[i]
                        out = bigger
                    at = m  # insertion sort: a node has a handful of sources
                    while at > start and out[at - 1] > u:
                        out[at] = out[at - 1]
                        at -= 1
                    out[at] = u
                    m += 1
        ptr[w + 1] = m
    return ptr, out[:m].copy()


@dataclass(frozen=True)
class InsertMemoryDepsPass(GraphPass):
    """Add a memory dependency wherever a location or storage region is reused.

    The last-writer sweep (turnip_ir/last_writer.py) finds, per space (each GPU, CPU storage), the
    earlier writes each node overwrites. The node waits for their last writer and every reader of it
    placed before it, an offload included; older writers were already ordered before that last
    writer the same way. Edges that a data path already implies (asked of the ancestor sweep) go to
    `redundant_deps`, drawn dashed and ignored at run time.
    """

    name = "turnip-insert-memory-deps"
    reads = ("graph", "arrays")
    adds = ("arrays",)

    def run(self, state: Compilation) -> None:
        graph = memgraph_of(state.graph, self.name)
        with timed(state.stats, "memory-deps"):
            added, redundant = insert_memory_deps(graph, state.memarrays())
        add(state.stats, edges_added=added, edges_redundant=redundant)

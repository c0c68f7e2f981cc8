"""Memory dependencies: when a location is reused, the new writer waits for the old occupant and its readers.

One sweep over the nodes in their topological order keeps, per space (each GPU, and CPU storage), the
last writer of every byte (`RegionMap`). A node that writes a range gets an edge from each last writer
it overlaps and from every reader of that writer, an offload included: offloads wait for nothing but
their tensor, so this is where the readers' safety lives. Only the last writer per byte matters:
older ones were already ordered before it the same way. An edge that a path of data edges already implies is stored
in `redundant_deps` (kept for pictures, ignored by the runtime) instead of `mem_deps`.
"""

from __future__ import annotations

from dataclasses import dataclass


from passes.ir import GraphPass, memgraph_of
from passes.stats import collected, timed
from passes.compact import CompactMem, RegionMap, successor_counts
from turnip_ir.memgraph import MemGraph


def insert_memory_deps(graph: MemGraph) -> tuple[int, int]:
    """Add the reuse edges to `graph` in place; returns (edges added to mem_deps, edges marked redundant)."""
    view = CompactMem.build(graph)
    spaces: dict[int, RegionMap] = {}
    left = successor_counts(view.data)
    ancestors: list[int | None] = [None] * len(view)
    added = redundant = 0
    for w in range(len(view)):
        anc = _data_ancestors(view, w, ancestors, left)
        region = view.writes[w]
        if region is None:
            continue
        regions = spaces.setdefault(region[0], RegionMap())
        sources = _previous_users(view, regions, region, w)
        node = graph.nodes[w]
        mem, dashed = list(node.mem_deps), list(node.redundant_deps)
        have = set(view.mem[w])
        for src in sorted(sources - have):
            if (anc >> src) & 1:
                dashed.append(view.ids[src])
                redundant += 1
            else:
                mem.append(view.ids[src])
                added += 1
        node.mem_deps, node.redundant_deps = tuple(mem), tuple(dict.fromkeys(dashed))
        regions.write(region[1], region[2], w)
    return added, redundant


def _previous_users(view: CompactMem, regions: RegionMap, region, w: int) -> set[int]:
    """The last writers of the bytes `w` overwrites and their readers placed before `w`."""
    sources: set[int] = set()
    for _, _, x in regions.overlapping(region[1], region[2]):
        sources.add(x)
        sources.update(r for r in view.readers[x] if r < w)
    sources.discard(w)
    return sources


def _data_ancestors(view: CompactMem, w: int, ancestors: list, left: list[int]) -> int:
    """The bitset of nodes with a data path to `w`; frees each predecessor's set after its last reader."""
    anc = 0
    for p in view.data[w]:
        anc |= ancestors[p] | (1 << p)
        left[p] -= 1
        if left[p] == 0:
            ancestors[p] = None
    ancestors[w] = anc if left[w] else None
    return anc


@dataclass(frozen=True)
class InsertMemoryDepsPass(GraphPass):
    """Add a memory dependency wherever a location or storage region is reused.

    A node that overwrites bytes waits for their last writer and every reader of it (or its offload).
    Edges that a data path already implies are stored as redundant (drawn dashed, ignored at run time).
    """

    name = "turnip-insert-memory-deps"

    def transform(self, graph: MemGraph) -> MemGraph:
        graph = memgraph_of(graph, self.name)
        stats = collected.get()
        with timed(stats, "memory-deps"):
            added, redundant = insert_memory_deps(graph)
        if stats is not None:
            stats.edges_added += added
            stats.edges_redundant += redundant
        return graph

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


from passes.ir import GraphPass, count_into, memgraph_of
from passes.compact import CompactMem
from turnip_ir.memgraph import MemGraph


def minimize_memory_deps(graph: MemGraph) -> int:
    """Drop locally implied memory edges of `graph` in place; returns how many were removed."""
    view = CompactMem.build(graph)
    pred_sets = [set(d) | set(m) for d, m in zip(view.data, view.mem)]
    removed = 0
    for w, node in enumerate(graph.nodes):
        if not view.mem[w]:
            continue
        data = set(view.data[w])
        kept: list[int] = []
        drop: set[int] = set()
        for p in sorted(pred_sets[w], reverse=True):
            only_memory = p not in data
            if only_memory and any(p in pred_sets[k] for k in kept):
                drop.add(p)
            else:
                kept.append(p)
        drop |= data & set(view.mem[w])
        if drop:
            removed += sum(1 for m in view.mem[w] if m in drop)
            node.mem_deps = tuple(view.ids[m] for m in dict.fromkeys(view.mem[w]) if m not in drop)
            pred_sets[w] -= drop - data
    return removed


@dataclass(frozen=True)
class MinimizeMemoryDepsPass(GraphPass):
    """Drop memory edges implied by a two-step path through another kept edge.

    The cheap local half of minimization (reader -> offload -> writer makes reader -> writer
    unnecessary); the allocator already chose the loosest free regions, and
    turnip-reduce-memory-deps removes what longer paths imply.
    """

    name = "turnip-minimize-memory-deps"

    def transform(self, graph: MemGraph) -> MemGraph:
        return count_into(memgraph_of(graph, self.name), "minimize", minimize_memory_deps, "edges_removed_minimize")

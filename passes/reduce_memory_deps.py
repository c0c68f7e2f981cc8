"""Transitive reduction of memory edges: remove every memory edge that another path already implies.

Data edges are never removed. Nodes are visited in topological order; each keeps the bitset of its
ancestors (a Python int over positions). A node's predecessors are visited from the latest to the
earliest: a predecessor already in the union of the later ones' ancestors is implied, and if it is
a memory edge it goes. A bitset is freed once its last successor is visited, so memory stays near the
frontier's width times n/8 bytes. Work is O(edges * n / 64) word operations.
"""

from __future__ import annotations

from dataclasses import dataclass


from passes.ir import GraphPass, count_into, memgraph_of
from passes.compact import CompactMem, successor_counts
from turnip_ir.memgraph import MemGraph


def reduce_memory_deps(graph: MemGraph) -> int:
    """Remove implied memory edges of `graph` in place; returns how many were removed."""
    view = CompactMem.build(graph)
    preds = [sorted(set(d) | set(m), reverse=True) for d, m in zip(view.data, view.mem)]
    left = successor_counts(preds)
    ancestors: list[int | None] = [None] * len(view)
    removed = 0
    for w, node in enumerate(graph.nodes):
        data = set(view.data[w])
        acc = 0
        drop: set[int] = set()
        for p in preds[w]:
            if (acc >> p) & 1:
                if p not in data:
                    drop.add(p)
            else:
                acc |= ancestors[p] | (1 << p)
            left[p] -= 1
            if left[p] == 0:
                ancestors[p] = None
        drop |= data & set(view.mem[w])
        if drop:
            removed += sum(1 for m in view.mem[w] if m in drop)
            node.mem_deps = tuple(view.ids[m] for m in dict.fromkeys(view.mem[w]) if m not in drop)
        ancestors[w] = acc if left[w] else None
    return removed


@dataclass(frozen=True)
class ReduceMemoryDepsPass(GraphPass):
    """Remove every memory edge that another path of data or memory edges implies.

    A transitive reduction restricted to memory edges, with ancestor bitsets over the topological
    order; data edges are never removed.
    """

    name = "turnip-reduce-memory-deps"

    def transform(self, graph: MemGraph) -> MemGraph:
        return count_into(memgraph_of(graph, self.name), "reduce", reduce_memory_deps, "edges_removed_reduce")

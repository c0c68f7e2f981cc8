"""Compact integer-indexed views shared by the memgraph passes: positions, predecessor lists, regions.

A memgraph's nodes are kept in a topological order, so a node's index in `MemGraph.nodes` is its
position. `CompactMem` holds, per position, the data and memory predecessors as positions, the readers
of each node and the (space, start, end) region each node writes. Spaces are GPU numbers 0..D-1 and
`STORAGE` for the CPU storage buffer (both from `turnip_ir.sweep`, re-exported here). Passes build one `CompactMem`, work on it, and write back once.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnip_ir.memgraph import MemGraph
from turnip_ir.sweep import STORAGE, RegionMap, successor_counts, written_region

__all__ = ["STORAGE", "CompactMem", "RegionMap", "TaskView", "successor_counts", "written_region"]


@dataclass
class CompactMem:
    """Positions, predecessors and written regions of a memgraph's nodes, in its node order."""

    ids: list[int]
    data: list[list[int]]
    mem: list[list[int]]
    readers: list[list[int]]
    writes: list[tuple[int, int, int] | None]
    """(space, start, end) written by each node, or None."""

    @classmethod
    def build(cls, graph: MemGraph) -> CompactMem:
        pos = {node.id: i for i, node in enumerate(graph.nodes)}
        ids = [node.id for node in graph.nodes]
        data = [[pos[i] for i in node.inputs] for node in graph.nodes]
        mem = [[pos[i] for i in node.mem_deps] for node in graph.nodes]
        readers: list[list[int]] = [[] for _ in ids]
        for i, preds in enumerate(data):
            for p in dict.fromkeys(preds):
                readers[p].append(i)
        return cls(ids, data, mem, readers, [written_region(node) for node in graph.nodes])

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class TaskView:
    """A placed taskgraph by position: ops, operand positions, devices, byte sizes, outputs, readers."""

    ids: list[str]
    ops: list[str]
    inputs: list[list[int]]
    devices: list[int]
    nbytes: list[int]
    outputs: list[int]
    readers: list[list[int]]

    @classmethod
    def build(cls, graph) -> TaskView:
        pos = {node_id: i for i, node_id in enumerate(graph.nodes)}
        nodes = list(graph.nodes.values())
        inputs = [[pos[i] for i in node.inputs] for node in nodes]
        readers: list[list[int]] = [[] for _ in nodes]
        for i, operands in enumerate(inputs):
            for p in dict.fromkeys(operands):
                readers[p].append(i)
        return cls(
            ids=[node.id for node in nodes],
            ops=[node.op for node in nodes],
            inputs=inputs,
            devices=[node.device for node in nodes],
            nbytes=[node.nbytes for node in nodes],
            outputs=[pos[i] for i in graph.effective_outputs()],
            readers=readers,
        )

    def __len__(self) -> int:
        return len(self.ids)

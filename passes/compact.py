"""Compact integer-indexed views shared by the memgraph passes: positions, predecessor lists, regions.

A memgraph's nodes are kept in a topological order, so a node's index in `MemGraph.nodes` is its
position. `CompactMem` holds, per position, the data and memory predecessors as positions, the readers
of each node and the (space, start, end) region each node writes. Spaces are GPU numbers 0..D-1 and
`STORAGE` (-1) for the CPU storage buffer. Passes build one `CompactMem`, work on it, and write back once.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from turnip_ir.memgraph import MemGraph

STORAGE = -1
"""The space number of the CPU storage buffer."""


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


def written_region(node) -> tuple[int, int, int] | None:
    """The region a node writes: its GPU location, or its storage region for offloads and storage inputs."""
    if node.loc is not None and node.device is not None:
        return (node.device, node.loc[0], node.loc[0] + node.loc[1])
    if node.storage is not None:
        return (STORAGE, node.storage[0], node.storage[0] + node.storage[1])
    return None


class RegionMap:
    """The last writer of every byte of one space, as sorted disjoint segments [start, end) -> writer."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.owners: list[int] = []

    def overlapping(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(start, end, writer) for every segment meeting [start, end); an empty range meets nothing."""
        if start >= end:
            return []
        i = max(bisect_right(self.starts, start) - 1, 0)
        found = []
        while i < len(self.starts) and self.starts[i] < end:
            if self.ends[i] > start:
                found.append((self.starts[i], self.ends[i], self.owners[i]))
            i += 1
        return found

    def write(self, start: int, end: int, owner: int) -> None:
        """Make `owner` the last writer of [start, end), trimming the segments it covers."""
        if start >= end:
            return  # a zero-byte tensor writes nothing
        lo = max(bisect_right(self.starts, start) - 1, 0)
        hi = lo
        keep_s, keep_e, keep_o = [], [], []
        tail = None
        while hi < len(self.starts) and self.starts[hi] < end:
            s, e, o = self.starts[hi], self.ends[hi], self.owners[hi]
            if e <= start:
                keep_s.append(s), keep_e.append(e), keep_o.append(o)
            else:
                if s < start:
                    keep_s.append(s), keep_e.append(start), keep_o.append(o)
                if e > end:
                    tail = (end, e, o)
            hi += 1
        keep_s.append(start), keep_e.append(end), keep_o.append(owner)
        if tail is not None:
            keep_s.append(tail[0]), keep_e.append(tail[1]), keep_o.append(tail[2])
        self.starts[lo:hi] = keep_s
        self.ends[lo:hi] = keep_e
        self.owners[lo:hi] = keep_o


def successor_counts(preds: list[list[int]]) -> list[int]:
    """How many times each position is named as a predecessor (for freeing bitsets early)."""
    counts = [0] * len(preds)
    for ps in preds:
        for p in ps:
            counts[p] += 1
    return counts


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

"""What a sweep over a memgraph in topological order needs, shared by the memory-edge pass and the verifier.

`written_region` is the region a node writes, as (space, start, end): spaces are GPU numbers 0..D-1
and `STORAGE` for the CPU storage buffer. `RegionMap` keeps the last writer of every byte of one space.
`successor_counts` says when a node's ancestor bitset can be freed. The verifier lives in `turnip_ir`
(so the runtime can call it), hence these live here too; the independent oracle in tests/ uses none of them.
"""

from __future__ import annotations

from bisect import bisect_right

STORAGE = -1
"""The space number of the CPU storage buffer."""


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

"""A memgraph as arrays: `MemArrays` holds, per position, the data and memory predecessors and the readers
as CSR numpy arrays, and the (space, start, end) region each node writes.

A memgraph's nodes are kept in a topological order, so a node's index in `MemGraph.nodes` is its
position. Spaces are GPU numbers 0..D-1 and `STORAGE` (-1) for the CPU storage buffer. The verifier
(turnip_ir/verifier.py) and the memory passes build the arrays once and run compiled sweeps on them
(turnip_ir/last_writer.py, turnip_ir/ancestors.py). They live here, below the passes, so that the runtime can
prove a plan race-free before running it without importing a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from turnip_ir.memgraph import MemNode

STORAGE = -1
"""The space number of the CPU storage buffer."""
NOWHERE = -2
"""The space of a node that writes nothing."""


@dataclass
class MemArrays:
    """A memgraph's nodes by position (their order in `nodes`), as CSR arrays of positions.

    `data_*`: operands in order (repeats kept); `mem_*`: memory dependencies; `read_*`: the distinct
    readers of each node, ascending; `space`, `start`, `end`: the region each node writes (space
    NOWHERE when it writes none).
    """

    ids: list[int]
    data_ptr: np.ndarray
    data_idx: np.ndarray
    mem_ptr: np.ndarray
    mem_idx: np.ndarray
    read_ptr: np.ndarray
    read_idx: np.ndarray
    space: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def build(cls, nodes: list[MemNode]) -> MemArrays:
        """Arrays for `nodes`; every id they name must be among them (KeyError otherwise)."""
        ids = [node.id for node in nodes]
        data_ptr, data_idx = _csr([node.inputs for node in nodes], ids)
        mem_ptr, mem_idx = _csr([node.mem_deps for node in nodes], ids)
        read_ptr, read_idx = _sorted_csr(data_idx, row_of(data_ptr), len(nodes))
        regions = np.fromiter(chain.from_iterable(map(_region, nodes)), dtype=np.int64, count=3 * len(nodes))
        space, start, end = (np.ascontiguousarray(regions[k::3]) for k in range(3))
        return cls(ids, data_ptr, data_idx, mem_ptr, mem_idx, read_ptr, read_idx, space, start, end)

    def __len__(self) -> int:
        return len(self.ids)

    def set_mem(self, rows: np.ndarray, idx: np.ndarray) -> None:
        """Make the memory dependencies the entries (row, idx), kept in their order within a row."""
        order = np.argsort(rows, kind="stable")
        self.mem_ptr = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=len(self)), out=self.mem_ptr[1:])
        self.mem_idx = idx[order]


def _csr(rows: list[tuple[int, ...]], ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """CSR of rows of node ids, as positions (a memgraph's ids are usually its positions already)."""
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=ptr[1:])
    flat = chain.from_iterable(rows)
    if ids != list(range(len(ids))):
        pos = {node_id: i for i, node_id in enumerate(ids)}
        flat = (pos[i] for i in flat)
    return ptr, np.fromiter(flat, dtype=np.int64, count=int(ptr[-1]))


def _region(node: MemNode) -> tuple[int, int, int]:
    return written_region(node) or (NOWHERE, 0, 0)


def csr_union(a_ptr, a_idx, b_ptr, b_idx, descending: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the distinct union of two CSR rows, sorted (for predecessors: data plus memory)."""
    n = len(a_ptr) - 1
    rows = np.concatenate([row_of(a_ptr), row_of(b_ptr)])
    cols = np.concatenate([a_idx, b_idx])
    if not descending:
        return _sorted_csr(rows, cols, n)
    ptr, flipped = _sorted_csr(rows, n - 1 - cols, n)
    return ptr, n - 1 - flipped


def row_of(ptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))


def _sorted_csr(rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the distinct (row, col) pairs, each row's cols ascending."""
    keys = distinct(rows * n + cols)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // n, minlength=n), out=ptr[1:])
    return ptr, keys % n


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (np.unique by sorting: numpy 2's hash path is slower here)."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=np.bool_)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def data_entries(arrays: MemArrays, ptr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """For each entry (w, p) of a CSR of predecessors: is p a data predecessor (an operand) of w?"""
    n = len(arrays)
    return member(row_of(ptr) * n + idx, distinct(row_of(arrays.data_ptr) * n + arrays.data_idx))


def member(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Is each key in the ascending array `table`?"""
    at = np.minimum(np.searchsorted(table, keys), max(len(table) - 1, 0))
    return (table[at] == keys) if len(table) else np.zeros(len(keys), dtype=np.bool_)


def written_region(node) -> tuple[int, int, int] | None:
    """The region a node writes: its GPU location, or its storage region for offloads and storage inputs."""
    if node.loc is not None and node.device is not None:
        return (node.device, node.loc[0], node.loc[0] + node.loc[1])
    if node.storage is not None:
        return (STORAGE, node.storage[0], node.storage[0] + node.storage[1])
    return None

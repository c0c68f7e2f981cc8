"""Compact integer-indexed views for the passes: `TaskView` for taskgraphs, and `drop_memory_edges`, the
write-back the memory-edge passes share. Memgraphs' arrays (`MemArrays` and its CSR helpers) live in
`turnip_ir.memarrays`, below the verifier; the passes import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from turnip_ir.memarrays import MemArrays, data_entries, distinct, member, row_of


def drop_memory_edges(graph, arrays: MemArrays, ptr: np.ndarray, idx: np.ndarray, implied: np.ndarray) -> int:
    """Remove the memory edges marked `implied` in the predecessor CSR (ptr, idx), and those that repeat
    a data edge, from `graph` in place, keeping `arrays` in step; returns how many `mem_deps` entries
    went. A node that loses one keeps the rest once each, in their order."""
    n = len(arrays)
    keys = row_of(ptr) * n + idx
    in_data = data_entries(arrays, ptr, idx)
    gone = distinct(np.concatenate([keys[implied & ~in_data], keys[in_data]]))
    mem_rows = row_of(arrays.mem_ptr)
    mem_keys = mem_rows * n + arrays.mem_idx
    dropped = member(mem_keys, gone)
    first = np.zeros(len(mem_keys), dtype=np.bool_)
    first[np.unique(mem_keys, return_index=True)[1]] = True
    kept = ~dropped & first
    kept_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(mem_rows[kept], minlength=n), out=kept_ptr[1:])
    kept_ids = [arrays.ids[m] for m in arrays.mem_idx[kept].tolist()]
    bounds = kept_ptr.tolist()
    changed = distinct(mem_rows[dropped])
    for w in changed.tolist():
        graph.nodes[w].mem_deps = tuple(kept_ids[bounds[w] : bounds[w + 1]])
    touched = np.zeros(n, dtype=np.bool_)
    touched[changed] = True
    stay = kept | ~touched[mem_rows]
    arrays.set_mem(mem_rows[stay], arrays.mem_idx[stay])
    return int(np.count_nonzero(dropped))


@dataclass
class TaskView:
    """A placed taskgraph by position: ops, operand positions, devices, byte sizes, outputs; `readers` on demand."""

    ids: list[str]
    ops: list[str]
    inputs: list[list[int]]
    devices: list[int]
    nbytes: list[int]
    outputs: list[int]

    @classmethod
    def build(cls, graph) -> TaskView:
        pos = {node_id: i for i, node_id in enumerate(graph.nodes)}
        nodes = list(graph.nodes.values())
        return cls(
            ids=[node.id for node in nodes],
            ops=[node.op for node in nodes],
            inputs=[[pos[i] for i in node.inputs] for node in nodes],
            devices=[node.device for node in nodes],
            nbytes=[node.nbytes for node in nodes],
            outputs=[pos[i] for i in graph.effective_outputs()],
        )

    @cached_property
    def readers(self) -> list[list[int]]:
        """Per position, the distinct positions that read it, ascending (built on first use: only the
        `dfs` and `memory` schedules ask)."""
        readers: list[list[int]] = [[] for _ in self.inputs]
        for i, operands in enumerate(self.inputs):
            for p in dict.fromkeys(operands):
                readers[p].append(i)
        return readers

    def __len__(self) -> int:
        return len(self.ids)

"""A tiny sequential memgraph interpreter for tests: bytes in per-GPU arenas and a storage buffer.

It runs the nodes in a random topological order of `inputs` + `mem_deps` (never `redundant_deps`),
reading and writing only through each node's location, so a missing memory edge shows up as a wrong
value under some order. Arenas start as NaN so reading unwritten memory is visible too. Kernels are
the formulas of `kernel_formulas` (float64, then stored in the node's dtype), not the runtime's.
"""

from __future__ import annotations

import random

import numpy as np

from kernel_formulas import apply

from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph


def input_values(graph: TaskGraph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n.id: rng.standard_normal(n.shape) for n in graph.nodes.values() if n.op == "input"}


def random_topological(graph: MemGraph, rng: random.Random) -> list:
    by_id = graph.by_id()
    waiting = {n.id: len(set(n.deps())) for n in graph.nodes}
    users: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
    for n in graph.nodes:
        for d in set(n.deps()):
            users[d].append(n.id)
    ready = [i for i, w in waiting.items() if w == 0]
    order = []
    while ready:
        node_id = ready.pop(rng.randrange(len(ready)))
        order.append(by_id[node_id])
        for u in users[node_id]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    assert len(order) == len(graph.nodes), "memgraph has a cycle"
    return order


class Machine:
    """The arenas: one float-NaN-filled byte buffer per GPU and one for CPU storage."""

    def __init__(self, graph: MemGraph) -> None:
        nan = np.full(1, np.nan, dtype=np.float32).tobytes()
        self.gpus = [bytearray(nan * (graph.budget // 4 + 1)) for _ in range(graph.devices)]
        self.storage = bytearray(nan * (graph.storage_bytes // 4 + 1))

    def _buffer(self, node, where: str) -> memoryview:
        if where == "loc":
            start, size = node.loc
            return memoryview(self.gpus[node.device])[start : start + size]
        start, size = node.storage
        return memoryview(self.storage)[start : start + size]

    def read(self, node, where: str) -> np.ndarray:
        count = int(np.prod(node.shape))
        return np.frombuffer(self._buffer(node, where), dtype=node.dtype, count=count).reshape(node.shape).copy()

    def write(self, node, where: str, value: np.ndarray) -> None:
        data = np.ascontiguousarray(value, dtype=node.dtype).tobytes()
        self._buffer(node, where)[: len(data)] = data


def execute(graph: MemGraph, inputs: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Run `graph` in a random topological order (seeded) and return each output's value."""
    machine = Machine(graph)
    by_id = graph.by_id()
    for node in graph.nodes:
        if node.op == "input":
            machine.write(node, "loc" if node.loc is not None else "storage", inputs[node.task])
    for node in random_topological(graph, random.Random(seed)):
        srcs = [by_id[i] for i in node.inputs]
        if node.op == "kernel":
            machine.write(node, "loc", apply(node.kernel, [machine.read(s, "loc") for s in srcs], node.attrs))
        elif node.op in ("move", "reload"):
            machine.write(node, "loc", machine.read(srcs[0], "loc" if node.op == "move" else "storage"))
        elif node.op == "offload":
            machine.write(node, "storage", machine.read(srcs[0], "loc"))
    results = {}
    for task, holder_id in graph.outputs.items():
        holder = by_id[holder_id]
        results[task] = machine.read(holder, "loc" if holder.loc is not None else "storage")
    return results

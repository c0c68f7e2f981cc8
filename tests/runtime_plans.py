"""Test-only memory plans for runtime tests, independent of the compiler in passes/.

`naive_memgraph` gives every tensor its own location (ample budget, no memory edges).
`reuse_memgraph` packs tensors first-fit into a small arena, freeing each after its last reader, and
adds the memory edges that reuse needs, optionally offloading every input through host storage first:
a run that ignored memory edges would read overwritten data.
"""

from __future__ import annotations

import numpy as np
from kernel_formulas import evaluate

from runtime.inputs import input_specs, make_inputs
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.taskgraph import TaskGraph

ALIGN = 256


def _round(size: int) -> int:
    return max(ALIGN, (size + ALIGN - 1) // ALIGN * ALIGN)


def naive_memgraph(graph: TaskGraph) -> MemGraph:
    tops = [0] * graph.devices
    nodes: list[MemNode] = []
    ids: dict[str, int] = {}
    for task in graph.nodes.values():
        offset = tops[task.device]
        tops[task.device] += _round(task.nbytes)
        ids[task.id] = len(nodes)
        op = task.op if task.op in ("input", "move") else "kernel"
        kernel = task.op if op == "kernel" else None
        inputs = tuple(ids[i] for i in task.inputs)
        nodes.append(MemNode(len(nodes), op, task.id, task.device, (offset, task.nbytes), None, inputs,
                             kernel=kernel, shape=task.shape, dtype=task.dtype, attrs=dict(task.attrs)))
    memgraph = MemGraph(graph.devices, max(tops))
    memgraph.nodes = nodes
    memgraph.outputs = {task: ids[task] for task in graph.effective_outputs()}
    return memgraph


class _Arena:
    """First-fit regions of one GPU, remembering who last wrote and read each freed region."""

    def __init__(self):
        self.live: dict[int, tuple[int, int]] = {}
        self.dead: list[tuple[int, int, set[int]]] = []

    def place(self, size: int) -> tuple[int, set[int]]:
        spans = sorted(self.live.values())
        offset = 0
        for lo, hi in spans:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        users = set()
        for lo, hi, who in self.dead:
            if lo < offset + size and offset < hi:
                users |= who
        return offset, users


def reuse_memgraph(graph: TaskGraph, offload_inputs: bool = False) -> MemGraph:
    """A tightly packed plan with memory edges; outputs stay resident to the end."""
    readers = graph.consumers()
    keep = set(graph.effective_outputs())
    arenas = [_Arena() for _ in range(graph.devices)]
    plan = _Plan(graph.devices)
    left = {task: len(users) for task, users in readers.items()}
    # Resident inputs are all in place before the run starts, so they are placed first.
    resident = [] if offload_inputs else [task for task in graph.nodes.values() if task.op == "input"]
    for task in resident:
        plan.compute(task, arenas[task.device])
    for task in graph.nodes.values():
        if task.op == "input" and offload_inputs:
            plan.stored_input(task, arenas[task.device])
        elif task.op != "input":
            plan.compute(task, arenas[task.device])
        for src in task.inputs:
            left[src] -= 1
            if left[src] == 0 and src not in keep:
                plan.free(src, arenas[graph.nodes[src].device])
        if not readers[task.id] and task.id not in keep:
            plan.free(task.id, arenas[task.device])
    return plan.finish(graph, keep)


class _Plan:
    def __init__(self, devices: int):
        self.nodes: list[MemNode] = []
        self.holder: dict[str, int] = {}
        self.touched: dict[str, set[int]] = {}
        self.top = [0] * devices
        self.storage_top = 0

    def _add(self, task, op, loc, inputs, deps, storage=None, device=None) -> int:
        node_id = len(self.nodes)
        kernel = task.op if op == "kernel" else None
        dev = task.device if device is None else device
        self.nodes.append(MemNode(node_id, op, task.id, dev, loc, storage, tuple(inputs), tuple(sorted(deps)),
                                  kernel=kernel, shape=task.shape, dtype=task.dtype, attrs=dict(task.attrs)))
        self.touched.setdefault(task.id, set()).add(node_id)
        for i in inputs:
            self.touched[self.nodes[i].task].add(node_id)
        return node_id

    def _alloc(self, task, arena: _Arena) -> tuple[tuple[int, int], set[int]]:
        size = _round(task.nbytes)
        offset, deps = arena.place(size)
        arena.live[task.id] = (offset, offset + size)
        self.top[task.device] = max(self.top[task.device], offset + size)
        return (offset, task.nbytes), deps

    def compute(self, task, arena: _Arena) -> None:
        loc, deps = self._alloc(task, arena)
        op = task.op if task.op in ("input", "move") else "kernel"
        inputs = [self.holder[i] for i in task.inputs]
        self.holder[task.id] = self._add(task, op, loc, inputs, () if op == "input" else deps)

    def stored_input(self, task, arena: _Arena) -> None:
        """The input starts in host storage and is reloaded to the GPU before use."""
        storage = (self.storage_top, task.nbytes)
        self.storage_top += _round(task.nbytes)
        home = self._add(task, "input", None, (), (), storage=storage, device=None)
        loc, deps = self._alloc(task, arena)
        self.holder[task.id] = self._add(task, "reload", loc, [home], deps)

    def free(self, task_id: str, arena: _Arena) -> None:
        lo, hi = arena.live.pop(task_id)
        arena.dead.append((lo, hi, set(self.touched[task_id])))

    def finish(self, graph: TaskGraph, keep: set[str]) -> MemGraph:
        memgraph = MemGraph(graph.devices, max(self.top))
        memgraph.nodes = self.nodes
        memgraph.outputs = {task: self.holder[task] for task in keep}
        return memgraph


def dependency_violations(result) -> list[str]:
    """Vertices that started before one of their dependencies ended, from the run's recorded timestamps."""
    graph = result.recorder.graph
    spans = {done.vertex: (done.start, done.end) for done in result.recorder.completions}
    bad = []
    for vertex, (start, _) in spans.items():
        for dep in graph.memgraph.nodes[vertex].deps():
            index = next(i for i, node in enumerate(graph.memgraph.nodes) if node.id == dep)
            if index in spans and spans[index][1] > start:
                bad.append(f"{graph.describe(vertex)} started at {start} before {graph.describe(index)} ended")
    return bad


def assert_matches_reference(taskgraph: TaskGraph, memgraph: MemGraph, result, seed: int) -> None:
    """`result` (a run of `memgraph` on inputs made from `seed`) gives `taskgraph`'s float64 outputs, within
    float32 rounding, and broke no dependency."""
    reference = evaluate(taskgraph, make_inputs(input_specs(memgraph), None, seed))
    for task, expected in reference.items():
        # float32 rounding grows with the values' magnitude, so the absolute tolerance scales with it
        atol = 2e-5 * max(1.0, float(np.abs(expected).max(initial=0.0)))
        np.testing.assert_allclose(result.outputs[task], expected, rtol=2e-4, atol=atol, err_msg=task)
    assert dependency_violations(result) == []

"""Synthetic memgraphs for stress tests and dispatch benchmarks: many tiny vertices over every lane.

Every tensor gets a location of its own (the arena grows with the graph), so the graph needs no memory
edges and is race-free by construction: it exercises the executor and a backend's lanes, event waits
and completion path, not the planner. Vertices are kernels (relu, add), offloads, reloads and, with
several GPUs, moves, each reading recent tensors so that dependencies cross lanes and devices.
"""

from __future__ import annotations

import random

from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.memgraph import MemGraph, MemNode


def random_memgraph(
    seed: int, vertices: int = 1000, devices: int = 1, elements: int = 64, dtype: str = "float32", window: int = 16
) -> MemGraph:
    """A memgraph of about `vertices` tiny vertices; each reads tensors among the last `window` made."""
    rng = random.Random(seed)
    size = elements * DTYPE_BYTES[dtype]
    slot = (size + 255) // 256 * 256
    nodes: list[MemNode] = []
    on_gpu: list[list[int]] = [[] for _ in range(devices)]
    stored: list[int] = []
    top = [0] * devices
    storage_top = 0

    def add(op, device, inputs, kernel=None, gpu=True):
        nonlocal storage_top
        loc = storage = None
        if gpu:
            loc = (top[device], size)
            top[device] += slot
        else:
            storage = (storage_top, size)
            storage_top += slot
        node = MemNode(len(nodes), op, f"t{len(nodes)}", device if gpu or op != "input" else None, loc, storage,
                       tuple(inputs), kernel=kernel, shape=(elements,), dtype=dtype)
        nodes.append(node)
        (on_gpu[device] if gpu else stored).append(node.id)
        return node.id

    for device in range(devices):
        for _ in range(2):
            add("input", device, ())
    add("input", 0, (), gpu=False)
    while len(nodes) < vertices:
        device = rng.randrange(devices)
        recent = on_gpu[device][-window:]
        roll = rng.random()
        if roll < 0.12 and stored:
            add("reload", device, (rng.choice(stored[-window:]),), gpu=True)
        elif roll < 0.24:
            add("offload", device, (rng.choice(recent),), gpu=False)
        elif roll < 0.34 and devices > 1:
            source = rng.choice([d for d in range(devices) if d != device])
            add("move", device, (rng.choice(on_gpu[source][-window:]),))
        elif roll < 0.67:
            add("kernel", device, (rng.choice(recent),), kernel="relu")
        else:
            add("kernel", device, (rng.choice(recent), rng.choice(recent)), kernel="add")
    graph = MemGraph(devices, max(top) or slot)
    for node in nodes:
        graph.add(node)
    last = [ids[-1] for ids in on_gpu if ids]
    graph.outputs = {nodes[i].task: i for i in last}
    return graph


def chain_memgraph(length: int, elements: int = 64, dtype: str = "float32") -> MemGraph:
    """x -> relu -> relu -> ... on one GPU, each result at its own location: every vertex waits for the one
    before it, so a run measures the completion round trip per vertex (or hides it, when queued ahead)."""
    size = elements * DTYPE_BYTES[dtype]
    slot = (size + 255) // 256 * 256
    graph = MemGraph(1, slot * (length + 1))
    graph.add(MemNode(0, "input", "x", 0, (0, size), None, (), shape=(elements,), dtype=dtype))
    for i in range(1, length + 1):
        graph.add(MemNode(i, "kernel", f"r{i}", 0, (i * slot, size), None, (i - 1,), kernel="relu", shape=(elements,), dtype=dtype))
    graph.outputs = {f"r{length}": length}
    return graph

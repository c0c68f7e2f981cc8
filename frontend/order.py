"""The order of a built taskgraph: a topological sort that takes the node with the smallest key first.

The compiler simulates a taskgraph in its own node order by default, so that order decides which
tensors are live together. `Program.at` stamps each new node with a key (the builder's phase, then the
block coordinates named by `order_by`); this sort keeps every node after its operands and otherwise
goes by key, then by creation, whatever order the ops were written in.
"""

from __future__ import annotations

import heapq

from turnip_ir.taskgraph import TaskGraph


def ordered(graph: TaskGraph, marks: list[tuple[int, tuple]]) -> dict:
    """The nodes of `graph` in a topological order that takes the smallest key first.

    `marks` are (position, key) pairs: a node takes the key of the last mark at or before its position."""
    nodes = list(graph.nodes.values())
    keys: list[tuple] = []
    bounds = marks + [(len(nodes), None)]
    for (begin, key), (end, _) in zip(bounds, bounds[1:]):
        keys += [key] * (end - begin)
    keys = [(0, ())] * (len(nodes) - len(keys)) + keys  # nodes before the first mark
    position = {node.id: i for i, node in enumerate(nodes)}
    waiting = [len(set(node.inputs)) for node in nodes]
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for src in set(node.inputs):
            readers[position[src]].append(i)
    ready = [(keys[i], i) for i in range(len(nodes)) if waiting[i] == 0]
    heapq.heapify(ready)
    result = {}
    while ready:
        _, i = heapq.heappop(ready)
        result[nodes[i].id] = nodes[i]
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, (keys[r], r))
    assert len(result) == len(nodes), "the taskgraph has a cycle"
    return result

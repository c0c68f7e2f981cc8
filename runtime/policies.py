"""Selection policies: which ready vertex a free lane of a resource class runs next.

A policy sees two events, `ready(vertex)` (all its dependencies are done) and `pick(resource)` (a lane
of that resource class is free), and nothing else. `nondet` takes, on a compute stream, the ready kernel
with the longest critical path (ties: earliest in the memgraph), and on a copy engine (reloads, offloads,
moves) the ready copy that the earliest vertex of the memgraph waits for: the memgraph is the order the
compiler simulated, so the copy the next kernels need goes first, and a free engine never idles while a
copy is ready; `random` takes a seeded uniformly random ready vertex;
`fixed` replays the memgraph order per resource: only the earliest not-yet-started vertex of a resource
class may start, so a late input stalls everything queued behind it, the deterministic baseline.
The policy is the run-time order (`--order`); the order the compiler simulated is its schedule.
"""

from __future__ import annotations

import heapq
import random

from runtime.graph import ExecGraph
from turnip_ir.errors import InputError

ORDERS = ("nondet", "fixed", "random")


class Policy:
    """The interface the executor calls; subclasses keep per-resource ready sets."""

    def __init__(self, graph: ExecGraph):
        self.graph = graph

    def ready(self, vertex: int) -> None:
        raise NotImplementedError

    def pick(self, resource: int) -> int | None:
        """A ready vertex of `resource` to start now, removed from the ready set; None if none may start."""
        raise NotImplementedError


class NondetPolicy(Policy):
    """Whatever is ready, a heap per resource class: kernels by critical path, copies by the earliest
    vertex that waits for them.

    On a copy engine the critical path misleads: a reload of the next layer's weight and one of a late
    layer's are both a long way from the end of the graph, and a wrong pick delays every kernel behind
    the copy that was not made (issue 26: an FFN's input blocks queued behind 7 weight reloads held its
    first kernel back 70 ms). The position of a copy's first dependent in the memgraph says when the
    plan needs it.
    """

    def __init__(self, graph: ExecGraph):
        super().__init__(graph)
        self.heaps: list[list[tuple[float, int]]] = [[] for _ in graph.lanes_of]
        self.copies = [False] * len(graph.lanes_of)
        for lane in graph.lanes:
            self.copies[lane.resource] = lane.kind != "compute"

    def ready(self, vertex: int) -> None:
        graph = self.graph
        resource = graph.resource[vertex]
        if self.copies[resource]:  # computed here, not for every vertex up front: a run's set-up stays O(resources)
            key = min(graph.dependents[vertex], default=len(graph))
        else:
            key = -graph.priority[vertex]
        heapq.heappush(self.heaps[resource], (key, vertex))

    def pick(self, resource: int) -> int | None:
        heap = self.heaps[resource]
        return heapq.heappop(heap)[1] if heap else None


class RandomPolicy(Policy):
    """A uniformly random ready vertex, from a seeded generator: for shaking out ordering bugs in tests."""

    def __init__(self, graph: ExecGraph, seed: int = 0):
        super().__init__(graph)
        self.rng = random.Random(seed)
        self.pools: list[list[int]] = [[] for _ in graph.lanes_of]

    def ready(self, vertex: int) -> None:
        self.pools[self.graph.resource[vertex]].append(vertex)

    def pick(self, resource: int) -> int | None:
        pool = self.pools[resource]
        if not pool:
            return None
        i = self.rng.randrange(len(pool))
        pool[i], pool[-1] = pool[-1], pool[i]
        return pool.pop()


class FixedPolicy(Policy):
    """The memgraph order per resource class, strictly: the head of the queue starts once it is ready."""

    def __init__(self, graph: ExecGraph):
        super().__init__(graph)
        self.queues: list[list[int]] = [[] for _ in graph.lanes_of]
        for vertex, resource in enumerate(graph.resource):
            if resource >= 0:
                self.queues[resource].append(vertex)
        self.heads = [0] * len(graph.lanes_of)
        self.is_ready = [False] * len(graph)

    def ready(self, vertex: int) -> None:
        self.is_ready[vertex] = True

    def pick(self, resource: int) -> int | None:
        queue = self.queues[resource]
        head = self.heads[resource]
        if head == len(queue) or not self.is_ready[queue[head]]:
            return None
        self.heads[resource] = head + 1
        return queue[head]


def make_policy(order: str, graph: ExecGraph, seed: int = 0) -> Policy:
    if order == "nondet":
        return NondetPolicy(graph)
    if order == "fixed":
        return FixedPolicy(graph)
    if order == "random":
        return RandomPolicy(graph, seed)
    raise InputError(f"unknown order '{order}' (known: {', '.join(ORDERS)})")

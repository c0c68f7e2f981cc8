"""The event loop that runs a memgraph: the runtime's design document.

States. Every vertex is in exactly one state, and only moves forward:
  WAITING  some data or memory dependency is not done (`remaining[v] > 0`);
  READY    all dependencies done, held by the policy until a lane of its resource is free;
  RUNNING  submitted to the backend on a lane, which it holds alone;
  DONE     the backend reported its completion.
Input vertices need no resource: the backend put their data in place before the loop, so they go
straight to DONE at the start (without vertex callbacks) and count down their dependents.

Resources. Each GPU has `streams` compute lanes (kernels), one H2D engine (reloads), one D2H engine
(offloads) and one peer-in engine (moves, issued by the destination GPU, which pulls: NVLink is full
duplex, so a GPU's incoming and outgoing copies do not compete, but two moves into one GPU share its
engine). A vertex needs exactly one lane of its resource class, so a reload never waits behind a kernel
it does not depend on, and an offload never waits behind a reload.

The loop. Start: inputs complete, every vertex without dependencies becomes READY, dispatch. Then,
until every vertex is DONE: block in `backend.wait()` for the next completions; for each, free its
lane, mark the vertex DONE and count down its dependents (those reaching zero become READY); then
dispatch: for every resource class whose lanes or ready set changed, while a lane is free and the
policy offers a vertex, submit it. Nothing else wakes the loop, so when nothing can run it sleeps.

Invariants (asserted): a vertex starts only when `remaining[v] == 0`; a lane runs one vertex at a time;
a completion is for a RUNNING vertex; if vertices remain, something is RUNNING (else the policy or the
graph deadlocked). Dependencies are counted from the memgraph's data and memory edges.

Selection policy (runtime/policies.py): `nondet` picks the ready vertex with the longest critical path;
`random` a seeded random one; `fixed` only the earliest unstarted vertex of the resource in memgraph
order. A vertex that raises stops the loop: nothing new is dispatched and a `KernelError` naming the
vertex propagates; the caller closes the backend, which joins its workers.

Callbacks (runtime/callbacks.py) see start, vertex_start, vertex_end and finish, like Dask's.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.backends.base import Backend, Completion
from runtime.callbacks import Callback
from runtime.graph import NO_RESOURCE, ExecGraph
from runtime.policies import Policy
from turnip_ir.errors import KernelError

WAITING, READY, RUNNING, DONE = range(4)


class Executor:
    """One run of an ExecGraph on a prepared backend under a policy."""

    def __init__(self, graph: ExecGraph, backend: Backend, policy: Policy, callbacks: Sequence[Callback] = ()):
        self.graph = graph
        self.backend = backend
        self.policy = policy
        self.callbacks = list(callbacks)
        self.state = [WAITING] * len(graph)
        self.remaining = list(graph.dep_count)
        self.free = [list(reversed(lanes)) for lanes in graph.lanes_of]
        self.on_lane: list[int | None] = [None] * len(graph.lanes)
        self.dirty: set[int] = set()
        self.done = 0
        self.running = 0

    def run(self) -> None:
        """Run every vertex to completion, or raise the first vertex failure as a KernelError."""
        for callback in self.callbacks:
            callback.start(self.graph)
        failed = True
        try:
            self._begin()
            while self.done < len(self.graph):
                assert self.running > 0, "executor deadlock: vertices remain but nothing runs"
                for completion in self.backend.wait():
                    self._complete(completion)
                self._dispatch()
            failed = False
        finally:
            for callback in self.callbacks:
                callback.finish(self.graph, failed)

    def _begin(self) -> None:
        for vertex in range(len(self.graph)):
            if self.graph.resource[vertex] == NO_RESOURCE:
                self.state[vertex] = DONE
                self.done += 1
                self._count_down(vertex)
            elif self.remaining[vertex] == 0 and self.state[vertex] == WAITING:
                self._make_ready(vertex)
        self._dispatch()

    def _make_ready(self, vertex: int) -> None:
        self.state[vertex] = READY
        self.policy.ready(vertex)
        self.dirty.add(self.graph.resource[vertex])

    def _count_down(self, vertex: int) -> None:
        for user in self.graph.dependents[vertex]:
            self.remaining[user] -= 1
            if self.remaining[user] == 0 and self.graph.resource[user] != NO_RESOURCE:
                self._make_ready(user)

    def _dispatch(self) -> None:
        dirty, self.dirty = self.dirty, set()
        for resource in dirty:
            free = self.free[resource]
            while free:
                vertex = self.policy.pick(resource)
                if vertex is None:
                    break
                self._start(vertex, free.pop())

    def _start(self, vertex: int, lane_index: int) -> None:
        assert self.state[vertex] == READY and self.remaining[vertex] == 0, f"vertex {vertex} started early"
        assert self.on_lane[lane_index] is None, f"lane {lane_index} is busy"
        lane = self.graph.lanes[lane_index]
        self.state[vertex] = RUNNING
        self.on_lane[lane_index] = vertex
        self.running += 1
        now = self.backend.now()
        for callback in self.callbacks:
            callback.vertex_start(vertex, lane, now)
        self.backend.submit(vertex, lane)

    def _complete(self, completion: Completion) -> None:
        vertex = completion.vertex
        assert self.state[vertex] == RUNNING and self.on_lane[completion.lane] == vertex, f"completion of a vertex not running on its lane: {completion}"
        if completion.error is not None:
            err = completion.error
            raise KernelError(f"{self.graph.describe(vertex)} failed: {type(err).__name__}: {err}") from err
        self.state[vertex] = DONE
        self.on_lane[completion.lane] = None
        self.running -= 1
        self.done += 1
        resource = self.graph.resource[vertex]
        self.free[resource].append(completion.lane)
        self.dirty.add(resource)
        for callback in self.callbacks:
            callback.vertex_end(completion)
        self._count_down(vertex)

"""The event loop that runs a memgraph: the runtime's design document.

States. Every vertex is in exactly one state, and only moves forward:
  WAITING  a dependency is not yet far enough along (below);
  READY    held by the policy until a lane of its resource has room;
  RUNNING  submitted to the backend on a lane (queued there or executing);
  DONE     the backend reported its completion.
Input vertices need no resource: the backend put their data in place before the loop, so they go
straight to DONE at the start (without vertex callbacks) and count down their dependents.

When is a vertex READY? On a host backend (cpu; sim with lookahead=False) when every data and memory
dependency is DONE. A device backend (cuda, and the sim, which models it) enforces dependencies itself,
with stream order and event waits (the sim: a vertex starts when its dependencies end), so it may be
handed a vertex whose dependencies are merely submitted (`Backend.device_deps`): the vertex is READY
once every dependency is RUNNING or DONE, and the GPU starts it the moment the last one finishes,
without a host round trip in between. Each lane then holds up to `Backend.lane_depth(lane)` vertices
(`queue_depth`; the cuda backend may queue deeper on its copy engines), which run in submission order;
a host backend's lanes hold one. The policy still chooses among what may be queued, so `nondet`,
`random` and `fixed` keep their meaning; a small depth keeps the choice late.

Resources. Each GPU has `streams` compute lanes (kernels), one H2D engine (reloads), one D2H engine
(offloads) and one peer-in engine (moves, issued by the destination GPU, which pulls: NVLink is full
duplex, so a GPU's incoming and outgoing copies do not compete, but two moves into one GPU share its
engine). A vertex needs exactly one lane of its resource class, so a reload never waits behind a kernel
it does not depend on, and an offload never waits behind a reload.

The loop. Start: inputs complete, every vertex whose dependencies allow it becomes READY, dispatch.
Then, until every vertex is DONE: block in `backend.wait()` for the next completions; for each, give
its lane the room back, mark the vertex DONE and count down its dependents; then dispatch: for every
resource class whose lanes or ready set changed, while a lane has room and the policy offers a vertex,
submit it to the least loaded lane (submitting may make dependents READY on a device backend, so
dispatch repeats until nothing changes). Nothing else wakes the loop: when nothing can run it sleeps.

Invariants (asserted): a vertex is submitted only when its dependencies are DONE (host backends) or at
least RUNNING (device backends); a lane holds at most its depth; completions of a lane arrive in its
submission order and are for RUNNING vertices; if vertices remain, something is RUNNING (else the
policy or the graph deadlocked).

Selection policy (runtime/policies.py): `nondet` picks the ready kernel with the longest critical path,
and on a copy engine the ready copy that the earliest vertex of the memgraph waits for; `random` a
seeded random one; `fixed` only the earliest unstarted vertex of the resource in memgraph
order. A vertex that raises stops the loop: nothing new is dispatched and a `KernelError` naming the
vertex propagates; the caller closes the backend, which waits for or joins its workers.

Callbacks (runtime/callbacks.py) see start, vertex_start, vertex_end and finish, like Dask's.
"""

from __future__ import annotations

from collections import deque
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
        self.ahead = bool(backend.device_deps)
        self.depth = [max(1, int(backend.lane_depth(lane))) if self.ahead else 1 for lane in graph.lanes]
        """How many vertices each lane may hold: `Backend.lane_depth`, or 1 on a host backend."""
        self.state = [WAITING] * len(graph)
        self.remaining = list(graph.dep_count)
        """Dependencies not DONE."""
        self.unsubmitted = list(graph.dep_count)
        """Dependencies not yet RUNNING or DONE (what a device backend waits for)."""
        self.queued: list[deque[int]] = [deque() for _ in graph.lanes]
        self.dirty: set[int] = set()
        self.done = 0
        self.running = 0

    def run(self) -> None:
        """Run every vertex to completion, or raise the first vertex failure as a KernelError."""
        for callback in self.callbacks:
            callback.start(self.graph)
        failed = True
        try:
            self.backend.run_starts()
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
                self._submitted(vertex)
                self._finished(vertex)
            elif self.unsubmitted[vertex] == 0 and self.state[vertex] == WAITING:
                self._make_ready(vertex)
        self._dispatch()

    def _make_ready(self, vertex: int) -> None:
        self.state[vertex] = READY
        self.policy.ready(vertex)
        self.dirty.add(self.graph.resource[vertex])

    def _submitted(self, vertex: int) -> None:
        """`vertex` is RUNNING (or an input): on a device backend its dependents may now be queued."""
        for user in self.graph.dependents[vertex]:
            self.unsubmitted[user] -= 1
            if self.ahead and self.unsubmitted[user] == 0 and self.graph.resource[user] != NO_RESOURCE:
                self._make_ready(user)

    def _finished(self, vertex: int) -> None:
        for user in self.graph.dependents[vertex]:
            self.remaining[user] -= 1
            if not self.ahead and self.remaining[user] == 0 and self.graph.resource[user] != NO_RESOURCE:
                self._make_ready(user)

    def _dispatch(self) -> None:
        while self.dirty:
            dirty, self.dirty = self.dirty, set()
            for resource in dirty:
                lanes = self.graph.lanes_of[resource]
                while True:
                    lane = min(lanes, key=lambda index: len(self.queued[index]))
                    if len(self.queued[lane]) >= self.depth[lane]:
                        break
                    vertex = self.policy.pick(resource)
                    if vertex is None:
                        break
                    self._start(vertex, lane)

    def _start(self, vertex: int, lane_index: int) -> None:
        assert self.state[vertex] == READY, f"vertex {vertex} started twice"
        if self.ahead:
            assert self.unsubmitted[vertex] == 0, f"vertex {vertex} submitted before a dependency"
        else:
            assert self.remaining[vertex] == 0, f"vertex {vertex} started before a dependency finished"
        assert len(self.queued[lane_index]) < self.depth[lane_index], f"lane {lane_index} is full"
        lane = self.graph.lanes[lane_index]
        self.state[vertex] = RUNNING
        self.queued[lane_index].append(vertex)
        self.running += 1
        now = self.backend.now()
        for callback in self.callbacks:
            callback.vertex_start(vertex, lane, now)
        self.backend.submit(vertex, lane)
        self._submitted(vertex)

    def _complete(self, completion: Completion) -> None:
        vertex = completion.vertex
        queue = self.queued[completion.lane]
        assert self.state[vertex] == RUNNING and queue and queue[0] == vertex, f"completion out of lane order: {completion}"
        if completion.error is not None:
            err = completion.error
            raise KernelError(f"{self.graph.describe(vertex)} failed: {type(err).__name__}: {err}") from err
        queue.popleft()
        self.state[vertex] = DONE
        self.running -= 1
        self.done += 1
        self.dirty.add(self.graph.resource[vertex])
        for callback in self.callbacks:
            callback.vertex_end(completion)
        self._finished(vertex)

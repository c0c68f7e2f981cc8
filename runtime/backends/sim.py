"""The sim backend: a virtual clock and the cost model, no real compute, any number of GPUs.

It predicts what the cuda backend does, so it works the way that backend does. Two clocks: the GPUs'
and the host's. Lanes queue ahead (`device_deps`): the executor may submit a vertex whose dependencies
are only submitted, up to `queue_depth` vertices per compute lane and `copy_queue_depth` per copy
engine (the cuda backend's defaults), and the vertex starts on its lane once the vertex before it there
has ended and every dependency has ended on the device.

The host is one serial loop. Each submit takes `cost.host_time` seconds of it (the Python loop's
time per vertex: choosing it, launching it, and handling its completion; more for an fp16 attention
link, launched through torch, once per call it takes: `cost.attention_calls`), so a vertex cannot start
before the host has finished submitting it, and many small vertices cost what the loop costs. The loop
learns of a completion `cost.notify_latency` after the vertex ended on the GPU; `wait` returns it then.
With both at zero and `lookahead=False` (one vertex per lane, submitted only when its dependencies are
done) this is the host-backend model of a plain event loop.

Each started vertex gets an amount of work: seconds for kernels and moves, bytes for reloads and
offloads. Work drains at a rate: 1 for moves; 1 for a kernel alone on its GPU's compute streams and
`cost.overlap_efficiency`/k for each of k > 1 running at once (they share the SMs: two concurrent GEMMs
do not each run at full speed, so streams buy overlap with transfers, not extra FLOPs, and together they
lose a little to each other); for a GPU's host link, `h2d_bw` or `d2h_bw` when one
direction is busy and `duplex_bw / 2` each while both are (the measured H200 figures). `wait` advances
the clock event by event (a vertex ends, a submitted vertex becomes startable, a completion is noticed).
`jitter` J scales each vertex's work by a factor drawn uniformly from [1 - J, 1 + J]. The factors are
drawn per vertex in `prepare` from the seed, not in submit order, so two policies run with one seed see
the same durations; nothing else is random, so a run is a function of the memgraph, policy and seed.

`interference` models another process copying host memory to the GPUs: a list of (start, end) bursts
in seconds of the run's clock during which every GPU's reloads drain at `share` of their rate (the
other process has the rest; offloads go the other way of the full-duplex link and keep theirs), or a
mapping from GPU to its own list (a process copying to that GPU only; the others keep their links). The
clock stops at each burst's edges, so rates change there as they do when a transfer starts or ends.
Unlike jitter, which averages out over many vertices, a burst slows every copy in flight at once: what
a fixed order cannot step around.

`deadline` stops a run early: a callable giving seconds, read at each `wait`; once the clock is past the
first start by more than it while a vertex is still to end, `wait` raises `DeadlinePassed` (the run's
makespan can only be larger). A search that ranks plans by their makespan (turnip/choose.py) gives the
best makespan found so far, so a plan that cannot win is not simulated to its end; the callable may read
a value other processes lower.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from runtime.backends.base import STREAMING_QUEUE_DEPTH, Backend, Completion, compute_depth
from turnip_ir.cost import CostModel
from runtime.graph import ExecGraph, Lane
from runtime.residency import limited_bytes
from turnip_ir.errors import InputError

EPSILON = 1e-12
QUEUE_DEPTH = STREAMING_QUEUE_DEPTH
"""Vertices per compute lane: the cuda backend's `queue_depth` default."""
COPY_QUEUE_DEPTH = 4
"""Vertices per copy engine: the cuda backend's `copy_queue_depth` default."""
ALL_GPUS = -1
"""The key of `interference` bursts that fall on every GPU's link."""


class DeadlinePassed(Exception):
    """A sim run stopped by its `deadline`: its makespan would exceed `deadline` seconds."""

    def __init__(self, deadline: float):
        super().__init__(f"the sim run passed its deadline of {deadline} s")
        self.deadline = deadline


def _burst_edges(bursts) -> list[float]:
    edges = [t for burst in sorted(bursts) for t in burst]
    if any(b < a for a, b in zip(edges, edges[1:])) or any(t < 0 for t in edges):
        raise InputError("sim interference bursts are (start, end) pairs in seconds, start <= end, not overlapping")
    return edges


@dataclass
class Active:
    """A vertex in flight on a lane: how much work is left, and since when it runs."""

    vertex: int
    lane: Lane
    start: float
    left: float


@dataclass
class Submitted:
    """A vertex queued on a lane, not started: when the host finished submitting it, and its work."""

    vertex: int
    issued: float
    work: float


class SimBackend(Backend):
    name = "sim"
    needs_data = False

    def __init__(self, cost: CostModel | None = None, jitter: float = 0.0, seed: int = 0, lookahead: bool = True,
                 queue_depth: int = QUEUE_DEPTH, copy_queue_depth: int = COPY_QUEUE_DEPTH,
                 interference: list[tuple[float, float]] | Mapping[int, list[tuple[float, float]]] = (), share: float = 0.5,
                 deadline: Callable[[], float] | None = None):
        if not 0.0 <= jitter < 1.0:
            raise InputError(f"sim jitter is a relative spread in [0, 1), got {jitter}")
        if not 0.0 < share <= 1.0:
            raise InputError(f"sim interference share is the run's part of the host link in (0, 1], got {share}")
        windows = interference if isinstance(interference, Mapping) else {ALL_GPUS: interference}
        edges = {device: _burst_edges(bursts) for device, bursts in windows.items()}
        self.edges = {device: times for device, times in edges.items() if times}
        """Per GPU with bursts (ALL_GPUS: every GPU), burst starts and ends in time order: the clock is inside
        a burst when an odd number lie at or before it. A run with none has none here, so the clock's loop
        looks at no burst edges."""
        self.share = share
        if queue_depth < 1 or copy_queue_depth < 1:
            raise InputError(f"sim queue depths must be at least 1, got {queue_depth} and {copy_queue_depth}")
        self.cost = cost or CostModel()
        self.jitter = jitter
        self.seed = seed
        self.device_deps = lookahead
        self.queue_depth = queue_depth if lookahead else 1
        self.graph: ExecGraph | None = None
        self.copy_queue_depth = copy_queue_depth if lookahead else 1
        self.clock = 0.0
        self.active: dict[int, Active] = {}
        self.deadline = deadline
        self.first_start: float | None = None

    def lane_depth(self, lane: Lane) -> int:
        if lane.kind != "compute":
            return self.copy_queue_depth
        return compute_depth(self.queue_depth, self.device_deps, self.graph)

    def prepare(self, graph: ExecGraph, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None) -> None:
        self.graph = graph
        self.clock = 0.0
        self.host = 0.0
        self.active = {}
        self.first_start = None
        self.queued: dict[int, deque[Submitted]] = {lane.index: deque() for lane in graph.lanes}
        self.lanes = graph.lanes
        self.unreported: deque[tuple[float, Completion]] = deque()
        self.ended = [graph.resource[v] < 0 for v in range(len(graph))]  # inputs are in place before the run
        self.deps = graph.deps
        self.waits_at = [0] * len(graph)
        """Per vertex, how many of its dependencies (`deps`, in order) are known to have ended."""
        rng = np.random.default_rng(self.seed)
        self.factor = rng.uniform(1.0 - self.jitter, 1.0 + self.jitter, size=len(graph)).tolist()
        self.limits: Mapping[int, int] = {}
        self.durations = graph.durations if graph.durations and graph.duration_cost == self.cost else None
        """The graph's own pricing of each vertex where it used this cost model (build_exec_graph)."""

    def limit_copies(self, limits: Mapping[int, int]) -> None:
        self.limits = dict(limits)

    def now(self) -> float:
        return self.clock

    def submit(self, vertex: int, lane: Lane) -> None:
        node = self.graph.node(vertex)
        if lane.kind in ("h2d", "d2h"):
            sources = []  # a copy's time is its bytes; its host time reads no operands
            work = float(node.nbytes if vertex not in self.limits else limited_bytes(node, self.limits[vertex]))
        else:
            sources = [self.graph.node(s) for s in self.graph.sources[vertex]]
            work = self.durations[vertex] if self.durations is not None else self.cost.duration(node, sources)
        self.host = max(self.host, self.clock) + self.cost.host_time(node, sources)
        self.queued[lane.index].append(Submitted(vertex, self.host, work * self.factor[vertex]))

    def _rates(self) -> dict[int, float]:
        """Each active vertex's rate, by lane: compute streams of one GPU share it (`overlap_efficiency` split
        among them), and the host link runs at the duplex rate while both directions are busy (a share of
        it during a burst of interference)."""
        busy: dict[tuple[int, str], int] = {}
        for job in self.active.values():
            key = (job.lane.device, job.lane.kind)
            busy[key] = busy.get(key, 0) + 1
        return {index: self._rate(job, busy) for index, job in self.active.items()}

    def _rate(self, job: Active, busy: Mapping[tuple[int, str], int]) -> float:
        kind, device = job.lane.kind, job.lane.device
        if kind == "compute":
            sharing = busy[(device, "compute")]
            return 1.0 if sharing == 1 else self.cost.overlap_efficiency / sharing
        if kind not in ("h2d", "d2h"):
            return 1.0
        if (device, "d2h" if kind == "h2d" else "h2d") in busy:
            rate = self.cost.duplex_bw / 2
        else:
            rate = self.cost.h2d_bw if kind == "h2d" else self.cost.d2h_bw
        return rate * self.share if kind == "h2d" and self._in_burst(device) else rate

    def _in_burst(self, device: int) -> bool:
        return any(bisect_right(self.edges[d], self.clock) % 2 for d in (device, ALL_GPUS) if d in self.edges)

    def _start_heads(self) -> float:
        """Start every lane's first queued vertex that may start now; return the earliest time a head
        waits for only because the host has not finished submitting it (inf if none)."""
        later = float("inf")
        for index, queue in self.queued.items():
            if not queue or index in self.active:
                continue
            head = queue[0]
            deps, at = self.deps[head.vertex], self.waits_at[head.vertex]
            while at < len(deps) and self.ended[deps[at]]:  # a vertex only ever ends: resume where the last look stopped
                at += 1
            self.waits_at[head.vertex] = at
            if at < len(deps):
                continue
            if head.issued > self.clock + EPSILON:
                later = min(later, head.issued)
                continue
            queue.popleft()
            self.active[index] = Active(head.vertex, self.lanes[index], self.clock, head.work)
            if self.first_start is None:
                self.first_start = self.clock
        return later

    def wait(self) -> list[Completion]:
        assert self.active or self.unreported or any(self.queued.values()), "sim wait with nothing in flight"
        self._check_deadline()
        while True:
            issued = self._start_heads()
            if self.unreported and self.unreported[0][0] <= self.clock + EPSILON:
                return self._noticed()
            rates = self._rates()
            first, job_step = None, float("inf")
            for index, job in self.active.items():  # the first to run out of work (the first of equals)
                left = job.left / rates[index]
                if left < job_step:
                    first, job_step = index, left
            step = min(job_step, issued - self.clock)
            for edges in self.edges.values():
                edge = bisect_right(edges, self.clock)
                if edge < len(edges):  # a burst starts or ends: the host link's rate changes there
                    step = min(step, edges[edge] - self.clock)
            if self.unreported:
                step = min(step, self.unreported[0][0] - self.clock)
            assert step < float("inf"), "sim deadlock: queued vertices wait on dependencies that never run"
            self._advance(max(step, 0.0), first if step == job_step else None, rates)

    def _check_deadline(self) -> None:
        """Raise `DeadlinePassed` once the run has gone on longer than `deadline()` since its first start
        with a vertex still to end (a completion noticed late may have ended before it)."""
        if self.deadline is None or self.first_start is None:
            return
        deadline = self.deadline()
        if self.clock - self.first_start > deadline and (self.active or any(self.queued.values())):
            raise DeadlinePassed(deadline)

    def _advance(self, step: float, first: int | None, rates: dict[int, float]) -> None:
        """Move the clock by `step`, draining active work; vertices that run out of work end now."""
        self.clock += step
        for index, job in list(self.active.items()):
            job.left -= step * rates[index]
            if index == first or job.left <= EPSILON * max(1.0, rates[index]):
                del self.active[index]
                self.ended[job.vertex] = True
                notice = self.clock + self.cost.notify_latency
                self.unreported.append((notice, Completion(job.vertex, index, job.start, self.clock)))

    def _noticed(self) -> list[Completion]:
        """Every completion the host has learned of by now, in lane order."""
        found = []
        while self.unreported and self.unreported[0][0] <= self.clock + EPSILON:
            found.append(self.unreported.popleft()[1])
        return sorted(found, key=lambda c: (c.lane, c.end))

    def read_outputs(self, copy: bool = True) -> dict[str, np.ndarray]:
        return {}

"""The sim backend: a virtual clock and the cost model, no real compute, any number of GPUs.

Each submitted vertex gets an amount of work when it starts: seconds for kernels and moves, bytes for
reloads and offloads. Work drains at a rate: 1 for moves; 1/k for each of the k kernels running on
one GPU's compute streams at once (they share the SMs: two concurrent GEMMs do not each run at full
speed, so streams buy overlap with transfers, not extra FLOPs); for a GPU's host link, `h2d_bw` or
`d2h_bw` when one direction is busy and `duplex_bw / 2` each while both are (the measured H200
figures). `wait` advances the clock to the next completion. `jitter` J scales each vertex's work by
a factor drawn uniformly from [1 - J, 1 + J]. The factors are drawn per vertex in `prepare` from the
seed, not in submit order, so two policies run with one seed see the same durations.

`interference` models another process copying host memory to the GPUs: a list of (start, end) bursts
in seconds of the run's clock during which every GPU's reloads drain at `share` of their rate (the
other process has the rest; offloads go the other way of the full-duplex link and keep theirs). The clock stops at each burst's edges, so rates change there as
they do when a transfer starts or ends. Unlike jitter, which averages out over many vertices, a burst
slows every copy in flight at once: what a fixed order cannot step around.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runtime.backends.base import Backend, Completion
from turnip_ir.cost import CostModel
from runtime.graph import ExecGraph, Lane
from turnip_ir.errors import InputError

EPSILON = 1e-12


@dataclass
class Active:
    """A vertex in flight on a lane: how much work is left, and since when it runs."""

    vertex: int
    lane: Lane
    start: float
    left: float


class SimBackend(Backend):
    name = "sim"
    needs_data = False

    def __init__(self, cost: CostModel | None = None, jitter: float = 0.0, seed: int = 0,
                 interference: list[tuple[float, float]] = (), share: float = 0.5):
        if not 0.0 <= jitter < 1.0:
            raise InputError(f"sim jitter is a relative spread in [0, 1), got {jitter}")
        if not 0.0 < share <= 1.0:
            raise InputError(f"sim interference share is the run's part of the host link in (0, 1], got {share}")
        edges = [t for burst in sorted(interference) for t in burst]
        if any(b < a for a, b in zip(edges, edges[1:])) or any(t < 0 for t in edges):
            raise InputError("sim interference bursts are (start, end) pairs in seconds, start <= end, not overlapping")
        self.cost = cost or CostModel()
        self.jitter = jitter
        self.seed = seed
        self.edges = edges
        """Burst starts and ends in time order: the clock is inside a burst when an odd number lie at or before it."""
        self.share = share
        self.clock = 0.0
        self.active: dict[int, Active] = {}

    def prepare(self, graph: ExecGraph, inputs: dict[str, np.ndarray], keep: Mapping[str, tuple[int, int] | None] | None = None) -> None:
        self.graph = graph
        self.clock = 0.0
        self.active = {}
        rng = np.random.default_rng(self.seed)
        self.factor = rng.uniform(1.0 - self.jitter, 1.0 + self.jitter, size=len(graph)).tolist()

    def now(self) -> float:
        return self.clock

    def submit(self, vertex: int, lane: Lane) -> None:
        node = self.graph.node(vertex)
        if lane.kind in ("h2d", "d2h"):
            work = float(node.nbytes)
        else:
            work = self.cost.duration(node, [self.graph.node(s) for s in self.graph.sources[vertex]])
        work *= self.factor[vertex]
        self.active[lane.index] = Active(vertex, lane, self.clock, work)

    def _rate(self, job: Active) -> float:
        kind = job.lane.kind
        if kind == "compute":
            sharing = sum(1 for a in self.active.values() if a.lane.device == job.lane.device and a.lane.kind == "compute")
            return 1.0 / sharing
        if kind not in ("h2d", "d2h"):
            return 1.0
        other = "d2h" if kind == "h2d" else "h2d"
        if any(a.lane.device == job.lane.device and a.lane.kind == other for a in self.active.values()):
            rate = self.cost.duplex_bw / 2
        else:
            rate = self.cost.h2d_bw if kind == "h2d" else self.cost.d2h_bw
        return rate * self.share if kind == "h2d" and bisect_right(self.edges, self.clock) % 2 else rate

    def wait(self) -> list[Completion]:
        assert self.active, "sim wait with nothing in flight"
        while True:
            rates = {index: self._rate(job) for index, job in self.active.items()}
            first = min(self.active, key=lambda index: self.active[index].left / rates[index])
            step = self.active[first].left / rates[first]
            edge = bisect_right(self.edges, self.clock)
            if edge == len(self.edges) or self.clock + step <= self.edges[edge]:
                break
            for index, job in self.active.items():  # a burst starts or ends before anything completes
                job.left -= (self.edges[edge] - self.clock) * rates[index]
            self.clock = self.edges[edge]
        self.clock += step
        finished = []
        for index, job in list(self.active.items()):
            job.left -= step * rates[index]
            if index == first or job.left <= EPSILON * max(1.0, rates[index]):
                del self.active[index]
                finished.append(Completion(job.vertex, index, job.start, self.clock))
        return finished

    def read_outputs(self) -> dict[str, np.ndarray]:
        return {}

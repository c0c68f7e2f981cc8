"""The sim backend: a virtual clock and the cost model, no real compute, any number of GPUs.

Each submitted vertex gets an amount of work when it starts: seconds for kernels and moves, bytes for
reloads and offloads. Work drains at a rate: 1 for moves; 1/k for each of the k kernels running on
one GPU's compute streams at once (they share the SMs: two concurrent GEMMs do not each run at full
speed, so streams buy overlap with transfers, not extra FLOPs); for a GPU's host link, `h2d_bw` or
`d2h_bw` when one direction is busy and `duplex_bw / 2` each while both are (the measured H200
figures). `wait` advances the clock to the next completion. `jitter` J scales each vertex's work by
a factor drawn uniformly from [1 - J, 1 + J]. The factors are drawn per vertex in `prepare` from the
seed, not in submit order, so two policies run with one seed see the same durations.
"""

from __future__ import annotations

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

    def __init__(self, cost: CostModel | None = None, jitter: float = 0.0, seed: int = 0):
        if not 0.0 <= jitter < 1.0:
            raise InputError(f"sim jitter is a relative spread in [0, 1), got {jitter}")
        self.cost = cost or CostModel()
        self.jitter = jitter
        self.seed = seed
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
            return self.cost.duplex_bw / 2
        return self.cost.h2d_bw if kind == "h2d" else self.cost.d2h_bw

    def wait(self) -> list[Completion]:
        assert self.active, "sim wait with nothing in flight"
        rates = {index: self._rate(job) for index, job in self.active.items()}
        first = min(self.active, key=lambda index: self.active[index].left / rates[index])
        step = self.active[first].left / rates[first]
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

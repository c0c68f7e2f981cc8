"""Would a wait across streams fit the sim's fixed-order runs better? A study of the cost model (issue 26).

The sim puts 7b's fixed-order runs 2% faster than measured on average (nondet: 0.8%), most at 32k / 8 GiB,
where fixed runs one kernel at a time and its chain of dependencies crosses the two compute streams in
about 60% of its links. The sim charges a kernel only the launch gap measured on one stream (3 us). This
study adds a wait where a kernel's dependency ended on the other compute lane (a subclass of the sim
backend, used by fit_cost's Simulator for the run of this script) and tables bench/fit_cost.py's points at
each wait: how many are within 5%, and the mean error per order. It changes nothing in the runtime.

    .venv/bin/python bench/investigations/stream_wait.py 0 5e-6 10e-6 20e-6      # about 1 minute a value

Result (2026-12-03, sixth session; docs/benchmarks-log.md): 72 of 76 points within 5% at 0 and 5 us, 73
at 8 us, 74 at 10-12 us, 72 at 15 and 20 us (other points leave the band); the mean fixed error goes
from -2.0% to -1.5% at 10 us. Too narrow a band, on two points near the edge, to adopt without measuring the
wait on the GPU.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

import runtime.backends.sim as sim_module  # noqa: E402
from runtime.backends.base import Completion  # noqa: E402
from runtime.backends.sim import EPSILON, Active, SimBackend  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402


class WaitSim(SimBackend):
    """The sim backend, where a compute vertex starts no sooner than `cross_wait` seconds after a dependency that
    ended on the other compute lane."""

    cross_wait = 0.0

    def prepare(self, graph, inputs, keep=None):
        super().prepare(graph, inputs, keep)
        self.end_at = [0.0] * len(graph)
        self.end_lane = [-1] * len(graph)

    def _crossed(self, vertex: int, index: int) -> float:
        """When the dependencies of `vertex` that ended on another compute lane than `index` allow it to start."""
        return max((self.end_at[d] + self.cross_wait for d in self.deps[vertex]
                    if self.end_lane[d] not in (-1, index) and self.lanes[self.end_lane[d]].kind == "compute"), default=0.0)

    def _start_heads(self) -> float:  # SimBackend's, with the wait
        later = float("inf")
        for index, queue in self.queued.items():
            if not queue or index in self.active:
                continue
            head = queue[0]
            if not all(self.ended[d] for d in self.deps[head.vertex]):
                continue
            ready = head.issued
            if self.cross_wait and self.lanes[index].kind == "compute":
                ready = max(ready, self._crossed(head.vertex, index))
            if ready > self.clock + EPSILON:
                later = min(later, ready)
                continue
            queue.popleft()
            self.active[index] = Active(head.vertex, self.lanes[index], self.clock, head.work)
        return later

    def _advance(self, step: float, first, rates) -> None:  # SimBackend's, keeping each end's time and lane
        self.clock += step
        for index, job in list(self.active.items()):
            job.left -= step * rates[index]
            if index == first or job.left <= EPSILON * max(1.0, rates[index]):
                del self.active[index]
                self.ended[job.vertex] = True
                self.end_at[job.vertex], self.end_lane[job.vertex] = self.clock, index
                self.unreported.append((self.clock + self.cost.notify_latency, Completion(job.vertex, index, job.start, self.clock)))


def main(argv=None) -> int:
    from model_scan import compiled_points, report

    waits = [float(x) for x in (argv if argv is not None else sys.argv[1:])] or [0.0, 10e-6]
    sim_module.SimBackend = WaitSim  # what fit_cost's Simulator makes its backend with
    points, simulate = compiled_points()
    for wait in waits:
        WaitSim.cross_wait = wait
        report(f"wait {wait * 1e6:.0f} us", points, [simulate(p, CostModel()) / p.measured - 1 for p in points])
    return 0


if __name__ == "__main__":
    sys.exit(main())

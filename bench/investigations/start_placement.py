"""Where inputs should start on the GPU so that streaming starts at once (issue 26): two rules against
the planner's first-use order, by sim makespan on the GPU benchmark points (docs/passes.md, "Start
placement, measured", has the table and why first-use order stayed).

    .venv/bin/python bench/investigations/start_placement.py                 # every point, both rules
    .venv/bin/python bench/investigations/start_placement.py --points llama-8192-2 --shares 0.1 0.2

`cap`: inputs are placed in first-use order only up to (1 - share) of the budget. `keep`: first-use
order, then the last-used resident inputs start in host memory until `share` of the budget is one free
region, which a placeholder holds until the first op that needs a reload or room; the first reloads
then land there with no memory edge. Both are written here as overrides of the Planner (this is a study,
not a planner option): they change nothing else of the plan.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import passes.planner as planner  # noqa: E402
from bench_start import POINTS, graph_of  # noqa: E402
from passes.allocator import NEVER, aligned  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import arena_budget, execute  # noqa: E402

GIB = 1 << 30
FIRST_USE = planner.Planner._place_inputs
RUN_TASK = planner.Planner._run_task


def capped(share: float):
    def place_inputs(self) -> None:
        view = self.view
        inputs = sorted((i for i, op in enumerate(view.ops) if op == "input"), key=lambda i: self.uses[i][0] if self.uses[i] else NEVER)
        placed, limit = 0, self.out.budget * (1 - share)
        for i in inputs:
            d, size = view.devices[i], self.size[i]
            wanted = self.inputs_on_gpu and (self.uses[i] or self.is_output[i]) and placed + size <= limit
            start = self.memory[d].place_free(size) if wanted else None
            if start is not None:
                placed += size
                self.memory[d].take(start, size, i)
                self.gpu[i] = self._emit("input", i, d, loc=(start, view.nbytes[i]), inputs=())
                self.unread.add(self.gpu[i])
            else:
                self.store[i] = self._emit("input", i, None, storage=self._storage(i), inputs=())

    return place_inputs, RUN_TASK


def kept_free(share: float):
    def place_inputs(self) -> None:
        FIRST_USE(self)
        self.reserve = []
        for d, memory in enumerate(self.memory):
            size = aligned(int(memory.capacity * share))
            resident = sorted(memory.where, key=lambda t: -(self.uses[t][0] if self.uses[t] else NEVER))
            start = memory.place_free(size)
            while start is None and resident:
                t = resident.pop(0)
                memory.release(t, -1)
                self._start_in_storage(t)
                self.gpu[t] = -1
                start = memory.place_free(size)
            if start is not None:
                memory.take(start, size, (1 << 40) + d)
                self.reserve.append(d)

    def run_task(self, i: int) -> None:
        d = self.view.devices[i]
        if d in self.reserve:
            memory = self.memory[d]
            if any(self.gpu[o] < 0 for o in self.operands[i]) or memory.place_free(self.size[i]) is None:
                memory.release((1 << 40) + d, -1)
                self.reserve.remove(d)
        RUN_TASK(self, i)

    return place_inputs, run_task


def makespan(graph, budget: int, rule) -> tuple[float, float]:
    planner.Planner._place_inputs, planner.Planner._run_task = rule
    try:
        summary = execute(compile_taskgraph(graph, arena_budget(graph, budget, "cuda"), inputs="gpu"), backend="sim", verify=False).summary
    finally:
        planner.Planner._place_inputs, planner.Planner._run_task = FIRST_USE, RUN_TASK
    return summary.makespan, summary.h2d_idle[0].before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", nargs="+", default=list(POINTS))
    parser.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    args = parser.parse_args()
    rules = [("first-use", (FIRST_USE, RUN_TASK))]
    rules += [(f"cap {1 - s:.0%}", capped(s)) for s in args.shares] + [(f"keep {s:.0%} free", kept_free(s)) for s in args.shares]
    print("| point | " + " | ".join(name for name, _ in rules) + " |")
    print("| --- |" + " --- |" * len(rules))
    for point in args.points:
        workload, tokens, gib = point.split("-")
        graph, _ = graph_of(workload, int(tokens), "7b")
        cells = [makespan(graph, int(float(gib) * GIB), rule) for _, rule in rules]
        print(f"| {point} | " + " | ".join(f"{span * 1e3:.2f} ms (idle {idle * 1e3:.1f})" for span, idle in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

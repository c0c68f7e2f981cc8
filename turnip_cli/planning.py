"""How the commands compile a taskgraph: under one schedule, or `auto` (each schedule, the sim's fastest).

`--schedule auto` compiles once per schedule (passes/schedules.py), predicts each plan's run with the
sim backend's H200 cost model and keeps the fastest; it prints one line with the choice and every
prediction. It costs a compile and a sim run per schedule, and pays off where memory is tight: llama 7b
at 8k tokens and 1 GiB is predicted 0.27 s with `memory` against 0.34 s with `given` (docs/passes.md).
"""

from __future__ import annotations

import argparse

from passes.pipeline import compile_best, compile_taskgraph
from passes.schedules import SCHEDULES
from runtime import sim_makespan
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

SCHEDULE_CHOICES = (*SCHEDULES, "auto")


def add_schedule_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedule", default="given", choices=SCHEDULE_CHOICES,
                        help="the compiler's simulated schedule; auto: each one, keeping the plan the sim predicts fastest")


def compile_for(graph: TaskGraph, budget: int, schedule: str, streams: int = 2, **options) -> tuple[MemGraph, str, dict[str, float]]:
    """`compile_taskgraph` under `schedule`, or for `auto` the sim-fastest of every schedule: the plan, the
    schedule it was compiled under and the sim's predictions (empty unless `auto`)."""
    if schedule != "auto":
        return compile_taskgraph(graph, budget, schedule, **options), schedule, {}
    return compile_best(graph, budget, lambda m: sim_makespan(m, streams), **options)


def compile_with(graph: TaskGraph, budget: int, schedule: str, streams: int = 2, **options) -> MemGraph:
    """`compile_for`'s plan; for `auto` it prints one line with the choice and every prediction."""
    memgraph, chosen, scores = compile_for(graph, budget, schedule, streams, **options)
    if schedule == "auto":
        predicted = ", ".join(f"{name} {_seconds(seconds)}" for name, seconds in scores.items())
        print(f"schedule auto: {chosen} (sim predictions: {predicted})")
    return memgraph


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value >= 0.1 else f"{value * 1e3:.3f} ms"

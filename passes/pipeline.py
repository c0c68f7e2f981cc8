"""The default compiler pipeline on the compact structures: taskgraph in, verified memgraph out.

Stages: place devices -> simulate (offload insertion) -> memory deps -> minimize -> reduce -> verify.
The pipeline is composed here once: `compile_taskgraph` runs each stage's pass (`run(graph, stats)`,
where the stage is timed and counted, as when `turnip-opt` runs it alone), and the `turnip-memgraph`
pass calls `compile_taskgraph`. Stages work on Python lists or CSR arrays (built once for the memory
passes); nothing is printed or parsed between them; the cyclic garbage collector is paused meanwhile.
`compile_taskgraph` is the contract the runtime's `turnip run` calls for taskgraph files.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from turnip_ir.memarrays import MemArrays
from passes.compile_stats import CompileStats, timed
from passes.graph_pass import GraphPass, check_budget_option, taskgraph_of
from passes.insert_memory_deps import InsertMemoryDepsPass
from passes.insert_offload import InsertOffloadPass
from passes.minimize_memory_deps import MinimizeMemoryDepsPass
from passes.place_devices import PlaceDevicesPass
from passes.reduce_memory_deps import ReduceMemoryDepsPass
from passes.schedules import SCHEDULES
from passes.verify_memgraph import VerifyMemgraphPass
from turnip_ir.errors import BudgetError, InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph


def compile_taskgraph(
    graph: TaskGraph,
    budget: int,
    schedule: str = "given",
    stats: CompileStats | None = None,
    *,
    devices: int = 0,
    placement: str = "loosest",
    inputs: str = "gpu",
    minimize: bool = True,
    reduce: bool = True,
    verify: bool = True,
) -> MemGraph:
    """Plan `graph` under a per-GPU `budget` in bytes; raises `BudgetError`, `InputError` or `VerifyError`.

    `schedule` is the simulated schedule (`given`, `dfs`, `memory`); `devices` widens placement (0 keeps the
    taskgraph's count); `placement` picks among free regions (`loosest`, the default, or `first-fit`);
    `inputs` says where inputs start (`gpu` while they fit, or `host`: all in CPU storage);
    `minimize`, `reduce` and `verify` switch off those stages (for benchmarks).
    """
    if budget <= 0:
        raise InputError(f"budget must be a positive number of bytes, got {budget}")
    stats = stats if stats is not None else CompileStats()
    with _cyclic_gc_paused():
        placed = PlaceDevicesPass(devices=devices).run(graph, stats)
        simulate = InsertOffloadPass(budget=budget, schedule=schedule, placement=placement, inputs=inputs)
        memgraph = simulate.run(placed, stats)
        with timed(stats, "memory-deps"):  # the arrays the memory passes share, built for the first of them
            arrays = MemArrays.build(memgraph.nodes)
        InsertMemoryDepsPass().run(memgraph, stats, arrays)
        if minimize:
            MinimizeMemoryDepsPass().run(memgraph, stats, arrays)
        if reduce:
            ReduceMemoryDepsPass().run(memgraph, stats, arrays)
        if verify:
            VerifyMemgraphPass().run(memgraph, stats, source=placed)
    return memgraph


def compile_best(
    graph: TaskGraph,
    budget: int,
    judge: Callable[[MemGraph], float],
    schedules: Sequence[str] = SCHEDULES,
    **options,
) -> tuple[MemGraph, str, dict[str, float]]:
    """Compile `graph` under each of `schedules` and keep the plan `judge` rates fastest.

    `judge` maps a memgraph to seconds (the runtime's sim makespan, say: the compiler cannot run the
    sim itself, the layers only look down). Returns the plan, its schedule and every score; a schedule
    whose plan does not fit is left out, and when none fits the first one's `BudgetError` is raised.
    Ties go to the earlier schedule. `options` are `compile_taskgraph`'s.
    """
    if not schedules:
        raise InputError("compile_best needs at least one schedule")
    best: tuple[float, str, MemGraph] | None = None
    scores: dict[str, float] = {}
    first_error: BudgetError | None = None
    for schedule in schedules:
        try:
            memgraph = compile_taskgraph(graph, budget, schedule, **options)
        except BudgetError as err:
            first_error = first_error or err
            continue
        scores[schedule] = judge(memgraph)
        if best is None or scores[schedule] < best[0]:
            best = (scores[schedule], schedule, memgraph)
    if best is None:
        raise first_error
    return best[2], best[1], scores


@contextlib.contextmanager
def _cyclic_gc_paused():
    """The compiler builds and drops millions of small acyclic objects (freed by reference counts);
    the cyclic collector would rescan the growing graphs again and again, about a fifth of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class MemgraphPipelinePass(GraphPass):
    """The default pipeline: taskgraph in, verified memgraph out, under a per-GPU budget.

    Runs turnip-place-devices, turnip-insert-offload, turnip-insert-memory-deps,
    turnip-minimize-memory-deps, turnip-reduce-memory-deps and turnip-verify-memgraph (given the
    placed taskgraph, so condition (a) is proved too) on the compact structures, converting the
    module once each way. It is `compile_taskgraph` (passes/pipeline.py): the same stages, timed and
    counted once each.
    """

    name = "turnip-memgraph"
    aliases = {"order": "schedule"}
    budget: int = 0
    """Bytes per GPU; required, a positive number."""
    schedule: str = "given"
    """The simulated schedule: `given`, `dfs` or `memory` (as in turnip-insert-offload)."""
    devices: int = 0
    """How many GPUs to place on; 0 keeps the module's count (as in turnip-place-devices)."""
    placement: str = "loosest"
    """`loosest` or `first-fit` (as in turnip-insert-offload)."""
    inputs: str = "gpu"
    """Where inputs start: `gpu` or `host` (as in turnip-insert-offload)."""

    def run(self, graph: TaskGraph, stats: CompileStats | None) -> MemGraph:
        check_budget_option(self.budget, self.name)
        graph = taskgraph_of(graph, self.name)
        options = {"devices": self.devices, "placement": self.placement, "inputs": self.inputs}
        return compile_taskgraph(graph, self.budget, self.schedule, stats, **options)

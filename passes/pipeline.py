"""The default compiler pipeline on the compact structures: taskgraph in, verified memgraph out.

Stages: place devices -> simulate (offload insertion) -> memory deps -> minimize -> reduce -> verify.
The pipeline is composed here once, as a list of passes (`memgraph_stages`) that `run_stages` runs in
order on one `Compilation` (passes/compilation.py): each stage reads the fields it names in `reads`
and sets those in `adds` (the placed taskgraph as `source`, the memgraph's CSR `arrays`, built once
for the memory passes), timed and counted as when `turnip-opt` runs it alone. Nothing is printed or
parsed between stages; the cyclic garbage collector is paused meanwhile. `compile_taskgraph` is the
contract the runtime's `turnip run` calls for taskgraph files, and the `turnip-memgraph` pass runs the
same stages.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from passes.compilation import Compilation
from passes.compile_stats import CompileStats
from passes.graph_pass import GraphPass, check_budget_option, taskgraph_of
from passes.insert_memory_deps import InsertMemoryDepsPass
from passes.insert_offload import InsertOffloadPass
from passes.minimize_memory_deps import MinimizeMemoryDepsPass
from passes.place_devices import PlaceDevicesPass
from passes.reduce_memory_deps import ReduceMemoryDepsPass
from passes.schedules import SCHEDULES
from passes.verify_memgraph import VerifyMemgraphPass
from turnip_ir.cost import CostModel
from turnip_ir.errors import BudgetError, InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph


def compile_taskgraph(
    graph: TaskGraph,
    budget: int,
    schedule: str = "given",
    stats: CompileStats | None = None,
    cost: CostModel | None = None,
    kept: dict | None = None,
    start_on_gpu: Iterable[str] = (),
    **options,
) -> MemGraph:
    """Plan `graph` under a per-GPU `budget` in bytes; raises `BudgetError`, `InputError` or `VerifyError`.

    `schedule` is the simulated schedule (`given`, `dfs`, `memory`); `stats`, when given, receives the
    counts and seconds; `cost` is the cost model `remat=True` weighs with (None: the H200 defaults);
    `kept` is where a prepared backend holds inputs now (`Compilation.kept`: inputs=recur starts them
    there again where it can); `start_on_gpu` names inputs that start on their GPU with inputs=host
    (`Compilation.start_on_gpu`); `options` are `memgraph_stages`'s.
    """
    if budget <= 0:
        raise InputError(f"budget must be a positive number of bytes, got {budget}")
    state = Compilation(graph, stats if stats is not None else CompileStats(), cost=cost or CostModel(), kept=dict(kept or {}),
                        start_on_gpu=frozenset(start_on_gpu))
    with _cyclic_gc_paused():
        run_stages(state, memgraph_stages(budget, schedule, **options))
        memgraph = state.graph
        del state  # the placed taskgraph goes now, by reference counts, so the collector's first pass skips it
    return memgraph


def memgraph_stages(
    budget: int,
    schedule: str = "given",
    *,
    devices: int = 0,
    placement: str = "loosest",
    inputs: str = "gpu",
    remat: bool = False,
    minimize: bool = True,
    reduce: bool = True,
    verify: bool = True,
) -> list[GraphPass]:
    """The default pipeline's passes, in order.

    `devices` widens placement (0 keeps the taskgraph's count); `placement` picks among free regions
    (`loosest`, the default, or `first-fit`); `inputs` says where inputs start (`gpu` while they fit,
    or `host`: all in CPU storage); `remat` lets the planner recompute instead of reload where the cost
    model says it is cheaper; `minimize`, `reduce` and `verify` leave those stages out (for benchmarks).
    """
    stages: list[GraphPass] = [
        PlaceDevicesPass(devices=devices),
        InsertOffloadPass(budget=budget, schedule=schedule, placement=placement, inputs=inputs, remat=remat),
        InsertMemoryDepsPass(),
    ]
    stages += [MinimizeMemoryDepsPass()] if minimize else []
    stages += [ReduceMemoryDepsPass()] if reduce else []
    stages += [VerifyMemgraphPass()] if verify else []
    return stages


def run_stages(state: Compilation, stages: Iterable[GraphPass]) -> None:
    """Run `stages` in order on `state`, with the cyclic garbage collector paused."""
    with _cyclic_gc_paused():
        for stage in stages:
            state.run(stage)


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
    the cyclic collector would rescan the growing graphs again and again (docs/benchmarks.md, "Compile time")."""
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
    placed taskgraph, so condition (a) is proved too) on one compilation state, converting the
    module once each way. It is `compile_taskgraph` (passes/pipeline.py): the same stages, timed and
    counted once each.
    """

    name = "turnip-memgraph"
    reads = ("graph", "cost")
    adds = ("graph", "source", "arrays")
    budget: int
    """Bytes per GPU, a positive number."""
    schedule: str = "given"
    """The simulated schedule: `given`, `dfs` or `memory` (as in turnip-insert-offload)."""
    devices: int = 0
    """How many GPUs to place on; 0 keeps the module's count (as in turnip-place-devices)."""
    placement: str = "loosest"
    """`loosest` or `first-fit` (as in turnip-insert-offload)."""
    inputs: str = "gpu"
    """Where inputs start: `gpu`, `host` or `recur` (as in turnip-insert-offload)."""
    remat: bool = False
    """Recompute instead of reload where it is cheaper (as in turnip-insert-offload)."""

    def run(self, state: Compilation) -> None:
        check_budget_option(self.budget, self.name)
        taskgraph_of(state.graph, self.name)
        options = {"devices": self.devices, "placement": self.placement, "inputs": self.inputs, "remat": self.remat}
        run_stages(state, memgraph_stages(self.budget, self.schedule, **options))

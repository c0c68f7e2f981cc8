"""The default compiler pipeline on the compact structures: taskgraph in, verified memgraph out.

Stages: place devices -> simulate (offload insertion) -> memory deps -> minimize -> reduce -> verify.
Each works on Python lists or CSR arrays (built once for the memory passes); nothing is printed or
parsed between them; the cyclic garbage collector is paused meanwhile. `compile_taskgraph`
is the contract the runtime's `turnip run` calls for taskgraph files.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass


from passes.compact import MemArrays
from passes.insert_memory_deps import insert_memory_deps
from passes.insert_offload import insert_offload
from passes.minimize_memory_deps import minimize_memory_deps
from passes.place_devices import place_devices
from passes.reduce_memory_deps import reduce_memory_deps
from passes.graph_pass import GraphPass, check_budget_option, taskgraph_of
from passes.compile_stats import CompileStats, collected, timed
from passes.verify_memgraph import verify_memgraph
from turnip_ir.errors import InputError
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
        memgraph, placed = _stages(graph, budget, schedule, stats, devices, placement, inputs, minimize, reduce)
        if verify:
            with timed(stats, "verify"):
                verify_memgraph(memgraph, placed)
    stats.record_graph(memgraph)
    return memgraph


def _stages(graph, budget, schedule, stats, devices, placement, inputs, minimize, reduce) -> tuple[MemGraph, TaskGraph]:
    with timed(stats, "place"):
        placed = place_devices(graph, devices)
    with timed(stats, "simulate"):
        memgraph = insert_offload(placed, budget, schedule, placement, inputs)
    with timed(stats, "memory-deps"):
        arrays = MemArrays.build(memgraph.nodes)
        stats.edges_added, stats.edges_redundant = insert_memory_deps(memgraph, arrays)
    if minimize:
        with timed(stats, "minimize"):
            stats.edges_removed_minimize = minimize_memory_deps(memgraph, arrays)
    if reduce:
        with timed(stats, "reduce"):
            stats.edges_removed_reduce = reduce_memory_deps(memgraph, arrays)
    return memgraph, placed


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

    Runs placement, offload insertion by simulation, memory dependencies, minimization, transitive
    reduction and the verifier on the compact structures, converting the module once each way.
    Options: `budget` (bytes per GPU, required), `schedule` (given, dfs, memory; `order` is its
    deprecated alias), `devices` (0 keeps the module's count), `placement` (loosest, first-fit).
    When the CLI collects stats
    (`passes.compile_stats.collecting`), they are recorded there.
    """

    name = "turnip-memgraph"
    aliases = {"order": "schedule"}
    budget: int = 0
    schedule: str = "given"
    devices: int = 0
    placement: str = "loosest"

    def transform(self, graph: TaskGraph) -> MemGraph:
        check_budget_option(self.budget, self.name)
        graph = taskgraph_of(graph, self.name)
        return compile_taskgraph(graph, self.budget, self.schedule, collected.get(), devices=self.devices, placement=self.placement)

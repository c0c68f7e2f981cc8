"""`GraphPass`, the base of every turnip pass, and the helpers passes share (input checks).

A `GraphPass` is an xDSL pass whose work is a stage of a compilation: `run(state)` reads the fields
of a `Compilation` (passes/compilation.py) it names in `reads`, sets those it names in `adds`, and
records what it did into `state.stats` (compile_stats.py), the one place a stage is timed and
counted, whether `turnip-opt` runs the pass alone or `compile_taskgraph` runs it in the pipeline.
`apply`, the xDSL entry point, converts the module to a graph once on entry and back once on exit
around it. Because the work never needs IR, `turnip-opt` can run a whole pipeline of them on one
`Compilation` and build IR only if the output asks for it (xDSL op construction is costly per op:
docs/benchmarks.md, "IR (foundation)").
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from passes.compilation import Compilation
from passes.compile_stats import CompileStats, collected
from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

Graph = TaskGraph | MemGraph


class GraphPass(ModulePass):
    """A pass defined as a stage on a `Compilation`; subclasses implement `run`."""

    reads: ClassVar[tuple[str, ...]] = ("graph",)
    """The `Compilation` fields the stage reads (besides `stats`, which every stage records into)."""
    adds: ClassVar[tuple[str, ...]] = ()
    """The `Compilation` fields the stage sets or replaces; each is set when `run` returns."""

    def run(self, state: Compilation) -> None:
        """The pass's work on `state`: read `reads`, set `adds`, record into `state.stats`."""
        raise NotImplementedError

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from turnip_ir.convert import replace_module
        from turnip_ir.io import graph_to_module, module_to_graph

        state = Compilation(module_to_graph(op), cli_stats())
        state.run(self)
        replace_module(op, graph_to_module(state.graph))


def cli_stats() -> CompileStats:
    """The stats the CLI collects (`compile_stats.collecting`), or fresh ones nobody reads."""
    stats = collected.get()
    return stats if stats is not None else CompileStats()


def taskgraph_of(graph: Graph, pass_name: str) -> TaskGraph:
    if not isinstance(graph, TaskGraph):
        raise InputError(f"{pass_name} needs a taskgraph, got a memgraph")
    return graph


def memgraph_of(graph: Graph, pass_name: str) -> MemGraph:
    if not isinstance(graph, MemGraph):
        raise InputError(f"{pass_name} needs a memgraph (run turnip-insert-offload first), got a taskgraph")
    return graph


def check_budget_option(budget: int, pass_name: str) -> None:
    if budget <= 0:
        raise InputError(f"{pass_name} needs the option budget=BYTES with a positive number of bytes, got {budget}")

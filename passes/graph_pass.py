"""`GraphPass`, the base of every turnip pass, and the helpers passes share (input checks, counting).

A `GraphPass` is an xDSL pass whose work is a function from graph to graph: `run(graph, stats)` works
on a `TaskGraph` or `MemGraph` and records what it did into `stats` (compile_stats.py), the one place
a stage is timed and counted, whether `turnip-opt` runs the pass alone or `compile_taskgraph` runs it
in the pipeline. `apply`, the xDSL entry point, converts the module once on entry and once on exit
around it. Because the work never needs IR, `turnip-opt` can run a whole pipeline of
them on the Python graphs and build IR only if the output asks for it (xDSL op construction costs
about 0.1 ms per op: see benchmarks.md).
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import ArgSpec

from passes.compile_stats import CompileStats, collected
from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

Graph = TaskGraph | MemGraph


class GraphPass(ModulePass):
    """A pass defined on the Python graphs; subclasses implement `run`."""

    aliases: ClassVar[dict[str, str]] = {}
    """Deprecated option spellings -> the option they stand for; accepted in a pipeline, never printed."""

    @classmethod
    def from_spec(cls, spec: ArgSpec) -> GraphPass:
        options = dict(spec.normalize_parameter_names().parameters)
        for old, new in cls.aliases.items():
            if old in options:
                if new in options:
                    raise InputError(f"{cls.name}: give {new}= only ({old}= is its deprecated alias)")
                options[new] = options.pop(old)
        return super().from_spec(ArgSpec(spec.name, options))

    def run(self, graph: Graph, stats: CompileStats | None) -> Graph:
        """The pass's work on `graph`, timed and counted into `stats` unless it is None."""
        raise NotImplementedError

    def transform(self, graph: Graph) -> Graph:
        """`run` with the stats the CLI collects (`compile_stats.collecting`), if it does."""
        return self.run(graph, collected.get())

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from turnip_ir.convert import replace_module
        from turnip_ir.io import graph_to_module, module_to_graph

        replace_module(op, graph_to_module(self.transform(module_to_graph(op))))


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

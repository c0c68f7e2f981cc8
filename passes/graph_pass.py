"""`GraphPass`, the base of every turnip pass, and the helpers passes share (input checks, counting).

A `GraphPass` is an xDSL pass whose work is a function from graph to graph: `transform(graph)` works
on a `TaskGraph` or `MemGraph`, and `apply`, the xDSL entry point, converts the module once on entry
and once on exit around it. Because the work never needs IR, `turnip-opt` can run a whole pipeline of
them on the Python graphs and build IR only if the output asks for it (xDSL op construction costs
about 0.1 ms per op: see benchmarks.md).
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import ArgSpec

from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

Graph = TaskGraph | MemGraph


class GraphPass(ModulePass):
    """A pass defined on the Python graphs; subclasses implement `transform`."""

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

    def transform(self, graph: Graph) -> Graph:
        raise NotImplementedError

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


def count_into(graph: MemGraph, stage: str, algorithm, counter: str) -> MemGraph:
    """Run `algorithm(graph) -> count` in place, timed, adding the count to the collected stats'
    field `counter` when the CLI collects stats."""
    from passes.compile_stats import collected, timed

    stats = collected.get()
    with timed(stats, stage):
        count = algorithm(graph)
    if stats is not None:
        setattr(stats, counter, getattr(stats, counter) + count)
    return graph


def check_budget_option(budget: int, pass_name: str) -> None:
    if budget <= 0:
        raise InputError(f"{pass_name} needs the option budget=BYTES with a positive number of bytes, got {budget}")

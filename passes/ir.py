"""The one read and one write each xDSL pass wrapper does: IR module <-> TaskGraph / MemGraph.

Wrappers convert on entry, run the algorithm on the Python structures, and swap the module body once.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph


def read_taskgraph(module: ModuleOp, pass_name: str) -> TaskGraph:
    from turnip_ir.convert import is_memgraph, taskgraph_from_ir

    if is_memgraph(module):
        raise InputError(f"{pass_name} needs a taskgraph, got a memgraph")
    return taskgraph_from_ir(module)


def read_memgraph(module: ModuleOp, pass_name: str) -> MemGraph:
    from turnip_ir.convert import is_memgraph, memgraph_from_ir

    if not is_memgraph(module):
        raise InputError(f"{pass_name} needs a memgraph (run turnip-insert-offload first), got a taskgraph")
    return memgraph_from_ir(module)


def write_back(module: ModuleOp, graph: TaskGraph | MemGraph) -> None:
    from turnip_ir.convert import memgraph_to_ir, replace_module, taskgraph_to_ir

    new = memgraph_to_ir(graph) if isinstance(graph, MemGraph) else taskgraph_to_ir(graph)
    replace_module(module, new)


def check_budget_option(budget: int, pass_name: str) -> None:
    if budget <= 0:
        raise InputError(f"{pass_name} needs the option budget=BYTES with a positive number of bytes, got {budget}")


def rewrite_memgraph(module: ModuleOp, pass_name: str, stage: str, algorithm, counter: str) -> None:
    """Read the memgraph, run `algorithm(graph) -> count` in place, add the count to the collected stats'
    field `counter` (when the CLI collects), and write the graph back once."""
    from passes.stats import collected, timed

    graph = read_memgraph(module, pass_name)
    stats = collected.get()
    with timed(stats, stage):
        count = algorithm(graph)
    if stats is not None:
        setattr(stats, counter, getattr(stats, counter) + count)
    write_back(module, graph)

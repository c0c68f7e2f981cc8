"""Compiled plans kept on disk across sessions and processes: their names (`plan_key`), and reading and
writing them.

A plan file is never trusted: anyone may edit it, copy another plan under its name or put something
that is not a file there. `read_plan` takes it only when it is proven a plan of the taskgraph the session
built, at the session's budget: every memgraph node that computes a task has that task's op, kernel,
attributes (compared by type and bits, so a NaN differs from any number), shape, dtype and GPU; the
outputs are the taskgraph's; the budget is the session's; and the verifier proves the seed's conditions
with the taskgraph (every operand traced back to the right task, no race, outputs survive). Anything
else (not a regular file, larger than any plan of the graph could be, not JSON, nested too deep, a plan
of another graph or budget) reads as no plan: it is compiled again and written anew, never refused.
A plan is written whole or not at all (`turnip_ir.files.atomic_write`: its temporary goes on any exit,
Ctrl-C included).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from turnip_ir.errors import TurnipError
from turnip_ir.files import atomic_write
from turnip_ir.io import parse_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph, attrs_key
from turnip_ir.verifier import verify_memgraph

PLAN_FORMAT = 1
"""Bumped when what a plan file's name stands for changes (`plan_key`)."""

BYTES_PER_TASK = 64 << 10
"""A plan file larger than this per taskgraph node (plus `BYTES_AT_LEAST`) is no plan of that graph, and
is not read: a node's JSON line is a few hundred bytes, and each task has a few nodes (its kernel, its
offloads and reloads)."""
BYTES_AT_LEAST = 1 << 20


def plan_key(graph: TaskGraph, budget: int, schedule: str, inputs: str, kept: Mapping | None,
             start_on_gpu: Iterable[str] = ()) -> str:
    """The name of a compiled plan on disk: a hash of the taskgraph's text and of everything else the
    compiler is given (the budget, the schedule, where inputs start, the inputs held where the backend
    holds them, those that start on the GPU all the same)."""
    digest = hashlib.sha256()
    digest.update(graph.dumps().encode())
    held = sorted((task, tuple(where)) for task, where in (kept or {}).items())
    given = (PLAN_FORMAT, int(budget), schedule, inputs, held)
    digest.update(repr((*given, sorted(start_on_gpu)) if start_on_gpu else given).encode())
    return digest.hexdigest()[:40]


def read_plan(path: Path, graph: TaskGraph, budget: int) -> MemGraph | None:
    """The plan kept at `path` when it is proven a plan of `graph` at `budget` (module docstring); None
    when there is none, or it is anything else (it is then compiled and written anew)."""
    text = _plan_text(path, BYTES_AT_LEAST + BYTES_PER_TASK * len(graph.nodes))
    if text is None:
        return None
    try:
        memgraph = parse_json(text, str(path))
        if not isinstance(memgraph, MemGraph) or not _plans(memgraph, graph, budget):
            return None
        verify_memgraph(memgraph, graph)
    except TurnipError:
        return None
    return memgraph


def _plan_text(path: Path, limit: int) -> str | None:
    """The text of the regular file at `path` when it holds at most `limit` bytes of UTF-8, else None.
    Opened without blocking (a FIFO would wait for a writer) and judged by what was opened (a link to
    /dev/zero is a character device)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        found = os.fstat(handle)
        if not stat.S_ISREG(found.st_mode) or found.st_size > limit:
            return None
        with os.fdopen(handle, "rb", closefd=False) as file:
            data = file.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(handle)
    if len(data) > limit:  # it grew while read
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _plans(memgraph: MemGraph, graph: TaskGraph, budget: int) -> bool:
    """Does every node of `memgraph` that computes a task match it in op, kernel, attributes, shape, dtype
    and GPU, with the budget, GPUs and outputs of `graph` at `budget`? (Operands, races and that every
    task is computed are the verifier's.)"""
    if memgraph.budget != budget or memgraph.devices != graph.devices:
        return False
    if set(memgraph.outputs) != set(graph.effective_outputs()):
        return False
    signatures: dict[str, tuple] = {}
    for node in memgraph.nodes:
        if node.op in ("offload", "reload"):
            continue
        task = graph.nodes.get(node.task)
        if task is None:
            return False
        want = signatures.get(task.id)
        if want is None:
            want = signatures[task.id] = _signature(task.op, task.shape, task.dtype, task.attrs)
        op = node.kernel if node.op == "kernel" else node.op
        if _signature(op, node.shape, node.dtype, node.attrs) != want or (node.op == "kernel") != (task.op not in ("input", "move")):
            return False
        if task.device is not None and node.device is not None and node.device != task.device:
            return False
    return True


def _signature(op: str, shape, dtype: str | None, attrs: dict) -> tuple:
    return op, None if shape is None else tuple(shape), dtype, attrs_key(attrs)


def write_plan(path: Path, memgraph: MemGraph) -> None:
    """Keep `memgraph` at `path`, written whole or not at all (the temporary removed on any exit)."""
    atomic_write(path, memgraph.dumps())

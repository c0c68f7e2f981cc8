"""Compiled plans kept on disk across sessions and processes: their names (`plan_key`), and reading and
writing them (a plan read back is verified again; one is written whole or not at all)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from turnip_ir.errors import InputError, TurnipError
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.verifier import verify_memgraph

PLAN_FORMAT = 1
"""Bumped when what a plan file's name stands for changes (`plan_key`)."""


def plan_key(graph: TaskGraph, budget: int, schedule: str, inputs: str, kept: Mapping | None) -> str:
    """The name of a compiled plan on disk: a hash of the taskgraph's text and of everything else the
    compiler is given (the budget, the schedule, where inputs start, the inputs held where the backend
    holds them)."""
    digest = hashlib.sha256()
    digest.update(graph.dumps().encode())
    held = sorted((task, tuple(where)) for task, where in (kept or {}).items())
    digest.update(repr((PLAN_FORMAT, int(budget), schedule, inputs, held)).encode())
    return digest.hexdigest()[:40]


def read_plan(path: Path) -> MemGraph | None:
    """The plan kept at `path`, verified again (a file can be stale or damaged); None when there is none
    or it does not read or verify (it is then compiled and written anew)."""
    try:
        memgraph = memgraph_from_json(json.loads(path.read_text()))
        verify_memgraph(memgraph)
    except (OSError, ValueError, TurnipError):  # OSError: none there (or unreadable); ValueError: not JSON
        return None
    return memgraph


def write_plan(path: Path, memgraph: MemGraph) -> None:
    """Keep `memgraph` at `path`, written whole or not at all (a temporary file renamed)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(memgraph.dumps())
        os.replace(temporary, path)
    except OSError as err:
        temporary.unlink(missing_ok=True)
        raise InputError(f"cannot write a plan into '{path.parent}': {err.strerror or err}") from None

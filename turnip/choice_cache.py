"""Choices and plans kept on disk across processes: `ChoiceCache` (which candidate a search chose, by
everything that changes it) and `kept_plan` (a compiled plan in a plan folder, turnip/plans.py).

A choice file is JSON: the format, the key's parts as given and the choice. Its name is a hash of the
parts, and a file is trusted only when its parts equal the ones asked for and every choice is one the
search could make; anything else (a damaged file, another format, another key) reads as no choice, and
the search runs again and writes it anew. A choice read names a plan that is compiled again (or read from
a plan folder, verified), so a wrong file costs time, never a wrong result.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from turnip.plans import plan_key, read_plan, write_plan
from turnip_ir.errors import InputError
from turnip_ir.files import atomic_write
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

CHOICE_FORMAT = 1
"""Bumped when what a choice file holds, or how a search chooses, changes: older files are not read."""


def default_cache_dir() -> Path:
    """Where choices are kept without a plan folder: $TURNIP_CACHE, else $XDG_CACHE_HOME/turnip, else
    ~/.cache/turnip."""
    if os.environ.get("TURNIP_CACHE"):
        return Path(os.environ["TURNIP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "turnip"


class ChoiceCache:
    """Choices by key (a JSON-able mapping of everything that changes them) in `folder`."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def path(self, key: Mapping) -> Path:
        digest = hashlib.sha256(_canonical({"format": CHOICE_FORMAT, **key}).encode()).hexdigest()[:40]
        return self.folder / f"choice-{digest}.json"

    def read(self, key: Mapping, valid: Callable[[Mapping], bool]) -> dict | None:
        """The choice kept for `key` when there is one that `valid` accepts, else None."""
        try:
            kept = json.loads(self.path(key).read_text())
        except (OSError, ValueError):  # none there, unreadable, or not JSON
            return None
        if not isinstance(kept, dict) or kept.get("format") != CHOICE_FORMAT:
            return None
        if kept.get("key") != json.loads(_canonical(key)):
            return None
        choice = kept.get("choice")
        return dict(choice) if isinstance(choice, dict) and valid(choice) else None

    def write(self, key: Mapping, choice: Mapping, note: Mapping | None = None) -> bool:
        """Keep `choice` for `key` (whole or not at all); False where the folder cannot be written (a choice
        not kept costs only the search next time)."""
        record = {"format": CHOICE_FORMAT, "key": json.loads(_canonical(key)), "choice": dict(choice), **(note or {})}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path(key), json.dumps(record, indent=1) + "\n")
        except (OSError, InputError):
            return False
        return True


class ChoiceCaches:
    """Several caches as one: a choice is read from the first that keeps it and written to all (a session
    with a plan folder keeps its choices there, with its plans, and in the user's cache, which a later
    process without the folder reads)."""

    def __init__(self, *caches: ChoiceCache):
        self.caches = caches
        self.folder = caches[0].folder

    def read(self, key: Mapping, valid: Callable[[Mapping], bool]) -> dict | None:
        return next((kept for cache in self.caches if (kept := cache.read(key, valid)) is not None), None)

    def write(self, key: Mapping, choice: Mapping, note: Mapping | None = None) -> bool:
        return all([cache.write(key, choice, note) for cache in self.caches])


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def plan_folder(path: str | Path | None) -> Path | None:
    """A plan folder, made if need be (None: none); a one-line InputError where it cannot be made."""
    if path is None:
        return None
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"plan folder '{folder}' cannot be made: {err.strerror or err}") from None
    return folder


def kept_plan(folder: Path | None, graph: TaskGraph, arena: int, schedule: str, remat: bool,
              compile: Callable[[], MemGraph]) -> tuple[MemGraph, bool]:
    """`graph`'s plan at `arena` from the plan folder (verified when read), or `compile()`'s, then kept
    there; returns it and whether it was read. No folder: compiled."""
    if folder is None:
        return compile(), False
    memgraph = read_plan(plan_path(folder, graph, arena, schedule, remat), graph, arena)
    if memgraph is not None:
        return memgraph, True
    memgraph = compile()
    keep_plan(folder, graph, arena, schedule, remat, memgraph)
    return memgraph, False


def keep_plan(folder: Path, graph: TaskGraph, arena: int, schedule: str, remat: bool, memgraph: MemGraph) -> None:
    """Keep a plan compiled elsewhere (a search's winner) where `kept_plan` reads it."""
    write_plan(plan_path(folder, graph, arena, schedule, remat), memgraph)


def plan_path(folder: Path, graph: TaskGraph, arena: int, schedule: str, remat: bool) -> Path:
    """The file of `graph`'s plan at `arena` in `folder`. Plans with recomputation are kept apart from the
    others: `plan_key` names the schedule, and here the schedule with remat."""
    return folder / f"{plan_key(graph, arena, f'{schedule} remat' if remat else schedule, 'gpu', None)}.json"

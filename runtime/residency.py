"""Inputs a prepared backend still holds from its last run, so the next run need not copy them again.

A session runs plan after plan on one prepared backend (`execute(..., close=False)`). When the caller
says an input's value is unchanged since the backend last had it (`execute(..., unchanged=names)`), the
backend skips copying it if it is still in place:
- on a GPU: the input starts at the same (GPU, offset, bytes) in the new plan as where the last run's
  plan left it untouched (`MemGraph.surviving_inputs`: no other node's location overlaps it, so nothing
  the run wrote reached it);
- in host storage: the new plan is the very memgraph the backend ran last (same storage regions, and a
  run never writes an input's region: storage is never reused within a plan).
Anything else is put in place as usual. A backend forgets everything when its memory is reallocated or
a run fails; `execute` records the survivors after each successful run.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from weakref import WeakKeyDictionary

from turnip_ir.memgraph import MemGraph

_IN_PLACE_AGAIN: WeakKeyDictionary = WeakKeyDictionary()
"""memgraph -> the inputs a run of it leaves in place for the next run of the same memgraph (its
surviving GPU inputs and its storage inputs): what `Residency.kept` finds when a plan runs again."""


class Residency:
    """What the backend's arenas and storage hold from its last run."""

    def __init__(self) -> None:
        self.gpu: dict[str, tuple[int, int, int]] = {}
        """Input task -> (GPU, offset, bytes) of its value, untouched since it was placed."""
        self.storage_of: MemGraph | None = None
        """The memgraph whose storage-start inputs are in place (the last one run)."""
        self.rows: dict[str, int] = {}
        """Input task -> the leading rows of it that are in place, for inputs placed only in part
        (`execute(..., partial=)`); an input not named here is in place whole."""

    def kept(self, memgraph: MemGraph, unchanged: Collection[str], inputs=None) -> set[str]:
        """The inputs of `memgraph` (by task) that are already in place with an unchanged value (`inputs`:
        its input nodes, when the caller has them)."""
        if not unchanged:
            return set()
        same_plan = memgraph is self.storage_of
        again = _IN_PLACE_AGAIN.get(memgraph) if same_plan and inputs is not None else None
        if again is not None:  # the plan that ran last runs again: what it left in place is known
            return again.intersection(unchanged)
        found = set()
        for node in memgraph.nodes if inputs is None else inputs:
            if node.op != "input":
                continue
            if node.loc is not None:
                if self.gpu.get(node.task) == (node.device, node.loc[0], node.loc[1]):
                    found.add(node.task)
            elif same_plan and node.storage is not None:
                found.add(node.task)
        if same_plan and inputs is not None:  # self.gpu holds this very plan's survivors (`ran`), as at every run of it again
            _IN_PLACE_AGAIN[memgraph] = frozenset(found)
        return found.intersection(unchanged)

    def ran(self, memgraph: MemGraph, survivors: Mapping[str, tuple[int, int, int]] | None = None,
            rows: Mapping[str, int] | None = None) -> None:
        """`memgraph` ran to completion: its surviving GPU inputs (`survivors`, when the caller has them)
        and its storage inputs are in place, those in `rows` only to that many leading rows."""
        self.gpu = dict(memgraph.surviving_inputs() if survivors is None else survivors)
        self.storage_of = memgraph
        self.rows = dict(rows or {})

    def forget(self) -> None:
        self.gpu = {}
        self.storage_of = None
        self.rows = {}


def row_length(shape) -> int:
    """Elements in one flat row of an array of `shape` (its last axis; 1 for a 1-D array): the unit a
    refresh's (start, stop) ranges count in."""
    return int(shape[len(shape) - 1]) if len(shape) > 1 else 1  # numba's simulated arrays index shapes with no negative index


def flat_rows(array):
    """`array` as rows of its last axis, [-1, last] (a view): what a refresh's ranges count in."""
    last = row_length(array.shape)
    return array.reshape(math.prod(int(n) for n in array.shape) // max(last, 1), last)  # simulated arrays reshape with no -1


def refreshed(target, value, ranges) -> list:
    """(destination, source) view pairs of the flat rows `ranges` ((start, stop) pairs) of an input."""
    target, value = flat_rows(target), flat_rows(value)
    return [(target[start:stop], value[start:stop]) for start, stop in ranges]


def placements(target, value, task: str, keep: Mapping[str, list[tuple[int, int]] | None]) -> list:
    """What putting input `task` in place copies, as (destination, source) pairs: all of `value` into
    `target`, nothing when `keep` says it is in place, or the flat rows `keep` names (`refreshed`)."""
    if task not in keep:
        return [(target, value)]
    return [] if keep[task] is None else refreshed(target, value, keep[task])


def leading_flat_rows(shape, rows: int) -> int:
    """Flat rows (`row_length`) in the first `rows` entries of the leading axis of an array of `shape`."""
    shape = tuple(int(n) for n in shape)
    per_row = math.prod(shape[1:]) // max(row_length(shape), 1) if len(shape) > 1 else 1  # an empty last axis: no rows
    return rows * per_row


def partial_placements(memgraph: MemGraph, partial: Mapping[str, int], kept: Mapping[str, list[tuple[int, int]] | None],
                       valid: Mapping[str, int], inputs=None, rows_of: Mapping[str, tuple[int, int]] | None = None) -> tuple[dict, dict[str, int]]:
    """What placing the inputs copies when a run reads some only in part (`partial`: task -> leading rows)
    and some in place were placed only in part (`valid`: task -> leading rows in place, Residency.rows),
    as `kept` extended (flat-row ranges, `refreshed`): an input not in place gets its first rows; one in
    place whole keeps what `kept` says; one in place in part also gets the rows from there to what this
    run reads (its rows since written are in `kept`'s ranges already). Also the leading rows of each
    input in place after the run, for those not whole (`Residency.ran`). `inputs`: the input nodes, when
    the caller has them; `rows_of`: `input_rows` of them, when it has that (then only the inputs named in
    `partial` and `valid` are looked at)."""
    if rows_of is None:
        rows_of = input_rows(memgraph.nodes if inputs is None else inputs)
    merged, after = dict(kept), {}
    for task in {**partial, **valid}:
        facts = rows_of.get(task)
        if facts is None:
            continue
        full, per_row = facts
        want = min(int(partial.get(task, full)), full)
        if task not in kept:
            if want < full:
                merged[task] = [(0, want * per_row)]
                after[task] = want
            continue
        have = valid.get(task)
        if have is None:  # in place whole
            continue
        if want > have:
            ranges = kept[task]
            gap = (have * per_row, want * per_row)
            merged[task] = [gap] if not ranges else _union([*ranges, gap])
        if max(have, want) < full:
            after[task] = max(have, want)
    return merged, after


def input_rows(nodes) -> dict[str, tuple[int, int]]:
    """Input task -> (entries of its leading axis, flat rows (`row_length`) per entry), for the inputs
    of `nodes` that have a shape."""
    return {node.task: (int(node.shape[0]), leading_flat_rows(node.shape, 1)) for node in nodes if node.op == "input" and node.shape}


def _union(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, stop) ranges sorted and joined where they overlap or touch."""
    joined: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], stop))
        else:
            joined.append((start, stop))
    return joined


def copy_limits(graph, partial: Mapping[str, int]) -> dict[int, int]:
    """The reload vertices of `graph` (an ExecGraph) that copy an input of `partial` (task -> leading rows
    the run reads) from its host home, mapped to those rows where they are fewer than the tensor's: the
    run need move no more (`Backend.limit_copies`)."""
    limits = {}
    for task, rows in partial.items():
        for vertex in graph.input_reloads.get(task, ()):
            node = graph.node(vertex)
            if node.shape and max(0, int(rows)) < node.shape[0]:
                limits[vertex] = max(0, int(rows))
    return limits


def limited_bytes(node, rows: int) -> int:
    """Bytes in the first `rows` entries of `node`'s leading axis."""
    return node.nbytes // int(node.shape[0]) * rows if node.shape and node.shape[0] else 0


def placed_bytes(memgraph: MemGraph, kept: Mapping[str, list[tuple[int, int]] | None], inputs=None,
                 ranged: Collection[str] | None = None, sizes: Mapping[str, tuple[int, int, int]] | None = None) -> tuple[int, int]:
    """Bytes a load of `memgraph` copies onto its GPUs and into host storage: every input's, but of a
    `kept` one nothing (None) or only the flat rows it names (`refreshed`). `inputs`: its input nodes,
    when the caller has them; `sizes`: `input_bytes` of them, when it has that; `ranged`: the inputs of
    `kept` that name rows, or some more, when the caller knows them (else every entry is looked at)."""
    if sizes is None:
        sizes = input_bytes(memgraph.nodes if inputs is None else inputs)
    placed = [0, 0]
    for task in sizes.keys() - kept.keys():  # not in place: all of it
        nbytes, where, _ = sizes[task]
        placed[where] += nbytes
    for task in kept if ranged is None else ranged:
        ranges = kept.get(task)
        entry = sizes.get(task)
        if ranges is not None and entry is not None:  # in place but for these rows
            _, where, row_bytes = entry
            placed[where] += row_bytes * sum(b - a for a, b in ranges)
    return placed[0], placed[1]


def input_bytes(inputs) -> dict[str, tuple[int, int, int]]:
    """Per input placed on a GPU or in host storage: (nbytes, 0 for a GPU or 1 for storage, bytes per
    flat row: 0 for a scalar)."""
    per_task = {}
    for node in inputs:
        if node.op != "input" or (node.loc is None and node.storage is None):
            continue
        row_bytes = node.nbytes // (math.prod(node.shape) or 1) * row_length(node.shape) if node.shape else 0
        per_task[node.task] = (node.nbytes, 0 if node.loc is not None else 1, row_bytes)
    return per_task

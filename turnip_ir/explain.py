"""What a memgraph offloads and reloads, and why: read back from the plan itself.

The compiler writes its nodes in the order of the one run it simulated, so the plan holds the story of
each reload. A reload of tensor `t` on GPU `d` either brings an input that starts in host memory (the
weights, with `inputs="host"`), or follows an eviction: the previous copy of `t` on `d` lost its place
to the first later node that writes an overlapping region (`displaced_by`: the output or reload the
planner needed room for), was offloaded by the offload that reads it, or was simply dropped because host
memory already held it. The reload's first reader is the use that brought it back, and the kernels on
`d` between the eviction and that use are how far away it was (the planner evicts what is needed last,
weighed by bytes: docs/passes.md). When no later write overlaps the evicted copy before its reload, the
planner cleared it to repack the GPU for one op's working set (`displaced_by` is None).

Works on any memgraph file, also one the compiler did not write, as long as its nodes are in an order
one run could take (the format requires a topological order).
"""

from __future__ import annotations

import bisect
import fnmatch
from dataclasses import asdict, dataclass
from functools import cached_property

from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.units import format_size


@dataclass(frozen=True)
class Reload:
    """One reload of a plan and why it is there (node ids, not positions)."""

    node: int
    task: str
    device: int
    nbytes: int
    cause: str
    """'host input' (the tensor starts in host memory) or 'evicted' (an earlier GPU copy was evicted)."""
    evicted_copy: int | None = None
    """The GPU copy that was evicted (a kernel, input, move or earlier reload)."""
    displaced_by: int | None = None
    """The first later node writing over the evicted copy's place, before the reload; None for a repack."""
    offload: int | None = None
    """The offload that saved the evicted copy; None when host memory already held the tensor."""
    needed_by: int | None = None
    """The reload's first reader: the use it was brought back for."""
    kernels_away: int | None = None
    """Kernels on the GPU between the eviction and that use (from `displaced_by`, else from the last
    reader of the evicted copy)."""


@dataclass
class OffloadReport:
    """Every reload of a memgraph with its cause, plus what the offloads saved that nobody reloads."""

    graph: MemGraph
    reloads: list[Reload]
    kept_in_host: list[int]
    """Offloads never reloaded: outputs left in host memory (or copies the plan never needed back)."""
    first_reader: dict[int, int]
    """{node: the first node that reads it}."""

    @cached_property
    def nodes(self) -> dict[int, MemNode]:
        return self.graph.by_id()

    def select(self, pattern: str | None = None, device: int | None = None) -> list[Reload]:
        """The reloads whose tensor matches the glob `pattern` and that run on `device` (None: any)."""
        return [r for r in self.reloads
                if (pattern is None or fnmatch.fnmatchcase(r.task, pattern)) and (device is None or r.device == device)]

    def summary_lines(self, top: int = 5, device: int | None = None) -> list[str]:
        """Per GPU (or only `device`): offloads, reloads by cause, and the tensors reloaded most (by bytes)."""
        nodes = self.nodes
        lines = []
        for d in range(self.graph.devices) if device is None else [device]:
            offloads = [n for n in self.graph.nodes if n.op == "offload" and n.device == d]
            mine = [r for r in self.reloads if r.device == d]
            again = [n for n in self.graph.recomputes() if n.device == d]
            if not offloads and not mine and not again:
                lines.append(f"GPU {d}: nothing offloaded or reloaded (budget {format_size(self.graph.budget)})")
                continue
            hosted = [r for r in mine if r.cause == "host input"]
            evicted = [r for r in mine if r.cause == "evicted"]
            saved = sum(1 for r in evicted if r.offload is not None)
            kept = [nodes[k] for k in self.kept_in_host if nodes[k].device == d]
            lines.append(f"GPU {d}: budget {format_size(self.graph.budget)}; {_count(len(offloads), 'offload')} "
                         f"({_bytes(offloads)}), {_count(len(mine), 'reload')} ({format_size(sum(r.nbytes for r in mine))})")
            if hosted:
                lines.append(f"  {_count(len(hosted), 'reload')} of inputs that start in host memory ({format_size(sum(r.nbytes for r in hosted))})")
            if evicted:
                away = sorted(r.kernels_away for r in evicted if r.kernels_away is not None)
                lines.append(f"  {_count(len(evicted), 'reload')} after an eviction ({format_size(sum(r.nbytes for r in evicted))}): "
                             f"{saved} offloaded when evicted, {len(evicted) - saved} dropped because host memory held them"
                             + (f"; used again after {_spread(away, 'other kernels')}" if away else ""))
            if kept:
                lines.append(f"  {_count(len(kept), 'offload')} never reloaded ({_bytes(kept)}): outputs left in host memory")
            if again:
                lines.append(f"  {_count(len(again), 'recompute')} instead of a reload ({_bytes(again)}): dropped when evicted, "
                             f"computed again where used (remat)")
            totals: dict[str, list[int]] = {}
            for r in mine:
                entry = totals.setdefault(r.task, [0, 0])
                entry[0] += 1
                entry[1] += r.nbytes
            most = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))[:top]
            if most:
                lines.append("  most bytes reloaded: " + ", ".join(
                    f"{task} ({count} x {format_size(total // count)})" for task, (count, total) in most))
        return lines

    def line(self, reload: Reload) -> str:
        """One reload as a sentence: what came back, for whom, and why it had left."""
        nodes = self.nodes
        head = f"node {reload.node} reload {reload.task} ({format_size(reload.nbytes)}, GPU {reload.device})"
        if reload.needed_by is not None:
            head += f" for {_name(nodes[reload.needed_by])}"
        if reload.cause == "host input":
            return f"{head}: starts in host memory"
        if reload.displaced_by is None:
            why = f"evicted after node {reload.evicted_copy} to repack the GPU"
        else:
            why = f"evicted at node {reload.displaced_by} to make room for {_room_for(nodes[reload.displaced_by], nodes, self.first_reader)}"
        if reload.kernels_away is not None:
            why += f", used again after {_count(reload.kernels_away, 'other kernel')}"
        why += f"; offloaded by node {reload.offload}" if reload.offload is not None else "; host memory already held it"
        return f"{head}: {why}"

    def to_json(self) -> dict:
        return {"devices": self.graph.devices, "budget": self.graph.budget,
                "reloads": [asdict(r) for r in self.reloads], "kept_in_host": list(self.kept_in_host)}


def explain_offloads(graph: MemGraph) -> OffloadReport:
    """Every reload of `graph` with its cause; see the module docstring for how each is found."""
    nodes = graph.nodes
    position = {node.id: k for k, node in enumerate(nodes)}
    first_reader: dict[int, int] = {}
    last_reader: dict[int, int] = {}
    for node in nodes:
        for i in node.inputs:
            first_reader.setdefault(i, node.id)
            last_reader[i] = node.id
    displaced = _displacements(graph)
    kernels_before = _kernel_counts(graph)
    offload_of = {node.inputs[0]: node.id for node in nodes if node.op == "offload" and node.inputs}
    last_copy: dict[tuple[str, int], int] = {}
    last_reload: dict[tuple[str, int], int] = {}
    reloads: list[Reload] = []
    for k, node in enumerate(nodes):
        if node.device is None or node.loc is None:
            continue
        key = (node.task, node.device)
        if node.op == "reload":
            last_reload[key] = k
            copy = last_copy.get(key)
            needed = first_reader.get(node.id)
            base = dict(node=node.id, task=node.task, device=node.device, nbytes=node.loc[1], needed_by=needed)
            if copy is None:
                reloads.append(Reload(cause="host input", **base))
            else:
                by = displaced.get(copy)
                if by is not None and position[by] >= k:
                    by = None  # overwritten only by or after the reload: the copy left in a repack
                away = None
                if needed is not None:
                    since = position[by] if by is not None else position[last_reader.get(copy, copy)]
                    counts = kernels_before[node.device]
                    away = max(0, counts[position[needed]] - counts[since + 1])
                reloads.append(Reload(cause="evicted", evicted_copy=copy, displaced_by=by, offload=offload_of.get(copy),
                                      kernels_away=away, **base))
        last_copy[key] = node.id
    kept = [node.id for k, node in enumerate(nodes)
            if node.op == "offload" and last_reload.get((node.task, node.device), -1) < k]
    return OffloadReport(graph, reloads, kept, first_reader)


def _displacements(graph: MemGraph) -> dict[int, int]:
    """{GPU copy: the first later node writing a region that overlaps it on the same GPU}.

    One sweep per GPU over the regions last written, kept disjoint and sorted by start: a new write
    displaces every region it touches (one byte overwritten and the copy is gone) and takes their place.
    """
    displaced: dict[int, int] = {}
    regions: dict[int, tuple[list[int], list[tuple[int, int]]]] = {}
    for node in graph.nodes:
        if node.device is None or node.loc is None:
            continue
        starts, rest = regions.setdefault(node.device, ([], []))  # rest[j] = (end, writer) of starts[j]
        lo, hi = node.loc[0], node.loc[0] + max(node.loc[1], 1)
        first = bisect.bisect_right(starts, lo) - 1
        if first < 0 or rest[first][0] <= lo:
            first += 1
        last = first
        while last < len(starts) and starts[last] < hi:
            displaced.setdefault(rest[last][1], node.id)
            last += 1
        starts[first:last] = [lo]
        rest[first:last] = [(hi, node.id)]
    return displaced


def _kernel_counts(graph: MemGraph) -> dict[int, list[int]]:
    """Per GPU: counts[k] = kernels on that GPU among the first k nodes."""
    counts = {d: [0] * (len(graph.nodes) + 1) for d in range(graph.devices)}
    for k, node in enumerate(graph.nodes):
        for d, row in counts.items():
            row[k + 1] = row[k] + (node.op == "kernel" and node.device == d)
    return counts


def _room_for(node: MemNode, nodes: dict[int, MemNode], first_reader: dict[int, int]) -> str:
    if node.op == "reload":
        reader = first_reader.get(node.id)
        return f"reload of {node.task}" + (f" for {_name(nodes[reader])}" if reader is not None else "")
    return _name(node)


def _name(node: MemNode) -> str:
    return f"{node.task} ({node.kernel or node.op})"


def _spread(values: list[int], unit: str) -> str:
    """Sorted counts as `3 UNIT`, or `1-63 UNIT (median 14)`."""
    if values[0] == values[-1]:
        return f"{values[0]} {unit}"
    return f"{values[0]}-{values[-1]} {unit} (median {values[len(values) // 2]})"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _bytes(nodes: list[MemNode]) -> str:
    return format_size(sum(node.nbytes for node in nodes))

"""The run summary: makespan, GPU busy fractions, bytes moved, link bandwidth, transfer stalls, arena use.

Computed once after a run from the recorded completions (interval unions per GPU), never in the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runtime.backends.base import Completion
from runtime.graph import ExecGraph
from runtime.host_memory import arena_peaks
from runtime.residency import limited_bytes
from turnip_ir.units import format_size


@dataclass(frozen=True)
class LinkIdle:
    """Idle time of one GPU's H2D engine: from the run's start to its first reload, in the gaps between
    its first and last reload, and from its last reload to the run's end; seconds."""

    before: float
    gaps: float
    gap_count: int
    after: float

    def text(self) -> str:
        return (f"{self.before * 1e3:.3f} ms before the first reload, {self.gaps * 1e3:.3f} ms in {self.gap_count} gaps, "
                f"{self.after * 1e3:.3f} ms after the last")


@dataclass(frozen=True)
class Timing:
    """What a run's completion spans say (RunSummary's lazily read fields)."""

    makespan: float
    busy: list[float]
    transfer_stall: list[float]
    h2d_bandwidth: float
    d2h_bandwidth: float
    peer_bandwidth: float
    h2d_idle: list[LinkIdle | None]


@dataclass
class RunSummary:
    """What `turnip run` prints. Times are on the backend clock (virtual for sim), in seconds."""

    backend: str
    order: str
    vertices: int
    wall_time: float
    """Real seconds spent in the event loop."""
    timing: Callable[[], Timing] | None = field(default=None, repr=False, compare=False)
    """What the completions' spans say (`Timing`: makespan, busy fractions, stalls, link rates), worked
    out at the first read of any of them: a decode step's session reads none, and a repeated run
    should not pay for them."""
    bytes_offloaded: int = 0
    bytes_reloaded: int = 0
    bytes_moved: int = 0
    recomputes: int = 0
    """Kernel vertices that compute a task again instead of reloading it (the planner's `remat`)."""
    recompute_seconds: float = 0.0
    """Their summed durations on the backend clock."""
    bytes_recomputed: int = 0
    """The bytes they wrote: what reloads would have brought back instead."""
    bytes_placed: int = 0
    """Bytes of inputs copied onto the GPUs before the run (not those kept from the run before)."""
    bytes_staged: int = 0
    """Bytes of inputs copied into host storage before the run (not those kept from the run before)."""
    bytes_written_straight: int = 0
    """Bytes of outputs that the backend wrote into the caller's arrays and pieces (`execute(outputs_into=)`)
    itself, in one copy from where the output was computed: the cuda backend's from the GPU during the run."""
    bytes_copied_after: int = 0
    """Bytes of such outputs copied into the caller's memory on the host after the run, from another copy
    (an output the plan left in host storage, the cuda backend's staging, the cpu backend's arena)."""
    arena_high_water: list[int] = field(default_factory=list)
    """Per GPU: the end of the highest planned location, i.e. the arena bytes the run touched."""
    notes: list[str] = field(default_factory=list)
    """Backend-specific lines (the cuda backend's memory: arena, workspace, library pools)."""
    prepare_time: float = 0.0
    """Real seconds the backend's `prepare` took (allocation, inputs in place, kernels built)."""
    inputs_time: float = 0.0
    """Real seconds of `prepare_time` spent putting the inputs in place (weights into host storage)."""
    host_seconds: dict[str, float] = field(default_factory=dict)
    """Real seconds of `execute`'s own work around the event loop, by part: "checks" (the plan's
    facts, the inputs checked), "residency" (what is in place already), "prepare" (the backend's load),
    "outputs" (reading them), "summary" (this summary): what a repeated call adds to its run."""

    span: Callable[[], float] | None = field(default=None, repr=False, compare=False)
    """The makespan alone, without the rest of `Timing` (what the plan search's simulations read)."""

    _timed: Timing | None = field(default=None, init=False, repr=False, compare=False)

    def _timing(self) -> Timing:
        if self._timed is None:
            self._timed = self.timing() if self.timing is not None else Timing(0.0, [], [], 0.0, 0.0, 0.0, [])
        return self._timed

    @property
    def makespan(self) -> float:
        """Backend-clock seconds from the first start to the last end."""
        if self._timed is None and self.span is not None:
            return self.span()
        return self._timing().makespan

    @property
    def busy(self) -> list[float]:
        """Per GPU: fraction of the makespan with at least one compute stream busy."""
        return self._timing().busy

    @property
    def transfer_stall(self) -> list[float]:
        """Per GPU: seconds with no compute running while a transfer of that GPU was in flight."""
        return self._timing().transfer_stall

    @property
    def h2d_bandwidth(self) -> float:
        """Achieved bytes/s while the H2D engines were busy (reloads)."""
        return self._timing().h2d_bandwidth

    @property
    def d2h_bandwidth(self) -> float:
        return self._timing().d2h_bandwidth

    @property
    def peer_bandwidth(self) -> float:
        return self._timing().peer_bandwidth

    @property
    def h2d_idle(self) -> list[LinkIdle | None]:
        """Per GPU: when its H2D engine (the host link's reloads) sat idle; None for a GPU without reloads."""
        return self._timing().h2d_idle

    def _makespan_text(self) -> str:
        """The sim's makespan is its cost model's prediction, not a time anything took."""
        if self.backend == "sim":
            return f"predicted makespan {self.makespan * 1e3:.3f} ms (sim)"
        return f"makespan {self.makespan * 1e3:.3f} ms"

    def lines(self) -> list[str]:
        gb = 1e9
        busy = ", ".join(f"gpu{d} {b:.0%}" for d, b in enumerate(self.busy))
        stall = ", ".join(f"gpu{d} {s * 1e3:.3f} ms" for d, s in enumerate(self.transfer_stall))
        arena = ", ".join(f"gpu{d} {format_size(b)}" for d, b in enumerate(self.arena_high_water))
        return [
            f"backend {self.backend}, order {self.order}, {self.vertices} vertices",
            f"wall time {self.wall_time:.4f} s, {self._makespan_text()}",
            f"busy: {busy}",
            f"offloaded {format_size(self.bytes_offloaded)} at {self.d2h_bandwidth / gb:.1f} GB/s, "
            f"reloaded {format_size(self.bytes_reloaded)} at {self.h2d_bandwidth / gb:.1f} GB/s, "
            f"moved {format_size(self.bytes_moved)} at {self.peer_bandwidth / gb:.1f} GB/s",
            f"stall waiting on transfers: {stall}",
            f"peak arena use: {arena}",
            *(f"H2D idle: gpu{d} {idle.text()}" for d, idle in enumerate(self.h2d_idle) if idle is not None),
            *self.notes,
            *self._recompute_lines(),
            *self._into_lines(),
        ]

    def _into_lines(self) -> list[str]:
        """One line when the run wrote outputs into the caller's memory (none otherwise)."""
        if not self.bytes_written_straight and not self.bytes_copied_after:
            return []
        return [f"outputs into the caller's memory: {format_size(self.bytes_written_straight)} written straight by the backend, "
                f"{format_size(self.bytes_copied_after)} copied on the host after the run"]

    def _recompute_lines(self) -> list[str]:
        """One line when the plan recomputes (none otherwise, so plans without remat print as before)."""
        if not self.recomputes:
            return []
        return [f"recomputed {self.recomputes} kernels in {self.recompute_seconds * 1e3:.3f} ms "
                f"instead of reloading {format_size(self.bytes_recomputed)}"]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals."""
    total = 0.0
    end = float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def summarize(graph: ExecGraph, completions: list[Completion], backend: str, order: str, wall: float,
              limits: Mapping[int, int] | None = None) -> RunSummary:
    """The run's summary from its completions (every vertex's, a run that finished); `limits`: copies
    that moved only some leading rows (`Backend.limit_copies`), counted at what they moved. What depends
    only on the plan (the bytes each kind of copy moves, the high water) is read once per ExecGraph;
    what the spans say (`Timing`) when first asked."""
    limits = limits or {}
    kinds = graph.facts.get("lane_kinds")
    if kinds is None:
        kinds = graph.facts["lane_kinds"] = [(lane.kind, lane.device) for lane in graph.lanes]
    volume = dict(_copy_volume(graph))
    for vertex, rows in limits.items():
        node = graph.node(vertex)
        kind = kinds[graph.lanes_of[graph.resource[vertex]][0]][0]
        volume[kind] -= node.nbytes - limited_bytes(node, rows)
    summary = RunSummary(backend, order, len(graph), wall, timing=lambda: _timing(graph.memgraph.devices, kinds, completions, volume),
                         span=lambda: _span(completions))
    summary.bytes_reloaded, summary.bytes_offloaded, summary.bytes_moved = volume["h2d"], volume["d2h"], volume["peer"]
    _count_recomputes(summary, graph, completions)
    summary.arena_high_water = _high_water(graph)
    return summary


def _span(completions: list[Completion]) -> float:
    """Seconds from the first start to the last end (`Timing.makespan`)."""
    if not completions:
        return 0.0
    return max(done.end for done in completions) - min(done.start for done in completions)


def _timing(devices: int, kinds: list[tuple[str, int]], completions: list[Completion], volume: Mapping[str, int]) -> Timing:
    """The spans' figures: per GPU and kind of lane, the (start, end) of its vertices, unioned."""
    spans: dict[str, list[list[tuple[float, float]]]] = {kind: [[] for _ in range(devices)] for kind in ("compute", "h2d", "d2h", "peer")}
    begin, end = float("inf"), float("-inf")
    for done in completions:
        kind, device = kinds[done.lane]
        start, stop = done.start, done.end
        spans[kind][device].append((start, stop))
        if start < begin:
            begin = start
        if stop > end:
            end = stop
    if not completions:
        begin = end = 0.0
    makespan = end - begin
    busy, stall = [], []
    for device in range(devices):
        compute = spans["compute"][device]
        transfers = spans["h2d"][device] + spans["d2h"][device] + spans["peer"][device]
        covered = union_length(compute)
        busy.append(covered / makespan if makespan > 0 else 0.0)
        stall.append(union_length(compute + transfers) - covered if transfers else 0.0)
    rates = {kind: _rate(volume[kind], [span for per in spans[kind] for span in per]) for kind in ("h2d", "d2h", "peer")}
    idle = [link_idle(per, begin, end) if per else None for per in spans["h2d"]]
    return Timing(makespan, busy, stall, rates["h2d"], rates["d2h"], rates["peer"], idle)


def _copy_volume(graph: ExecGraph) -> dict[str, int]:
    """Bytes the copies of each kind move in a whole run of the plan (none limited)."""
    if "copy_volume" not in graph.facts:
        volume = {"h2d": 0, "d2h": 0, "peer": 0}
        for vertex in range(len(graph)):
            resource = graph.resource[vertex]
            if resource < 0:
                continue
            kind = graph.lanes[graph.lanes_of[resource][0]].kind
            if kind in volume:
                volume[kind] += graph.node(vertex).nbytes
        graph.facts["copy_volume"] = volume
    return graph.facts["copy_volume"]


def link_idle(spans: list[tuple[float, float]], begin: float, end: float) -> LinkIdle:
    """How long an engine busy in `spans` idled in a run from `begin` to `end`: before its first span,
    in the gaps between spans, after its last."""
    spans = sorted(spans)
    gaps, count, reach = 0.0, 0, spans[0][1]
    for lo, hi in spans[1:]:
        if lo > reach:
            gaps += lo - reach
            count += 1
        reach = max(reach, hi)
    return LinkIdle(spans[0][0] - begin, gaps, count, end - reach)


def _rate(count: int, spans: list[tuple[float, float]]) -> float:
    seconds = sum(hi - lo for lo, hi in spans)
    return count / seconds if seconds > 0 else 0.0


def _high_water(graph: ExecGraph) -> list[int]:
    """Per GPU the end of the highest planned location (`arena_peaks`), read once per ExecGraph."""
    if "high_water" not in graph.facts:
        graph.facts["high_water"] = arena_peaks(graph.memgraph)
    return list(graph.facts["high_water"])


def _count_recomputes(summary: RunSummary, graph: ExecGraph, completions: list[Completion]) -> None:
    if "recomputed" not in graph.facts:
        graph.facts["recomputed"] = {node.id for node in graph.memgraph.recomputes()}
    again = graph.facts["recomputed"]
    if not again:
        return
    nodes = graph.memgraph.nodes
    done = [c for c in completions if nodes[c.vertex].id in again]
    summary.recomputes = len(again)
    summary.recompute_seconds = sum(c.end - c.start for c in done)
    summary.bytes_recomputed = sum(nodes[c.vertex].nbytes for c in done)

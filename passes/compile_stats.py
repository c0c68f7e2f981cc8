"""Compile statistics: what the pipeline did, and a collector the CLI reads for `--stats`.

Each pass's `run(state)` records what it did into `state.stats`, the `CompileStats` of its
`Compilation` (passes/compilation.py; `timed`, `add`), so every stage of one compilation records into
the same one. Passes stay stateless: run by `turnip-opt`, a compilation records into the `collected`
context variable when the CLI has set one (`collecting()`), and into fresh stats nobody reads
otherwise, so `--stats` works for the named pipeline and for a list of single passes alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from dataclasses import dataclass, field

from turnip_ir.cost import CostModel
from turnip_ir.memgraph import MemGraph


@dataclass
class CompileStats:
    """Counts, bytes and seconds of one compilation."""

    ops: dict[str, int] = field(default_factory=dict)
    bytes_offloaded: int = 0
    bytes_reloaded: int = 0
    recomputes: int = 0
    """Kernel nodes that compute a task again instead of reloading it (`remat`)."""
    recompute_seconds: float = 0.0
    """Their time under the cost model the plan was made with."""
    bytes_recomputed: int = 0
    """The bytes they hold: what a reload would have brought back instead."""
    edges_added: int = 0
    edges_redundant: int = 0
    edges_removed_minimize: int = 0
    edges_removed_reduce: int = 0
    peak_memory: dict[int, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def record_graph(self, graph: MemGraph, cost: CostModel | None = None) -> None:
        """Fill the op counts, copy bytes, per-GPU peaks and recomputes from the final memgraph; `cost`
        times the recomputes (None: the H200 defaults)."""
        self.ops = dict.fromkeys(("input", "kernel", "move", "offload", "reload"), 0)
        self.bytes_offloaded = self.bytes_reloaded = 0
        peaks: dict[int, int] = {}
        for node in graph.nodes:
            self.ops[node.op] = self.ops.get(node.op, 0) + 1
            if node.op == "offload":
                self.bytes_offloaded += node.storage[1]
            if node.loc is not None and node.device is not None:
                self.bytes_reloaded += node.loc[1] if node.op == "reload" else 0
                peaks[node.device] = max(peaks.get(node.device, 0), node.loc[0] + node.loc[1])
        self.peak_memory = dict(sorted(peaks.items()))
        again = graph.recomputes()
        self.recomputes, self.bytes_recomputed = len(again), sum(node.nbytes for node in again)
        by_id = graph.by_id() if again else {}
        cost = cost or CostModel()
        self.recompute_seconds = sum(cost.kernel_time(node, [by_id[i] for i in node.inputs]) for node in again)

    @property
    def memory_edges(self) -> int:
        return self.edges_added - self.edges_removed_minimize - self.edges_removed_reduce

    def table(self) -> str:
        """A plain-text table for `--stats`."""
        rows = [(f"ops {op}", str(count)) for op, count in self.ops.items()]
        rows += [("bytes offloaded", str(self.bytes_offloaded)), ("bytes reloaded", str(self.bytes_reloaded))]
        if self.recomputes:
            rows += [("recomputes", str(self.recomputes)), ("bytes recomputed", str(self.bytes_recomputed)),
                     ("recompute time (cost model)", f"{self.recompute_seconds * 1000:.3f} ms")]
        rows += [
            ("memory edges added", str(self.edges_added)),
            ("memory edges redundant", str(self.edges_redundant)),
            ("memory edges removed (minimize)", str(self.edges_removed_minimize)),
            ("memory edges removed (reduce)", str(self.edges_removed_reduce)),
            ("memory edges kept", str(self.memory_edges)),
        ]
        rows += [(f"peak memory GPU {d}", f"{peak} bytes") for d, peak in self.peak_memory.items()]
        rows += [(f"time {stage}", f"{secs * 1000:.1f} ms") for stage, secs in self.seconds.items()]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@contextlib.contextmanager
def timed(stats: CompileStats | None, stage: str):
    """Add the block's wall time to `stats.seconds[stage]` (no-op when `stats` is None)."""
    start = time.perf_counter()
    yield
    if stats is not None:
        stats.seconds[stage] = stats.seconds.get(stage, 0.0) + time.perf_counter() - start


def add(stats: CompileStats | None, **counts: int) -> None:
    """Add each count to the field of `stats` it names (no-op when `stats` is None)."""
    if stats is not None:
        for counter, count in counts.items():
            setattr(stats, counter, getattr(stats, counter) + count)


collected: contextvars.ContextVar[CompileStats | None] = contextvars.ContextVar("turnip_compile_stats", default=None)
"""Where the `turnip-memgraph` pass records its stats when a caller asked for them."""


@contextlib.contextmanager
def collecting():
    """Collect the stats of the pipeline passes run inside the block: `with collecting() as stats: ...`."""
    stats = CompileStats()
    token = collected.set(stats)
    try:
        yield stats
    finally:
        collected.reset(token)

"""Executor callbacks, in the style of Dask's scheduler callbacks, and the ones the runtime ships.

Hooks: `start(graph)`, `vertex_start(vertex, lane, time)`, `vertex_end(completion)` and
`finish(graph, failed)`. They run on the event loop's thread, so they must stay cheap. `Recorder` keeps
every completion (the trace and the statistics are computed from it), `ProgressBar` shows tqdm when a
run lasts more than a couple of seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.backends.base import Completion
from runtime.graph import NO_RESOURCE, ExecGraph, Lane
from turnip_ir.files import atomic_write


class Callback:
    """No-op hooks; subclass and override the ones you need."""

    def start(self, graph: ExecGraph) -> None:
        pass

    def vertex_start(self, vertex: int, lane: Lane, time: float) -> None:
        pass

    def vertex_end(self, completion: Completion) -> None:
        pass

    def finish(self, graph: ExecGraph, failed: bool) -> None:
        pass


class Recorder(Callback):
    """Every completion of a run, in completion order, plus the graph: the source of traces and stats."""

    def __init__(self):
        self.graph: ExecGraph | None = None
        self.completions: list[Completion] = []
        self.started: dict[int, float] = {}

    def start(self, graph: ExecGraph) -> None:
        self.graph = graph
        self.completions = []
        self.started = {}

    def vertex_start(self, vertex: int, lane: Lane, time: float) -> None:
        self.started[vertex] = time

    def vertex_end(self, completion: Completion) -> None:
        self.completions.append(completion)

    def trace_events(self) -> list[dict]:
        """Chrome trace events: one process per GPU, one thread (track) per lane, times in microseconds;
        each vertex's `args` name its memgraph node, its bytes and when the loop submitted it."""
        graph = self.graph
        events: list[dict] = []
        for device in range(graph.memgraph.devices):
            events.append({"ph": "M", "name": "process_name", "pid": device, "args": {"name": f"gpu{device}"}})
        for lane in graph.lanes:
            events.append({"ph": "M", "name": "thread_name", "pid": lane.device, "tid": lane.index, "args": {"name": lane.name}})
        for done in self.completions:
            node = graph.node(done.vertex)
            lane = graph.lanes[done.lane]
            events.append({
                "ph": "X",
                "name": graph.name(done.vertex),
                "cat": node.op,
                "pid": lane.device,
                "tid": lane.index,
                "ts": done.start * 1e6,
                "dur": max(done.end - done.start, 0.0) * 1e6,
                "args": {"node": node.id, "bytes": node.nbytes, **self._submitted(done.vertex)},
            })
        return events

    def _submitted(self, vertex: int) -> dict:
        """When the loop handed the vertex to its lane, in trace microseconds (the backend's clock: on the
        cuda backend host time from the clock's origin, close to the device times' zero)."""
        submitted = self.started.get(vertex)
        return {} if submitted is None else {"submitted": submitted * 1e6}

    def trace_json(self) -> str:
        """The trace as Chrome/Perfetto JSON (open at ui.perfetto.dev)."""
        return json.dumps({"traceEvents": self.trace_events(), "displayTimeUnit": "ms"})

    def write_trace(self, path: str | Path) -> None:
        atomic_write(path, self.trace_json())


class ProgressBar(Callback):
    """A tqdm bar over every vertex, shown only once the run has lasted `delay` seconds (and when `enabled`).

    The inputs (vertices without a resource) are done when the run starts; every completion counts one.
    tqdm redraws at most ten times a second, so after a fast burst of completions the last drawing lags
    behind the count: a run that ends draws the bar once more, at its total, and leaves it on screen.
    """

    def __init__(self, delay: float = 2.0, enabled: bool = True, file=None):
        self.delay = delay
        self.enabled = enabled
        self.file = file
        self.bar = None

    def start(self, graph: ExecGraph) -> None:
        from tqdm import tqdm

        inputs = sum(1 for resource in graph.resource if resource == NO_RESOURCE)
        self.bar = tqdm(total=len(graph), initial=inputs, unit="vertex", delay=self.delay, disable=not self.enabled,
                        file=self.file, leave=True)

    def vertex_end(self, completion: Completion) -> None:
        self.bar.update(1)

    def finish(self, graph: ExecGraph, failed: bool) -> None:
        if self.bar is None:
            return
        if not failed:
            self.bar.refresh()
        else:
            self.bar.leave = False  # a failed run's error line follows; the bar goes
        self.bar.close()

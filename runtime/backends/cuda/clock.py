"""The backend's clock and events: each completion carries device times, so traces show what the GPU did.

Per GPU, a pool of timing events made in its context when the backend is set up (two per vertex a lane
may hold, plus one) and recycled as vertices finish, and an origin event recorded when a run starts.
`submit` takes a start and an end event per vertex from the pool; `stamp` turns them into seconds since
the origin (event elapsed time) and gives them back. Where events carry no time (the simulator, which
runs every launch synchronously), the host's times around the launch stand in.
"""

from __future__ import annotations

import time

from runtime.backends.cuda.driver import GpuDriver
from runtime.graph import ExecGraph


class Clock:
    """Event pools per GPU, the run's origins, and each unfinished vertex's start and end events."""

    def __init__(self, driver: GpuDriver, pool_sizes: list[int]):
        self.driver = driver
        self.pools: list[list] = []
        for device, size in enumerate(pool_sizes):
            with driver.on(device):  # events belong to a device: made here, in its context, and recycled
                self.pools.append([driver.event() for _ in range(size)])
        self.origins: list = []
        self._origin_events: list = []
        self.host_origin = time.perf_counter()
        self.start_event: list = []
        self.end_event: list = []
        self.host_span: list[tuple[float, float]] = []

    def start(self, graph: ExecGraph, first_stream_of: list) -> None:
        """A new run of `graph`: one origin event per GPU (recorded on `first_stream_of[device]`), time 0 now.
        The origin events are made once and recorded again at each run (no stamp reads them across runs)."""
        if len(self._origin_events) != len(first_stream_of):
            self._origin_events = []
            for device in range(len(first_stream_of)):
                with self.driver.on(device):
                    self._origin_events.append(self.driver.event())
        self.origins = self._origin_events
        for device, stream in enumerate(first_stream_of):
            with self.driver.on(device):
                origin = self.origins[device]
                origin.record(stream)
                origin.synchronize()
        self.host_origin = time.perf_counter()
        count = len(graph)
        self.start_event = [None] * count
        self.end_event = [None] * count
        self.host_span = [(0.0, 0.0)] * count

    def now(self) -> float:
        return time.perf_counter() - self.host_origin

    def event(self, device: int):
        """A timing event of `device`, from its pool (made in the device's context when the pool runs dry)."""
        pool = self.pools[device]
        if pool:
            return pool.pop()
        with self.driver.on(device):
            return self.driver.event()

    def stamp(self, vertex: int, device: int) -> tuple[float, float]:
        """(start, end) of a finished vertex in seconds since its GPU's origin; its events go back to the pool."""
        start, end = self.start_event[vertex], self.end_event[vertex]
        began, ended = self.driver.span(self.origins[device], start, end, self.host_span[vertex])
        self.start_event[vertex] = self.end_event[vertex] = None
        self.pools[device].extend((start, end))
        return began, ended

    def close(self) -> None:
        self.pools, self.origins = [], []
        self.start_event = self.end_event = []

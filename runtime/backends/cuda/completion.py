"""How the event loop learns that work on a GPU stream finished: three notifiers behind one interface.

The backend calls `after(lane, stream, event)` right after it queued a vertex on a lane's stream (the
event is recorded just after the vertex), and the loop calls `wait()`, which blocks until at least one
lane reports progress and returns `{lane: finished count}`. Work on one stream finishes in order, so a
count is enough: the backend pops that many vertices off the lane's FIFO.

- `HostFuncNotifier`: a numba `cfunc` launched with the driver's `cuLaunchHostFunc` after each vertex.
  It runs on the driver's thread and never takes the GIL (so it cannot deadlock against a Python thread
  that waits on the driver, numba-cuda issue #317): it adds one to the lane's counter and writes to an
  `eventfd`, on which the loop blocks in `select` with the GIL released. A timeout lets the loop notice a
  failed stream (CUDA errors arrive late and stick) and Ctrl-C. Two placements of the host function:
  - `hostfunc` puts it on the lane's own stream, behind the vertex. Work queued after it on that stream
    waits until the driver's thread has run it: on the H200 that held each reload on the H2D engine
    until the previous one's host function ran (llama 7b at 8k and 2 GiB: 0.265 s against 0.242 s
    with `poll`).
  - `hostfunc-side` (the default on a GPU) puts it on a side stream per lane, which waits on the
    vertex's end event: the lane's stream never waits for the host, and the side stream keeps the
    lane's notices in order.
- `PollingNotifier`: the loop queries the end event of each lane's oldest unfinished vertex, spinning.
- `ThreadNotifier`: one thread per lane blocks in `cuEventSynchronize` on the lane's events, in order,
  and hands finished lanes to the loop through a queue.
- `ImmediateNotifier`: the CUDA simulator runs every launch synchronously, so work is done when queued.

docs/runtime.md and docs/benchmarks.md compare them on the H200 (latency per vertex, a 100,000-vertex
stress test, and llama and the FFN end to end).
"""

from __future__ import annotations

import ctypes
import os
import queue
import select
import threading
import time
from collections import deque

import numpy as np

from runtime.backends.cuda.compat import cuda, simulated, stream_handle

NOTIFIERS = ("hostfunc-side", "hostfunc", "poll", "thread")
DEFAULT_NOTIFIER = "hostfunc-side"
POLL_TIMEOUT = 0.5
"""Seconds the loop blocks before it checks the streams for errors (and lets Ctrl-C in)."""


class Notifier:
    def after(self, lane: int, stream, event) -> None:
        raise NotImplementedError

    def wait(self, timeout: float = POLL_TIMEOUT) -> dict[int, int]:
        """Finished counts per lane; empty when `timeout` passed with no progress."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class ImmediateNotifier(Notifier):
    def __init__(self, lanes: int):
        self.done: dict[int, int] = {}

    def after(self, lane, stream, event):
        self.done[lane] = self.done.get(lane, 0) + 1

    def wait(self, timeout=POLL_TIMEOUT):
        done, self.done = self.done, {}
        return done


class PollingNotifier(Notifier):
    def __init__(self, lanes: int):
        self.pending = [deque() for _ in range(lanes)]
        self.busy: set[int] = set()

    def after(self, lane, stream, event):
        self.pending[lane].append(event)
        self.busy.add(lane)

    def wait(self, timeout=POLL_TIMEOUT):
        deadline = time.perf_counter() + timeout
        while True:
            done = {}
            for lane in list(self.busy):
                events = self.pending[lane]
                count = 0
                while events and events[0].query():
                    events.popleft()
                    count += 1
                if count:
                    done[lane] = count
                if not events:
                    self.busy.discard(lane)
            if done or time.perf_counter() > deadline:
                return done


class ThreadNotifier(Notifier):
    def __init__(self, lanes: int):
        self.finished: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs = [queue.SimpleQueue() for _ in range(lanes)]
        self.threads = [threading.Thread(target=self._watch, args=(lane,), daemon=True, name=f"turnip lane {lane}") for lane in range(lanes)]
        self.contexts: list = [None] * lanes
        for thread in self.threads:
            thread.start()

    def _watch(self, lane: int) -> None:
        while True:
            event = self.jobs[lane].get()
            if event is None:
                return
            try:
                event.synchronize()
            except Exception:  # a failed stream: the loop's error check names the vertex
                pass
            self.finished.put(lane)

    def after(self, lane, stream, event):
        self.jobs[lane].put(event)

    def wait(self, timeout=POLL_TIMEOUT):
        done: dict[int, int] = {}
        try:
            lane = self.finished.get(timeout=timeout)
        except queue.Empty:
            return done
        while True:
            done[lane] = done.get(lane, 0) + 1
            try:
                lane = self.finished.get_nowait()
            except queue.Empty:
                return done

    def close(self):
        for jobs in self.jobs:
            jobs.put(None)
        for thread in self.threads:
            thread.join(timeout=5)


COUNT, FD, ONE, ONE_ADDRESS = range(4)
"""Fields of a lane's record, which the host function reads through its userData pointer."""


def _host_function():
    """The numba cfunc `void fn(void* record)`: record[COUNT] += 1, then write 8 bytes to the eventfd."""
    from numba import carray, cfunc, types

    libc = ctypes.CDLL(None, use_errno=False)
    write = libc.write
    write.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_size_t]  # the buffer pointer travels as an integer
    write.restype = ctypes.c_ssize_t

    @cfunc(types.void(types.voidptr), nopython=True)
    def notify(data):
        record = carray(data, 4, np.int64)
        record[COUNT] += 1
        write(record[FD], record[ONE_ADDRESS], 8)

    return notify


class HostFuncNotifier(Notifier):
    """`side_streams`: one stream per lane for the host functions (`hostfunc-side`); None puts each on
    the lane's own stream, behind its vertex (`hostfunc`)."""

    def __init__(self, lanes: int, side_streams: list | None = None):
        self.side_streams = side_streams
        self.fd = os.eventfd(0, os.EFD_CLOEXEC)
        self.records = np.zeros((lanes, 4), dtype=np.int64)
        self.records[:, FD] = self.fd
        self.records[:, ONE] = 1
        base = self.records.ctypes.data
        for lane in range(lanes):
            self.records[lane, ONE_ADDRESS] = base + (lane * 4 + ONE) * 8
        self.seen = np.zeros(lanes, dtype=np.int64)
        self.function = _host_function()
        self.address = self.function.address
        self.user_data = [base + lane * 4 * 8 for lane in range(lanes)]
        self.launch_host_func = None

    def _driver_entry(self):
        libcuda = ctypes.CDLL("libcuda.so.1")
        entry = libcuda.cuLaunchHostFunc
        entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        entry.restype = ctypes.c_int
        return entry

    def after(self, lane, stream, event):
        if self.launch_host_func is None:
            self.launch_host_func = self._driver_entry()
        if self.side_streams is not None:
            stream = self.side_streams[lane]
            event.wait(stream)
        status = self.launch_host_func(stream_handle(stream), self.address, self.user_data[lane])
        if status != 0:
            raise RuntimeError(f"cuLaunchHostFunc failed with CUresult {status}")

    def wait(self, timeout=POLL_TIMEOUT):
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            os.read(self.fd, 8)
        counts = self.records[:, COUNT].copy()
        moved = np.nonzero(counts != self.seen)[0]
        done = {int(lane): int(counts[lane] - self.seen[lane]) for lane in moved}
        self.seen = counts
        return done

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def make_notifier(kind: str, lane_devices: list[int]) -> Notifier:
    """The notifier `kind` for lanes on these GPUs (`lane_devices[lane]`); `hostfunc-side` makes its
    side streams here, each on its lane's GPU."""
    lanes = len(lane_devices)
    if simulated():
        return ImmediateNotifier(lanes)
    if kind == "hostfunc-side":
        side = []
        for device in lane_devices:
            with cuda.gpus[device]:
                side.append(cuda.stream())
        return HostFuncNotifier(lanes, side)
    if kind == "hostfunc":
        return HostFuncNotifier(lanes)
    if kind == "poll":
        return PollingNotifier(lanes)
    if kind == "thread":
        return ThreadNotifier(lanes)
    raise ValueError(f"unknown notifier '{kind}' (known: {', '.join(NOTIFIERS)})")

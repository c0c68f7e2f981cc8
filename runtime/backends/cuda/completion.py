"""How the event loop learns that work on a GPU stream finished: notifiers behind one interface, by name.

The backend calls `after(lane, stream, event)` right after it queued a vertex on a lane's stream (the
event is recorded just after the vertex), and the loop calls `wait()`, which blocks until at least one
lane reports progress and returns `{lane: finished count}`. Work on one stream finishes in order, so a
count is enough: the backend pops that many vertices off the lane's FIFO.

- `HostFuncNotifier`: a numba `cfunc` launched with the driver's `cuLaunchHostFunc` after each vertex.
  It runs on the driver's thread and never takes the GIL (so it cannot deadlock against a Python thread
  that waits on the driver, numba-cuda issue #317): it adds one to the lane's counter and writes to an
  `eventfd`, on which the loop blocks in `select` with the GIL released. A timeout lets the loop notice a
  failed stream (CUDA errors arrive late and stick) and Ctrl-C. `hostfunc-side`, the one registered
  here, puts it on a side stream per lane, which waits on the vertex's end event: the lane's stream never
  waits for the host, and the side stream keeps the lane's notices in order.
- `ImmediateNotifier`: the CUDA simulator runs every launch synchronously, so work is done when queued
  (the simulator's driver picks it, whatever the name).

`NOTIFIERS` maps a name to a factory; `register` adds one. The alternatives measured against the default
(the host function on the lane's own stream, polling, a waiter thread per lane) live in bench/notifiers.py,
which registers them for the benchmarks that compare them; docs/runtime.md ("Completions") gives the
figures.
"""

from __future__ import annotations

import ctypes
import os
import select
from collections.abc import Callable

import numpy as np

from runtime.backends.cuda.compat import cuda, driver_calls, stream_handle

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
    the lane's own stream, behind its vertex (bench/notifiers.py's `hostfunc`)."""

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

    def after(self, lane, stream, event):
        calls = driver_calls()
        if self.side_streams is not None:
            stream = self.side_streams[lane]
            calls.wait(stream_handle(stream), event.raw)
        calls.launch_host_func(stream_handle(stream), self.address, self.user_data[lane])

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


def side_stream_notifier(lane_devices: list[int]) -> HostFuncNotifier:
    """`hostfunc-side`: the host function on a side stream per lane, each made on its lane's GPU."""
    side = []
    for device in lane_devices:
        with cuda.gpus[device]:
            side.append(cuda.stream())
    return HostFuncNotifier(len(lane_devices), side)


NOTIFIERS: dict[str, Callable[[list[int]], Notifier]] = {DEFAULT_NOTIFIER: side_stream_notifier}
"""Notifier name -> factory(lane_devices), where `lane_devices[lane]` is the lane's GPU."""


def register(name: str, factory: Callable[[list[int]], Notifier]) -> None:
    """Make `CudaBackend(notifier=name)` use `factory` (bench/notifiers.py registers the alternatives)."""
    NOTIFIERS[name] = factory


def make_notifier(kind: str, lane_devices: list[int]) -> Notifier:
    """The notifier `kind` for lanes on these GPUs."""
    factory = NOTIFIERS.get(kind)
    if factory is None:
        raise ValueError(f"unknown notifier '{kind}' (known: {', '.join(NOTIFIERS)})")
    return factory(lane_devices)

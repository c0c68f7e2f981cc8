"""The completion notifiers measured against the cuda backend's default, kept for the benchmarks that compare them.

Importing this module registers them with runtime/backends/cuda/completion.py, so `CudaBackend(notifier=...)`
and `bench/run.py --notifier` take their names (bench/bench_cuda.py's `notifiers` section runs each):

- `hostfunc`: the default's host function queued on the lane's own stream, behind its vertex. Work queued
  after it on that stream waits until the driver's thread has run it, so each reload waited for the
  previous one's notice.
- `poll`: the loop queries the end event of each lane's oldest unfinished vertex, spinning.
- `thread`: one thread per lane blocks in `cuEventSynchronize` on the lane's events, in order, and hands
  finished lanes to the loop through a queue.

docs/runtime.md ("Completions") and docs/benchmarks.md ("The completion notifier off the lane's stream")
hold the figures.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runtime.backends.cuda.completion import POLL_TIMEOUT, HostFuncNotifier, Notifier, register  # noqa: E402


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


def in_stream_notifier(lane_devices: list[int]) -> HostFuncNotifier:
    return HostFuncNotifier(len(lane_devices))


register("hostfunc", in_stream_notifier)
register("poll", lambda lane_devices: PollingNotifier(len(lane_devices)))
register("thread", lambda lane_devices: ThreadNotifier(len(lane_devices)))

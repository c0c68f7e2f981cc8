"""Sampling each GPU's free memory while the loop runs (`CudaBackend(sample_memory=seconds)`).

A daemon thread reads every GPU's free memory each `period` seconds; `stop` joins it and reports the
largest drop from the free memory found when the devices were set up, per GPU and overall. The GPU test
asserts the drop stays within the budget.
"""

from __future__ import annotations

import threading
import time


class MemorySampler:
    """A thread that samples each GPU's free memory every `period` seconds until `stop`."""

    def __init__(self, driver, contexts: list, free_at_start: list[int], period: float):
        self.driver = driver
        self.contexts = contexts
        self.period = period
        self.free_at_start = list(free_at_start)
        self.lowest = list(free_at_start)
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True, name="turnip memory sampler")
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            for device, context in enumerate(self.contexts):
                with self.driver.on(device):
                    free = self.driver.free_memory(context)
                self.lowest[device] = min(self.lowest[device], free)
            time.sleep(self.period)

    def stop(self) -> dict:
        """Join the thread; the stats it adds: `peak_drop` (bytes, worst GPU) and `peak_drop_per_gpu`."""
        self.running = False
        self.thread.join(timeout=5)
        drops = [start - low for start, low in zip(self.free_at_start, self.lowest)]
        return {"peak_drop": max(drops, default=0), "peak_drop_per_gpu": drops}

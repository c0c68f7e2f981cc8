"""Thread pools made once a process, by name: a pool made and joined for each piece of work pays its
threads' starts every time, and each start waits for the GIL, which the main thread holds while it builds
and compiles (a 7b batch's KV cache page-locked buffer by buffer started 512 threads)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def shared_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The process's pool `name` ("turnip `name`" threads), made at the first ask with at most `workers`
    threads (and no more than the cores). Work in it must not wait for other work of the same pool."""
    with _LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(max(1, min(workers, os.cpu_count() or 1)), thread_name_prefix=f"turnip {name}")
        return pool

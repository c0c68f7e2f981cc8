"""Thread pools made once a process, by name: a pool made and joined for each piece of work pays its
threads' starts every time, and each start waits for the GIL, which the main thread holds while it builds
and compiles (a 7b batch's KV cache page-locked buffer by buffer started 512 threads). And the cores a
process may use: logical (`cores`) and physical (`physical_cores`: hyperthreads of one core counted once)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def cores() -> int:
    """The logical cores this process may run on (all the machine's where the system cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def physical_cores() -> int:
    """The physical cores among those this process may run on: logical cores that are hyperthreads of one
    core (Linux's `thread_siblings_list`) counted once; `cores()` where the system does not say."""
    if not hasattr(os, "sched_getaffinity"):
        return cores()
    allowed = os.sched_getaffinity(0)
    siblings = set()
    for cpu in allowed:
        try:
            text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            return cores()
        siblings.add(frozenset(_cpu_list(text)) & allowed or frozenset({cpu}))
    return max(1, len(siblings))


def _cpu_list(text: str) -> set[int]:
    """The CPUs of a Linux CPU list ("0-3,8,10-11")."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus

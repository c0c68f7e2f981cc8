"""Host memory a run allocates, sized by the plan and checked before anything is allocated.

A backend's host buffers are sized by what the plan uses, never by the budget: a GPU arena on the cpu
backend ends at the highest end of any location on that GPU, the storage buffer at the highest storage
end. Before allocating, the total is held against the memory the kernel reports available
(`MemAvailable`), and an allocation that fails anyway is refused in one line naming the bytes.
"""

from __future__ import annotations

import os

import numpy as np

from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.units import format_size


def arena_peaks(memgraph: MemGraph) -> list[int]:
    """Per GPU, the end of the highest location any node uses there (0 for a GPU no node uses)."""
    peaks = [0] * memgraph.devices
    for node in memgraph.nodes:
        if node.loc is not None and node.device is not None and node.device < len(peaks):
            peaks[node.device] = max(peaks[node.device], node.loc[0] + node.loc[1])
    return peaks


def available_bytes() -> int | None:
    """Host memory available to a new allocation, or None where the system does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_host_memory(needed: int, parts: str, fix: str, available: int | None = None) -> None:
    """Refuse a run whose host buffers (`parts` says which) need more than is available; `fix` says what to do."""
    available = available_bytes() if available is None else available
    if available is not None and needed > available:
        raise InputError(
            f"the run needs {needed} bytes ({format_size(needed)}) of host memory for {parts}, "
            f"but only {available} bytes ({format_size(available)}) are available: {fix}"
        )


def zeros(nbytes: int, what: str) -> np.ndarray:
    """A zeroed byte buffer, or a one-line InputError naming `what` and the bytes it could not get."""
    try:
        return np.zeros(nbytes, dtype=np.uint8)
    except (MemoryError, ValueError):
        raise InputError(f"cannot allocate {nbytes} bytes ({format_size(nbytes)}) of host memory for {what}") from None

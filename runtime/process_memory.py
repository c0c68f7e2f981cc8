"""This process's device memory as the driver reports it: NVML's per-process figure, what nvidia-smi shows.

`--memory` bounds what the process holds on each GPU beyond the CUDA context (arena, workspace, library and
allocator memory, inputs kept across runs), so the runs report what the driver says the process holds, not
only what the plan asked for. `ProcessMemory` reads NVML through ctypes (libnvidia-ml.so.1, which every
NVIDIA driver installs; no Python package) and keeps, per GPU, the largest figure a daemon thread sampled
since `reset`; `context_bytes` is the figure before anything is allocated (the CUDA context and the
modules the driver loaded). Where NVML cannot say (no driver: numba's simulator; a sandbox that hides
processes), every figure is None and nothing is reported.

CUDA device i is NVML device i, or the i-th index named in CUDA_VISIBLE_DEVICES when it lists indices.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

PERIOD = 0.02
"""Seconds between samples: a 7b decode step takes 0.5 s, a prefill's arena fills in well under a second."""


class _ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class _Nvml:
    """The few NVML calls used: a handle per device and the compute processes on it."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.query = next((getattr(self.lib, name) for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                                                                  "nvmlDeviceGetComputeRunningProcesses_v2")
                           if hasattr(self.lib, name)), None)
        if self.query is None:
            raise OSError("NVML has no per-process query")

    def handle(self, index: int) -> ctypes.c_void_p:
        if index not in self.handles:
            handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                raise OSError(f"no NVML device {index}")
            self.handles[index] = handle
        return self.handles[index]

    def used_by(self, index: int, pid: int) -> int | None:
        """Bytes process `pid` holds on NVML device `index`, or None when NVML does not list it."""
        count = ctypes.c_uint(256)
        infos = (_ProcessInfo * 256)()
        if self.query(self.handle(index), ctypes.byref(count), infos) != 0:
            return None
        used = [infos[i].usedGpuMemory for i in range(count.value) if infos[i].pid == pid]
        return sum(used) if used else None


def _nvml_index(device: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    names = [name.strip() for name in visible.split(",") if name.strip()]
    if names and all(name.isdigit() for name in names) and device < len(names):
        return int(names[device])
    return device


class ProcessMemory:
    """Per GPU, the device bytes this process holds now and the most since `reset` (a sampling thread)."""

    def __init__(self, devices: int, period: float = PERIOD):
        self.devices, self.period = devices, period
        self.pid = os.getpid()
        try:
            self.nvml: _Nvml | None = _Nvml()
        except (OSError, AttributeError):
            self.nvml = None
        now = self.now()
        self.context_bytes = now
        """The first reading (made before the caller allocates: the CUDA context and the driver's modules)."""
        self.peaks = list(now)
        self._lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None
        if self.available:
            self._thread = threading.Thread(target=self._sample, daemon=True, name="turnip device memory")
            self._thread.start()

    @property
    def available(self) -> bool:
        return self.nvml is not None and all(value is not None for value in self.context_bytes)

    def now(self) -> list[int | None]:
        if self.nvml is None:
            return [None] * self.devices
        try:
            return [self.nvml.used_by(_nvml_index(device), self.pid) for device in range(self.devices)]
        except OSError:
            return [None] * self.devices

    def _sample(self) -> None:
        while not self._stopped:
            self._take(self.now())
            time.sleep(self.period)

    def _take(self, now: list[int | None]) -> list[int | None]:
        """Fold a reading into the peaks; the peaks."""
        with self._lock:
            self.peaks = [p if n is None else n if p is None else max(p, n) for p, n in zip(self.peaks, now)]
            return list(self.peaks)

    def stop(self) -> None:
        """End the sampling thread (a monitor replaced by one over more GPUs)."""
        self._stopped = True

    def reset(self) -> None:
        """Start a new peak from what is held now."""
        now = self.now()
        with self._lock:
            self.peaks = now

    def peak(self) -> list[int | None]:
        """The most held per GPU since `reset`, this moment's reading included."""
        return self._take(self.now())


_MONITOR: ProcessMemory | None = None


def monitor(devices: int) -> ProcessMemory:
    """The process's one monitor, made at the first call (before the caller's first allocation on a GPU it
    sets up, so that `context_bytes` is the context alone), over `devices` GPUs or more."""
    global _MONITOR
    if _MONITOR is None or _MONITOR.devices < devices:
        if _MONITOR is not None:
            _MONITOR.stop()
        _MONITOR = ProcessMemory(devices)
    return _MONITOR


def current() -> ProcessMemory | None:
    """The monitor, if a cuda backend made one in this process."""
    return _MONITOR

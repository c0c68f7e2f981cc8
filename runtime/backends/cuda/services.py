"""What a kernel builder may ask of the backend: the `KernelEnv` protocol, and `KernelServices`, which serves it.

A builder (runtime/backends/cuda/builders.py, attention.py) turns one vertex into `work(lane)` when the
backend prepares a memgraph. Everything it needs beside its operands comes through the `env` it is given,
and nothing else: the attention provider chosen, whether vector loads are allowed, how to prepare a launch
and on which stream to launch it, device-to-device copies, GEMMs and einsums (cuBLAS and CuPy on a GPU, numpy under the simulator),
the lane's scratch, torch's view of the lane's stream, the GPU a node is on, and a `BuildCache` of what
depends only on a vertex's shape and dtype (GEMM plans, attention plans, compiled launches), made once
per distinct shape rather than once per vertex (a 7B prefill has 96 attention vertices of a few
shapes, thousands of GEMMs of a dozen). `KernelServices` answers
from the driver (runtime/backends/cuda/driver.py), the device set-up (devices.py) and the libraries'
per-lane state (libraries.py).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import Protocol

from runtime.backends.cuda.devices import DeviceSet
from runtime.backends.cuda.driver import GpuDriver
from runtime.backends.cuda.libraries import Libraries

Work = Callable[[int], None]
"""A vertex's launch: `work(lane)` queues its kernels on the lane's stream."""

Launch = Callable[[object], None]
"""A prepared kernel launch: `go(stream)`, taking one of `KernelEnv.launch_streams`."""


class BuildCache:
    """What builders make once per distinct key (shape, dtype, flags), kept for the backend's life (across
    loads); `builds` counts what was made, per kind: the test of "once per shape" reads it."""

    def __init__(self):
        self.entries: dict = {}
        self.builds: Counter = Counter()

    def get(self, kind: str, key: Hashable, make: Callable[[], object]):
        """The `kind` entry for `key`, made by `make()` the first time it is asked for."""
        full = (kind, key)
        if full not in self.entries:
            self.entries[full] = make()
            self.builds[kind] += 1
        return self.entries[full]


class KernelEnv(Protocol):
    """The services the kernel builders rely on; `lane` is a lane index of runtime/graph.py."""

    attention: str
    """The resolved attention provider (attention.py)."""
    vector_loads: bool
    """Whether kernels may read and write by quads with vector instructions (`vector.load4`)."""
    launch_streams: list
    """Per lane, the stream a prepared launch takes."""
    cache: BuildCache
    """Plans and compiled launches by shape and dtype, shared by every vertex that has them."""

    def launch(self, kernel, griddim, blockdim, args: tuple, shared: int = 0) -> Launch:
        """`go(stream)` launching `kernel` with `args`; compiled now, not at the first launch."""

    def gemm(self, plan, a, b, out, alpha: float = 1.0, offsets: tuple[int, int] = (0, 0), beta: float = 0.0) -> Work:
        """A GEMM plan (gemm.py) on device views, out = alpha a·b + beta out; `offsets` in elements into a and b."""

    def einsum(self, equation: str, inputs: list, out) -> Work:
        """An einsum that is no GEMM, its temporaries in the lane's scratch."""

    def copy(self, source, target) -> Work:
        """A device-to-device copy of `source` into `target` (contiguous views of one GPU's arena) on the lane's stream."""

    def scratch(self, lane: int):
        """The lane's slice of its GPU's workspace (uint8 device array), free for one vertex at a time."""

    def torch_stream(self, lane: int):
        """torch's view of the lane's stream (torch providers only)."""

    def attention_stream(self, device: int):
        """The GPU's one stream for torch's attention (libraries.AttentionStream; torch providers only; None with TURNIP_ATTENTION_STREAM=lane)."""

    def grad_share(self, device: int):
        """The GPU's last fused attention backward, kept for its pair's other link (attention_grad.GradShare)."""

    def device_of(self, node) -> int:
        """The GPU a memgraph node lives on."""


class KernelServices:
    """`KernelEnv` for one prepared backend."""

    def __init__(self, driver: GpuDriver, devices: DeviceSet, libraries: Libraries, attention: str):
        self.driver = driver
        self.devices = devices
        self.libraries = libraries
        self.attention = attention
        self.vector_loads = driver.vector_loads
        self.launch_streams = devices.launch_streams
        self.cache = BuildCache()
        self.grad_shares: dict[int, object] = {}
        """Per GPU, its attention stream's last fused backward (attention_grad.GradShare)."""

    def launch(self, kernel, griddim, blockdim, args: tuple, shared: int = 0) -> Launch:
        return self.driver.prepare_launch(kernel, griddim, blockdim, args, shared)

    def gemm(self, plan, a, b, out, alpha: float = 1.0, offsets: tuple[int, int] = (0, 0), beta: float = 0.0) -> Work:
        return self.driver.gemm(plan, a, b, out, self, alpha, offsets, beta)

    def einsum(self, equation: str, inputs: list, out) -> Work:
        return self.driver.einsum(equation, inputs, out, self)

    def copy(self, source, target) -> Work:
        return self.driver.copy("peer", source, target, self.devices.streams)

    def scratch(self, lane: int):
        return self.devices.scratch(lane)

    def torch_stream(self, lane: int):
        return self.libraries.torch_streams[lane]

    def attention_stream(self, device: int):
        return self.libraries.attention_stream(device)

    def device_of(self, node) -> int:
        return node.device

    def grad_share(self, device: int):
        """The GPU's `attention_grad.GradShare`, made on first use."""
        from runtime.backends.cuda.attention_grad import GradShare, sharing

        if device not in self.grad_shares:
            self.grad_shares[device] = GradShare(sharing())
        return self.grad_shares[device]

    def cublas(self, lane: int) -> int:
        """cuBLAS's handle for the lane's GPU, with CuPy's current stream set to the lane's stream."""
        return self.libraries.cublas(lane, self.devices.lane_device[lane])

    @contextlib.contextmanager
    def cupy_scratch(self, lane: int) -> Iterator[None]:
        """Let CuPy allocate from the lane's scratch (bump allocation, reset per vertex)."""
        allocator = self.libraries.allocator
        allocator.open(self.scratch(lane))
        try:
            yield
        finally:
            allocator.close()

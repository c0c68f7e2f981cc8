"""The libraries' per-process state for a prepared backend: warmed up once, detached at close.

On a GPU, `Libraries.open` takes CuPy's cuBLAS handle per GPU, CuPy's (and, for torch providers, torch's)
view of every lane's stream, runs one small GEMM per compute lane (so cuBLAS makes its workspace pool on
that stream now, not in the loop) and installs `LaneAllocator` (lanes.py) as CuPy's allocator. For torch
providers it also makes one attention stream per GPU (`attention_stream`): torch's fused attention runs
there whatever the lane, so torch's caching allocator, which keeps the blocks it hands out per stream,
holds one set of attention blocks per GPU rather than one per compute lane (36 MiB a lane at 7b's
4096-token blocks, given back to the arena: devices.library_allowance). Under the
simulator there are no libraries: `Libraries()` holds empty lists and every method has nothing to do.
`detach` points CuPy's handles and current stream back at the default stream and has torch forget the
cuBLAS workspaces it keyed by stream: a later run's new stream may get a destroyed one's address, and a
handle still bound to it is stale state. `close` gives CuPy its own allocator back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from runtime.backends.cuda.attention import shared_stream
from runtime.backends.cuda.compat import cuda, stream_handle
from runtime.backends.cuda.lanes import LaneAllocator


@dataclass(frozen=True)
class AttentionStream:
    """A GPU's one stream for torch's attention: numba's stream, torch's view of it, the cuda.core stream
    the merge launches on, and two events to hand work over with (`enter` after the lane's work so far,
    `leave` after the attention's; the host records and waits on each at once, so two serve every lane)."""

    stream: object
    torch: object
    launch: object
    enter: object
    leave: object

    def run(self, lane_stream, work) -> None:
        """`work()` on this stream after everything queued on `lane_stream` (torch's view) so far; the lane's
        later work waits for it."""
        import torch

        self.enter.record(lane_stream)
        self.torch.wait_event(self.enter)
        with torch.cuda.stream(self.torch):
            work()
        self.leave.record(self.torch)
        lane_stream.wait_event(self.leave)


class Libraries:
    """cuBLAS handles per GPU, CuPy and torch streams per lane, and CuPy's allocator while prepared."""

    def __init__(self):
        self.allocator = LaneAllocator()
        self.cublas_handles: list[int] = []
        self.cupy_streams: list = []
        self.torch_streams: list = []
        self.attention_streams: list = []
        """Per GPU, the stream torch's attention runs on (torch providers only)."""
        self.installed = False
        """Whether `allocator` is CuPy's allocator (on a GPU, from `open` to `close`)."""

    @classmethod
    def open(cls, driver, devices, lanes: list, with_torch: bool) -> "Libraries":
        """Warm CuPy and cuBLAS up on every lane's stream (and wrap the streams for torch); GPU only."""
        import cupy
        from cupy.cuda import device as cupy_device

        libraries = cls()
        lane_device = devices.lane_device
        for device in range(devices.devices):
            with driver.on(device), cupy.cuda.Device(device):
                libraries.cublas_handles.append(cupy_device.get_cublas_handle())
        libraries.cupy_streams = [_cupy_stream(cupy, s, lane_device[i]) for i, s in enumerate(devices.streams)]
        if with_torch:
            import torch

            libraries.torch_streams = [torch.cuda.ExternalStream(stream_handle(s), device=torch.device("cuda", lane_device[i]))
                                       for i, s in enumerate(devices.streams)]
            for device in range(devices.devices if shared_stream() else 0):
                with driver.on(device):
                    stream = cuda.stream()
                libraries.attention_streams.append(AttentionStream(
                    stream, torch.cuda.ExternalStream(stream_handle(stream), device=torch.device("cuda", device)), driver.launch_stream(stream),
                    torch.cuda.Event(), torch.cuda.Event()))
        libraries._probe_gemms(driver, devices, lanes)
        cupy.cuda.set_allocator(libraries.allocator)
        libraries.installed = True
        return libraries

    def _probe_gemms(self, driver, devices, lanes: list) -> None:
        """One small GEMM per compute lane's stream: cuBLAS makes its workspace pool there now."""
        import cupy

        for lane in lanes:
            if lane.kind != "compute":
                continue
            with driver.on(lane.device), cupy.cuda.Device(lane.device):
                self.cupy_streams[lane.index].use()
                probe = cupy.zeros((16, 16), dtype=cupy.float16)
                cupy.matmul(probe, probe)
                devices.streams[lane.index].synchronize()
        devices.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()

    def cublas(self, lane: int, device: int) -> int:
        """cuBLAS's handle for `device`, with CuPy's current stream set to the lane's stream."""
        self.cupy_streams[lane].use()
        return self.cublas_handles[device]

    def attention_stream(self, device: int) -> "AttentionStream | None":
        return self.attention_streams[device] if self.attention_streams else None

    def detach(self, driver) -> None:
        """Point the libraries' per-process state away from the run's streams before they are destroyed."""
        if self.cublas_handles:
            import cupy
            from cupy_backends.cuda.libs import cublas

            for device, handle in enumerate(self.cublas_handles):
                with contextlib.suppress(Exception), driver.on(device), cupy.cuda.Device(device):
                    cublas.setStream(handle, 0)
                    cupy.cuda.Stream.null.use()
        if self.torch_streams:
            import torch

            with contextlib.suppress(Exception):
                torch._C._cuda_clearCublasWorkspaces()

    def close(self) -> None:
        """Give CuPy its own allocator back and drop the stream views."""
        if self.installed:
            import cupy

            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
            self.installed = False
        self.cupy_streams, self.torch_streams, self.attention_streams = [], [], []


def _cupy_stream(cupy, stream, device: int):
    """CuPy's view of a numba stream: `Stream.from_external` (CuPy 14+), else the older ExternalStream."""
    make = getattr(cupy.cuda.Stream, "from_external", None)
    if make is not None:
        with cupy.cuda.Device(device):
            return make(stream)
    return cupy.cuda.ExternalStream(stream_handle(stream), device)

"""The driver layer: every call that differs between a GPU and numba's CUDA simulator, behind one interface.

`make_driver()` picks the implementation once, when a backend is constructed (as tinygrad swaps its mock
GPU in at one import): `GpuDriver` talks to the CUDA driver, CuPy and cuda.core; `SimDriver` is what the
simulator can do (kernels, streams and device arrays work, but events carry no time, there are no stream
handles, no peers, no cuBLAS, and every launch runs synchronously on the host, so numpy stands in for
cuBLAS and CuPy). Callers never ask which one they have: a method returns the right thing or nothing.

Kernel-level choices fixed when kernels compile (thread counts in `kernels_numba`, the scalar
`vector.load4`, `compat.device()`) are made at import, where the kernels are; compat.py lists them.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import threading

import numpy as np

from runtime.backends.cuda import attention, completion
from runtime.backends.cuda.bfloat16 import narrow, widen
from runtime.backends.cuda.compat import cuda, driver_calls, require_gpus, simulated, stream_handle
from runtime.backends.cuda.gemm import cublas_call, numpy_gemm
from runtime.backends.cuda.launch import prepare_launch
from runtime.backends.cuda.libraries import Libraries
from runtime.backends.cuda.memory import device_pointer, dtype_name, pinned_bytes
from runtime.residency import refreshed, row_length

PEERS_ENABLED: set[tuple[int, int]] = set()
"""Peer access is per process: enabled once for each ordered pair of GPUs."""


class GpuDriver:
    """The CUDA driver through numba-cuda, CuPy (cuBLAS, the runtime's device) and cuda.core (launches)."""

    vector_loads = True
    """Whether kernels may read and write by quads with vector instructions (`vector.load4`)."""

    def require_gpus(self, count: int) -> None:
        require_gpus(count)

    def on(self, device: int):
        """Make `device`'s context current for the block (numba's `cuda.gpus[device]`)."""
        return cuda.gpus[device]

    def free_memory(self, context) -> int:
        return int(context.get_memory_info()[0])

    def event(self):
        """An event that records time on the current GPU (`raw`: its handle as an integer)."""
        event = cuda.event(timing=True)
        event.raw = int(event.handle)
        return event

    def record(self, event, stream) -> None:
        """Record `event` on `stream` (compat.DriverCalls: no numba wrapper on the per-vertex path)."""
        driver_calls().record(event.raw, stream_handle(stream))

    def wait_event(self, stream, event) -> None:
        """Make `stream` wait for `event`."""
        driver_calls().wait(stream_handle(stream), event.raw)

    def span(self, origin, start, end, host_span: tuple[float, float]) -> tuple[float, float]:
        """Seconds from `origin` to the `start` and `end` events, all recorded on one GPU."""
        calls = driver_calls()
        return calls.elapsed(origin.raw, start.raw) * 1e-3, calls.elapsed(origin.raw, end.raw) * 1e-3

    def runtime_device(self) -> int | None:
        """CUDA's current device for this thread (CuPy's view), or None without CuPy."""
        try:
            import cupy

            return int(cupy.cuda.runtime.getDevice())
        except Exception:
            return None

    def enable_peers(self, contexts: list) -> None:
        """Let every GPU read every other's memory (peer copies, pulled by the destination)."""
        if len(contexts) < 2:
            return
        from numba.cuda.cudadrv.driver import CudaAPIError, driver

        for a, context in enumerate(contexts):
            with self.on(a):
                for b, other in enumerate(contexts):
                    if a != b and (a, b) not in PEERS_ENABLED and context.can_access_peer(other.device.id):
                        try:
                            driver.cuCtxEnablePeerAccess(other.handle, 0)
                        except CudaAPIError:
                            pass  # enabled by another library in this process
                        PEERS_ENABLED.add((a, b))

    def switch(self, context, device: int, with_cupy: bool) -> None:
        """Make `device` current for the launches that follow: its (primary) context for the driver, numba
        and cuda.core, and (`with_cupy`) the runtime's device for CuPy and cuBLAS."""
        from numba.cuda.cudadrv.driver import driver

        driver.cuCtxSetCurrent(context.handle)
        if with_cupy:
            import cupy

            cupy.cuda.runtime.setDevice(device)

    def restore_device(self, device: int) -> None:
        import cupy

        with contextlib.suppress(Exception):
            cupy.cuda.runtime.setDevice(device)

    def pointer(self, array) -> int | None:
        """A device array's address, for `put` and `copy` to take instead of finding it again (None: find it then)."""
        return device_pointer(array)

    def stream_handles(self, streams: list) -> list | None:
        """The streams' driver handles, for `copy` to take instead of finding them again."""
        return [stream_handle(stream) for stream in streams]

    def copy(self, kind: str, source, target, streams: list, count: int | None = None, source_pointer: int | None = None,
             handles: list | None = None):
        """`work(lane)`: one async driver call copying `source` to `target` (their first `count` bytes:
        whole leading rows), pointers resolved now; a d2h copy may be given its source's device address
        (`pointer`) and `stream_handles(streams)`, found before."""
        from numba.cuda.cudadrv.driver import driver

        count = target.nbytes if count is None else count
        handles = self.stream_handles(streams) if handles is None else handles
        calls = driver_calls()  # the host copies through ctypes, as `put` and `get` make them
        if kind == "h2d":
            call, dst, src = calls.copy_h2d, device_pointer(target), source.ctypes.data
        elif kind == "d2h":
            call, dst, src = calls.copy_d2h, target.ctypes.data, device_pointer(source) if source_pointer is None else source_pointer
        else:
            call, dst, src = driver.cuMemcpyAsync, device_pointer(target), device_pointer(source)
        return lambda lane: call(dst, src, count, handles[lane])

    def copy_rows(self, source, pieces: list, streams: list, source_pointer: int | None = None, handles: list | None = None):
        """`work(lane)`: rows of the device array `source` into host views, one async 2-D driver copy
        (cuMemcpy2DAsync) per piece (start, stop, view) copying rows [start, stop) into `view`, whose rows
        are contiguous and `row_pitch(view)` bytes apart; pointers resolved now, as `copy`'s are. Into
        pageable memory the copy is made all the same, but returns only once done (the driver's rule)."""
        calls = driver_calls()
        handles = self.stream_handles(streams) if handles is None else handles
        base = device_pointer(source) if source_pointer is None else source_pointer
        row = source.nbytes // source.shape[0]
        params = [calls.rows_d2h(view.ctypes.data, row_pitch(view), base + start * row, row, stop - start)
                  for start, stop, view in pieces if stop > start and row]

        def work(lane):
            for copy in params:
                calls.copy_2d(copy, handles[lane])

        return work

    def host_pinned(self, array: np.ndarray) -> bool:
        """Whether the copy engines may read `array` (C-contiguous) where it is: its first and last bytes lie
        in page-locked memory (an allocation or registration is one range)."""
        from numba.cuda.cudadrv.devices import get_context

        get_context()  # the driver answers only once initialized (a session may ask before its backend exists)
        calls = driver_calls()
        start = array.ctypes.data
        return array.nbytes > 0 and calls.host_pinned(start) and calls.host_pinned(start + array.nbytes - 1)

    def put(self, copies: list, wait: bool = True) -> None:
        """Host arrays onto device arrays, between runs: each copy is (device, target, source, rows[,
        pointer]), source a C-contiguous host array of target's bytes, rows None (all of it) or (start,
        stop) ranges of flat rows (runtime/residency.py), pointer target's address when the caller has it
        (`pointer`). One async driver call per range on each GPU's null stream, pointers
        computed here (no device-array slicing), then one wait per GPU: a decode step's few dozen small
        copies cost microseconds each, where numba's copy_to_device costs a slice and a sync apiece.
        `wait=False` returns without the wait: the copies are on the legacy default stream, which every
        stream of ours (made blocking) waits for before its next work, so the run's first kernels start
        after them; the sources must stay as they are until then (a pageable one is read before the
        call returns, the driver's rule)."""
        from numba.cuda.cudadrv.driver import driver

        calls = driver_calls()
        for device, group in _by_device(copies).items():
            with self.on(device):
                for _, target, source, rows, *pointer in group:
                    dst, src = pointer[0] if pointer and pointer[0] is not None else device_pointer(target), source.ctypes.data
                    for start, stop in _byte_ranges(source, rows):
                        calls.copy_h2d(dst + start, src + start, stop - start, None)
                if wait:
                    driver.cuCtxSynchronize()

    def get(self, copies: list) -> None:
        """Device arrays into host arrays of the same bytes, (device, source, target) each, then one wait per GPU."""
        from numba.cuda.cudadrv.driver import driver

        calls = driver_calls()
        for device, group in _by_device(copies).items():
            with self.on(device):
                for _, source, target in group:
                    calls.copy_d2h(target.ctypes.data, device_pointer(source), target.nbytes, None)
                driver.cuCtxSynchronize()

    def stream_failure(self, stream) -> Exception | None:
        """The sticky CUDA error a stream query reports, or None while the stream runs or is done."""
        from numba.cuda.cudadrv.driver import CudaAPIError, driver

        try:
            driver.cuStreamQuery(stream_handle(stream))
        except CudaAPIError as err:
            if getattr(err, "code", None) == 600:  # CUDA_ERROR_NOT_READY: still running
                return None
            return err
        return None

    def launch_stream(self, stream):
        """What prepared launches take: a cuda.core stream made once from the numba stream's handle."""
        from cuda.core import Stream

        return Stream.from_handle(stream_handle(stream))

    def prepare_launch(self, kernel, griddim, blockdim, args: tuple, shared: int = 0):
        return prepare_launch(kernel, griddim, blockdim, args, shared)

    def pinned(self, count: int) -> np.ndarray:
        return pinned_bytes(count)

    def register_mapping(self, mapping: np.ndarray) -> bool:
        """Page-lock a read-only file map (a uint8 array over the whole map, page-aligned) in place, so the
        copy engines read the file's pages where the page cache holds them; False where the driver
        refuses (then its tensors are staged as before). The whole pages it spans are registered."""
        from numba.cuda.cudadrv.devices import get_context

        get_context()
        page = mmap.PAGESIZE
        count = -(-mapping.nbytes // page) * page
        return driver_calls().register_read_only(mapping.ctypes.data, count) == 0

    def unregister_mapping(self, mapping: np.ndarray) -> None:
        driver_calls().unregister(mapping.ctypes.data)

    def notifier(self, kind: str, lane_devices: list[int]) -> completion.Notifier:
        return completion.make_notifier(kind, lane_devices)

    def resolve_attention(self, provider: str) -> str:
        return attention.resolve(provider, on_gpu=True)

    def attention_candidates(self) -> tuple[str, ...]:
        return attention.auto_candidates(on_gpu=True)

    def open_libraries(self, devices, lanes: list, with_torch: bool) -> Libraries:
        """CuPy, cuBLAS (and torch's streams) warmed up on every lane (libraries.py)."""
        return Libraries.open(self, devices, lanes, with_torch)

    def gemm(self, plan, a, b, out, services, alpha: float = 1.0, offsets: tuple[int, int] = (0, 0), beta: float = 0.0):
        """`work(lane)`: one cuBLAS call of `plan` on the lane's handle; `offsets` in elements into a and b
        (of one dtype; out's may be float32 beside half operands)."""
        assert dtype_name(a) == dtype_name(b), "GEMM operands of two dtypes"
        a_ptr = device_pointer(a) + offsets[0] * a.dtype.itemsize
        b_ptr = device_pointer(b) + offsets[1] * b.dtype.itemsize
        call = cublas_call(plan, a_ptr, b_ptr, device_pointer(out), dtype_name(out), alpha=alpha, beta=beta, in_dtype=dtype_name(a))
        return lambda lane: call(services.cublas(lane))

    def einsum(self, equation: str, inputs, out, services):
        """`work(lane)`: cupy.einsum into the lane's scratch (its temporaries too), then a copy into the arena."""

        def work(lane):
            import cupy

            with services.cupy_scratch(lane):
                cupy.asarray(out)[...] = _einsum(cupy, equation, [cupy.asarray(x) for x in inputs], dtype_name(out))

        return work

    def collect(self, contexts: list) -> None:
        """Have numba free what the run dropped now, while every context is alive, not from finalizers at exit:
        both of a context's queues, its own (streams, events, modules) and its memory manager's (device
        memory: numba defers those frees until a fifth of the GPU is pending, so a dropped arena's would
        wait for ever; clearing the context's queue alone never freed one)."""
        gc.collect()
        for device, context in enumerate(contexts):
            with contextlib.suppress(Exception), self.on(device):
                for queue in pending_queues(context):
                    queue.clear()


class SimDriver(GpuDriver):
    """numba's CUDA simulator: one host-side GPU that every device maps to, numpy in place of the libraries."""

    vector_loads = False

    def require_gpus(self, count: int) -> None:
        pass  # every device is the one simulated GPU

    def on(self, device: int):
        return contextlib.nullcontext()

    def free_memory(self, context) -> int:
        return 0

    def event(self):
        return cuda.event()

    def record(self, event, stream) -> None:
        event.record(stream)

    def wait_event(self, stream, event) -> None:
        event.wait(stream)

    def span(self, origin, start, end, host_span: tuple[float, float]) -> tuple[float, float]:
        return host_span  # simulated events carry no time; launches ran synchronously within host_span

    def runtime_device(self) -> int | None:
        return None

    def enable_peers(self, contexts: list) -> None:
        pass

    def switch(self, context, device: int, with_cupy: bool) -> None:
        pass

    def restore_device(self, device: int) -> None:
        pass

    def stream_handles(self, streams: list) -> list | None:
        return None

    def copy(self, kind: str, source, target, streams: list, count: int | None = None, source_pointer: int | None = None,
             handles: list | None = None):
        if count is not None:  # whole leading rows
            rows = count // (target.nbytes // target.shape[0])
            source, target = source[:rows], target[:rows]
        if kind == "d2h":  # host views of bfloat16 are ml_dtypes' type, device views uint16: copy the bytes
            return lambda lane: source.copy_to_host(target.view(source.dtype))
        return lambda lane: target.copy_to_device(source.view(target.dtype))

    def copy_rows(self, source, pieces: list, streams: list, source_pointer: int | None = None, handles: list | None = None):
        rows = host(source)
        pairs = [(view.view(rows.dtype), rows[start:stop]) for start, stop, view in pieces if stop > start]  # bfloat16: its words

        def work(lane):
            for target, part in pairs:
                np.copyto(target, part)

        return work

    def host_pinned(self, array: np.ndarray) -> bool:
        return array.nbytes > 0  # the simulator's copies read any host memory

    def pointer(self, array) -> int | None:
        return None  # the simulator's copies take the arrays

    def put(self, copies: list, wait: bool = True) -> None:
        for _, target, source, rows, *_ in copies:
            pairs = [(target, source)] if rows is None else refreshed(target, source, rows)
            for device_part, host_part in pairs:
                device_part.copy_to_device(host_part.view(device_part.dtype))  # bfloat16: its uint16 words

    def get(self, copies: list) -> None:
        for _, source, target in copies:
            target[...] = source.copy_to_host().view(target.dtype)

    def stream_failure(self, stream) -> Exception | None:
        return None  # launches run synchronously: a failure raised in submit

    def launch_stream(self, stream):
        return stream

    def prepare_launch(self, kernel, griddim, blockdim, args: tuple, shared: int = 0):
        return lambda stream: kernel[griddim, blockdim, stream, shared](*args)

    def pinned(self, count: int) -> np.ndarray:
        return cuda.pinned_array(max(count, 1), dtype=np.uint8)

    def register_mapping(self, mapping: np.ndarray) -> bool:
        return mapping.nbytes > 0  # the simulator's copies read any host memory

    def unregister_mapping(self, mapping: np.ndarray) -> None:
        pass

    def notifier(self, kind: str, lane_devices: list[int]) -> completion.Notifier:
        return completion.ImmediateNotifier(len(lane_devices))

    def resolve_attention(self, provider: str) -> str:
        return attention.resolve(provider, on_gpu=False)

    def attention_candidates(self) -> tuple[str, ...]:
        return attention.auto_candidates(on_gpu=False)

    def open_libraries(self, devices, lanes: list, with_torch: bool) -> Libraries:
        return Libraries()  # no CuPy, cuBLAS or torch under the simulator

    def gemm(self, plan, a, b, out, services, alpha: float = 1.0, offsets: tuple[int, int] = (0, 0), beta: float = 0.0):
        a_host, b_host, out_host = host(a).reshape(-1)[offsets[0]:], host(b).reshape(-1)[offsets[1]:], host(out)
        return lambda lane: numpy_gemm(plan, a_host, b_host, out_host, alpha=alpha, beta=beta)

    def einsum(self, equation: str, inputs, out, services):
        hosts = [host(x) for x in inputs]
        target = host(out)
        return lambda lane: np.copyto(target, _einsum(np, equation, hosts, dtype_name(out)))

    def collect(self, contexts: list) -> None:
        pass


def pending_queues(context) -> list:
    """numba's queues of deferred frees of `context`: its own and its memory manager's (which device memory
    allocations go to), where each exists."""
    queues = [getattr(context, "deallocations", None), getattr(getattr(context, "memory_manager", None), "deallocations", None)]
    return [queue for queue in queues if queue is not None]


def _einsum(xp, equation: str, operands: list, dtype: str):
    """`xp.einsum` (numpy or CuPy); bfloat16 words are widened to float32 and the result rounded back."""
    if dtype != "bfloat16":
        return xp.einsum(equation, *operands)
    return narrow(xp, xp.einsum(equation, *(widen(xp, x) for x in operands)))


def row_pitch(view: np.ndarray) -> int:
    """The bytes from one row of `view` to the next (a 2-D copy's pitch): its first stride, or a row's
    bytes where it has one row (whose stride may be anything)."""
    return view.strides[0] if view.shape[0] > 1 else view[:1].nbytes


def _by_device(copies: list) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for copy in copies:
        grouped.setdefault(copy[0], []).append(copy)
    return grouped


def _byte_ranges(source: np.ndarray, rows) -> list[tuple[int, int]]:
    """(start, stop) byte offsets of the flat rows `rows` of `source` (all of it when None)."""
    if rows is None:
        return [(0, source.nbytes)]
    row = row_length(source.shape) * source.itemsize
    return [(start * row, stop * row) for start, stop in rows if stop > start]


def host(array):
    """The numpy array behind a simulator device array."""
    return array._ary


def make_driver() -> GpuDriver:
    """The driver for this process: the simulator's under NUMBA_ENABLE_CUDASIM=1, else the GPU's."""
    return SimDriver() if simulated() else GpuDriver()


class MappedFiles(dict):
    """Read-only file maps page-locked in place through `driver` (`register_mapping`), by address, each
    once; they are held, since a map must outlive its registration, until `release` drops them all. The
    cuda backend keeps one per backend (a run's checkpoint weights), a `turnip.Session` one per session."""

    def __init__(self, driver: GpuDriver):
        super().__init__()
        self.driver = driver
        self.lock = threading.Lock()
        """Held while a map is registered: a session's thread locks the maps ahead of its reads (turnip/host.py)."""

    def register(self, mapping: np.ndarray) -> bool:
        """Page-lock `mapping` unless it is already; False where the driver refuses."""
        address = mapping.ctypes.data
        with self.lock:
            if address not in self:
                if not self.driver.register_mapping(mapping):
                    return False
                self[address] = mapping
        return True

    def release(self) -> None:
        for mapping in self.values():
            with contextlib.suppress(Exception):  # after a CUDA error the context is gone, and its registrations with it
                self.driver.unregister_mapping(mapping)
        self.clear()


__all__ = ["GpuDriver", "MappedFiles", "SimDriver", "host", "make_driver", "row_pitch"]

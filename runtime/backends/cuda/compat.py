"""The one place that papers over the GPU image's software: numpy 2.5 against numba-cuda 0.30.4, raw stream
handles, the CUDA simulator, and whether a GPU is there at all.

- numba-cuda 0.30.4 registers an overload for `np.row_stack`, which numpy 2.5 removed: the first kernel
  compile fails with `AttributeError: module 'numpy' has no attribute 'row_stack'`. We give numpy the alias
  (`np.vstack`, which row_stack always was) before numba-cuda compiles anything.
- A numba-cuda `Stream.handle` is a `cuda.bindings.driver.CUstream`, not a ctypes pointer: `.value` fails
  (which is why `Stream.add_callback` is broken in 0.30.4). `stream_handle()` is the one way we turn a stream
  into the integer CuPy (`cupy.cuda.ExternalStream`), torch (`torch.cuda.ExternalStream`) and the driver take.
- numba (and CuPy) have no bfloat16 array type: a bfloat16 tensor is uint16 words on the device, converted
  in-kernel by bfloat16.py (libdevice bit casts on a GPU; numpy scalar views under the simulator, which
  has no libdevice), and handed to torch as float16 then `.view(torch.bfloat16)` (attention.py).
- Under `NUMBA_ENABLE_CUDASIM=1` (CI, no GPU) kernels, streams, device arrays and pinned arrays work, but
  events carry no time, there are no stream handles, and every launch runs synchronously on the host:
  the backend's `SimDriver` (driver.py), chosen once, answers for all that. What is fixed when kernels
  are compiled stays with them, decided at import: device functions cannot be `forceinline` (`device()`),
  threads per block are few (kernels_numba.py) and `vector.load4` reads element by element (vector.py).
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

if not hasattr(np, "row_stack"):  # numpy >= 2.5; see the module docstring
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402  (after the numpy alias, on purpose)

from turnip_ir.errors import InputError  # noqa: E402


def simulated() -> bool:
    """True under NUMBA_ENABLE_CUDASIM=1: numba's CUDA simulator runs kernels on the host."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def gpu_count() -> int:
    """How many GPUs the cuda backend can use: 0 when there is no driver or no device (1 under the simulator)."""
    try:
        if not cuda.is_available():
            return 0
        return len(cuda.gpus)
    except Exception:  # no driver library, or a driver that fails to initialise
        return 0


def require_gpus(count: int) -> None:
    """A one-line error when the machine has fewer GPUs than the memgraph places work on."""
    have = gpu_count()
    if have == 0:
        raise InputError("the cuda backend needs an NVIDIA GPU and its driver, and this machine has none (use --backend cpu or sim)")
    if have < count:
        raise InputError(f"the memgraph uses {count} GPUs but this machine has {have}")


def stream_handle(stream) -> int:
    """The raw CUstream of a numba stream, as an int (GPU only: the simulator's streams have none, and its
    driver, driver.py, never asks)."""
    return int(stream.handle)


class DriverCalls:
    """The driver calls made per vertex, straight to libcuda through ctypes (GPU only): numba's wrappers
    check the context, log and look up the binding on each call, several microseconds apiece, and a
    vertex makes about six (its events' records, waits and elapsed times; the completion notifier's host
    function). Also the copies between host and GPU (per reload and offload, and between runs) and the
    page-locked query of host memory. Handles are the integers of `Event.handle` and `stream_handle`."""

    def __init__(self):
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        pointer = ctypes.c_void_p
        self._record = _entry(lib.cuEventRecord, pointer, pointer)
        self._wait = _entry(lib.cuStreamWaitEvent, pointer, pointer, ctypes.c_uint)
        self._elapsed = _entry(lib.cuEventElapsedTime, ctypes.POINTER(ctypes.c_float), pointer, pointer)
        self._host_func = _entry(lib.cuLaunchHostFunc, pointer, pointer, pointer)
        self._attribute = _entry(lib.cuPointerGetAttribute, pointer, ctypes.c_int, pointer)
        self._d2h = _entry(lib.cuMemcpyDtoHAsync_v2, pointer, ctypes.c_uint64, ctypes.c_size_t, pointer)
        self._h2d = _entry(lib.cuMemcpyHtoDAsync_v2, ctypes.c_uint64, pointer, ctypes.c_size_t, pointer)
        self._ms = ctypes.c_float()
        self._ms_ref = ctypes.byref(self._ms)
        self._kind = ctypes.c_uint()
        self._kind_ref = ctypes.byref(self._kind)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def record(self, event: int, stream: int) -> None:
        self._check(self._record(event, stream), "cuEventRecord")

    def wait(self, stream: int, event: int) -> None:
        self._check(self._wait(stream, event, 0), "cuStreamWaitEvent")

    def launch_host_func(self, stream: int, function: int, data: int) -> None:
        self._check(self._host_func(stream, function, data), "cuLaunchHostFunc")

    def copy_d2h(self, host: int, device: int, count: int, stream: int | None) -> None:
        self._check(self._d2h(host, device, count, stream), "cuMemcpyDtoHAsync")

    def copy_h2d(self, device: int, host: int, count: int, stream: int | None) -> None:
        self._check(self._h2d(device, host, count, stream), "cuMemcpyHtoDAsync")

    def host_pinned(self, pointer: int) -> bool:
        """Whether host address `pointer` lies in page-locked memory the driver knows (cudaHostAlloc'd or
        registered): its memory type is HOST; pageable memory is no driver pointer at all."""
        if not pointer:
            return False
        status = self._attribute(self._kind_ref, 2, pointer)  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        return status == 0 and self._kind.value == 1  # CU_MEMORYTYPE_HOST

    def elapsed(self, start: int, end: int) -> float:
        """Milliseconds from `start` to `end`, both recorded and done."""
        self._check(self._elapsed(self._ms_ref, start, end), "cuEventElapsedTime")
        return self._ms.value


def _entry(function, *argtypes):
    """A libcuda entry point typed for ctypes: these arguments, a CUresult back."""
    import ctypes

    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


@lru_cache(maxsize=None)
def driver_calls() -> DriverCalls:
    """The process's `DriverCalls`, made at first use."""
    return DriverCalls()


def device(fastmath: bool = False):
    """A numba device function, inlined into its callers on a GPU (the simulator knows no `forceinline`)."""
    if simulated():
        return cuda.jit(device=True)
    return cuda.jit(device=True, forceinline=True, fastmath=fastmath)

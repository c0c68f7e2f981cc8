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
        self._copy_2d = _entry(lib.cuMemcpy2DAsync_v2, ctypes.POINTER(_memcpy_2d()), pointer)
        self._register = _entry(lib.cuMemHostRegister_v2, pointer, ctypes.c_size_t, ctypes.c_uint)
        self._unregister = _entry(lib.cuMemHostUnregister, pointer)
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

    def rows_d2h(self, host: int, pitch: int, device: int, width: int, height: int):
        """The parameters of a 2-D copy of `height` rows of `width` bytes, contiguous at `device`, into host
        rows `pitch` bytes apart from `host` (made once, issued by `copy_2d`)."""
        params = _memcpy_2d()()
        params.srcMemoryType, params.srcDevice, params.srcPitch = 2, device, width  # CU_MEMORYTYPE_DEVICE
        params.dstMemoryType, params.dstHost, params.dstPitch = 1, host, pitch  # CU_MEMORYTYPE_HOST
        params.WidthInBytes, params.Height = width, height
        return params

    def copy_2d(self, params, stream: int | None) -> None:
        self._check(self._copy_2d(params, stream), "cuMemcpy2DAsync")

    def register_read_only(self, pointer: int, count: int) -> int:
        """Page-lock `count` bytes at `pointer` (a read-only file map) for every context: portable, read-only
        (CU_MEMHOSTREGISTER_PORTABLE | READ_ONLY); the CUresult (0: done)."""
        return self._register(pointer, count, 0x1 | 0x8)

    def register_portable(self, pointer: int, count: int) -> int:
        """Page-lock `count` bytes at `pointer` (anonymous memory) for every context; the CUresult (0: done)."""
        return self._register(pointer, count, 0x1)

    def unregister(self, pointer: int) -> None:
        self._check(self._unregister(pointer), "cuMemHostUnregister")

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


@lru_cache(maxsize=None)
def _memcpy_2d():
    """ctypes' CUDA_MEMCPY2D (cuda.h): a 2-D copy's source, destination, row width and row count."""
    import ctypes

    size, pointer = ctypes.c_size_t, ctypes.c_void_p
    fields = []
    for side in ("src", "dst"):
        fields += [(f"{side}XInBytes", size), (f"{side}Y", size), (f"{side}MemoryType", ctypes.c_int), (f"{side}Host", pointer),
                   (f"{side}Device", ctypes.c_uint64), (f"{side}Array", pointer), (f"{side}Pitch", size)]
    return type("CUDA_MEMCPY2D", (ctypes.Structure,), {"_fields_": [*fields, ("WidthInBytes", size), ("Height", size)]})


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


KERNEL_CACHE_ENV = "TURNIP_KERNEL_CACHE"
"""Set to 0 to compile every kernel in every process (no on-disk kernel cache)."""


def cached_kernel(**options):
    """`cuda.jit(**options)` for a kernel whose compiled code is kept on disk by numba's cache, so a later
    process loads it instead of compiling it (about 0.3-0.5 s a kernel; a cold 7b prefill builds ten).

    Our kernels are closures made by factories (a dtype, a flag, the device functions they call), and
    numba keys a closure's cache entries by the cloudpickle of its cells, which for some device functions
    differs from process to process: such an entry would never be found again. So the key here is the
    kernel's bytecode and a fingerprint of its cells (`_fingerprint`: functions by their code, constants
    by value), and of this package's source files, which hold every device function a kernel may reach
    through a module global. A kernel whose cells cannot be fingerprinted stably, the simulator, and
    `TURNIP_KERNEL_CACHE=0` compile as before. Entries live where numba keeps its cache (`__pycache__`
    beside kernels_numba.py when writable, else the user's cache folder, or `NUMBA_CACHE_DIR`)."""

    def wrap(py_func):
        dispatcher = cuda.jit(**options)(py_func)
        if not simulated() and os.environ.get(KERNEL_CACHE_ENV, "1") != "0":
            _cache_on_disk(dispatcher)
        return dispatcher

    return wrap


def _cache_on_disk(dispatcher) -> None:
    """Give `dispatcher` numba's on-disk cache under the stable key `cached_kernel` describes (nothing if unstable)."""
    import hashlib

    function = _fingerprint(dispatcher.py_func)  # its bytecode, constants and closure's cells
    if function is None:
        return
    try:
        import numba_cuda

        dispatcher.enable_caching()
        cache = dispatcher._cache
        version = numba_cuda.__version__
    except Exception:  # a numba-cuda without these internals: compile as before
        return
    stable = hashlib.sha256(f"{_sources_digest()}|{function}".encode()).hexdigest()

    def index_key(sig, codegen):
        key = (sig, codegen.magic_tuple(), version, stable)
        extra = getattr(cache, "_launch_config_key", None)
        return key if extra is None else key + (("launch_config", extra),)

    cache._index_key = index_key


@lru_cache(maxsize=None)
def _sources_digest() -> str:
    """A hash of this package's source files (a kernel reaches device functions through their globals)."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _fingerprint(value, depth: int = 0) -> str | None:
    """A text that is the same in every process for the same value: functions (and numba dispatchers and
    intrinsics, through the Python function they wrap) by module, name, bytecode, constants and closure;
    numbers, strings, numba types and dtypes by value. None for anything else (no stable key)."""
    if depth > 12:
        return None
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
        return repr(value)
    if isinstance(value, (tuple, list)):
        parts = [_fingerprint(v, depth + 1) for v in value]
        return None if None in parts else f"({','.join(parts)})"
    function = getattr(value, "py_func", None) or getattr(value, "_defn", None)
    if function is not None and function is not value:
        inner = _fingerprint(function, depth + 1)
        return None if inner is None else f"{type(value).__name__}[{inner}]"
    code = getattr(value, "__code__", None)
    if code is not None:
        return _code_print(code, value, depth)
    text = repr(value)
    if "0x" in text or " at " in text or "object" in text:
        return None  # an identity, not a value
    return f"{type(value).__module__}.{type(value).__qualname__}:{text}"


def _code_print(code, function, depth: int) -> str | None:
    import hashlib

    consts = []
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            consts.append(hashlib.sha256(const.co_code).hexdigest())
        else:
            consts.append(repr(const))
    cells = _fingerprint(tuple(cell.cell_contents for cell in getattr(function, "__closure__", None) or ()), depth + 1)
    if cells is None:
        return None
    body = hashlib.sha256(code.co_code + repr((consts, code.co_names)).encode()).hexdigest()
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}:{body}:{cells}"


def device(fastmath: bool = False):
    """A numba device function, inlined into its callers on a GPU (the simulator knows no `forceinline`)."""
    if simulated():
        return cuda.jit(device=True)
    return cuda.jit(device=True, forceinline=True, fastmath=fastmath)

"""Device and host memory for a cuda run: every byte is taken in `prepare`, none while the loop runs.

Per GPU there are exactly two device allocations: the arena (every tensor is a view at its planned offset)
and the workspace (scratch for kernels that need temporaries, carved per compute lane so that reuse is
ordered by the lane's stream). Host storage (offloads, inputs kept in CPU memory) is pinned, taken in
chunks of at most `chunk_bytes` (one pinned allocation of many GB can fail), each chunk holding whole
storage regions: the planner's regions never overlap, so a region never straddles two chunks.
"""

from __future__ import annotations

import mmap
from bisect import bisect_right

import numpy as np

from runtime.backends.cuda.compat import cuda
from turnip_ir.errors import InputError
from turnip_ir.kernels import numpy_dtype

CHUNK_BYTES = 1 << 30
GAP_BYTES = 1 << 20
"""The most unused bytes between two storage regions that one pinned chunk spans (`_chunk_spans`): bytes
no region of the plan holds and the regions a load gives no storage (TensorViews `unstored`) are not pinned."""


def device_bytes(count: int):
    """One device allocation of `count` bytes on the current GPU (a 1-byte one for 0, so views stay valid)."""
    return cuda.device_array(max(count, 1), dtype=np.uint8)


def give_back(array) -> None:
    """Hand `array`'s device allocation (a `device_bytes`) to numba's deallocation queue now, whatever still
    refers to it, for the driver to free at the next flush (`GpuDriver.collect`). For a closed backend's
    arenas and workspaces, whose views nothing may use again: left to the last reference, numba learns of
    the free only when that goes (a library's cache can keep one for the process's life), and then defers
    it until a fifth of the GPU is pending, which a dropped 4 GiB arena never reaches. Nothing under the
    simulator, whose arrays are host memory."""
    pointer = getattr(array, "gpu_data", None)
    finalizer = getattr(pointer, "_finalizer", None)
    if getattr(pointer, "is_managed", False) and finalizer is not None and finalizer.alive:
        pointer.free()


PINNING_ENV = "TURNIP_PINNING"
"""`register` (the default): large pinned buffers are anonymous memory on transparent huge pages, touched
by threads and registered with the driver; `alloc`: every buffer from cuMemHostAlloc."""
REGISTER_FROM = 64 << 20
"""Buffers from this size up are registered (smaller ones are cheap either way)."""
HUGE_PAGE = 2 << 20
TOUCHING_THREADS = 16
"""Threads that touch a new registered buffer's pages first (at most the cores: turnip_ir/pools.py)."""


def pinned_bytes(count: int) -> np.ndarray:
    """Pinned (page-locked) host memory, portable to every GPU's context, as a uint8 array.

    cuMemHostAlloc page-locks about 2.3 GB/s on the H200's host (10.8 GiB of a 7b model's storage took
    3.9 s); the same bytes mapped anonymously on transparent huge pages, first touched by several threads
    and then registered (cuMemHostRegister), lock far faster (bench/investigations/pin_probe.py). The
    registration is dropped when the buffer is freed (`_RegisteredMap`); where the driver refuses it,
    cuMemHostAlloc as before."""
    count = max(count, 1)
    import os

    from runtime.backends.cuda.compat import simulated

    if count >= REGISTER_FROM and os.environ.get(PINNING_ENV, "register") == "register" and not simulated():
        registered = _registered(count)
        if registered is not None:
            return registered
    from numba.cuda.cudadrv.devices import get_context

    buffer = get_context().memhostalloc(count, mapped=False, portable=True, wc=False)
    return np.ndarray(shape=(count,), dtype=np.uint8, buffer=buffer)


class _RegisteredMap(mmap.mmap):
    """An anonymous map registered with the driver; the registration goes before the map is unmapped."""

    address = 0

    def __del__(self):
        if self.address:
            address, self.address = self.address, 0
            try:
                from numba.cuda.cudadrv.devices import get_context

                from runtime.backends.cuda.compat import driver_calls

                get_context()  # the thread that drops the buffer may have no current context
                driver_calls().unregister(address)
            except Exception:  # the context is gone (its registrations with it), or the interpreter is exiting
                pass


def _registered(count: int) -> np.ndarray | None:
    """`count` bytes of anonymous memory on huge pages, touched by threads, then page-locked; None if refused."""
    from numba.cuda.cudadrv.devices import get_context

    from runtime.backends.cuda.compat import driver_calls
    from turnip_ir.pools import shared_pool

    get_context()
    size = -(-count // HUGE_PAGE) * HUGE_PAGE
    try:
        region = _RegisteredMap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return None
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    array = np.frombuffer(region, dtype=np.uint8)  # holds the map: it lives as long as any view of it
    step = 64 << 20
    # the kernel zeroes each page at its first touch: spread that over threads (numpy's fill lets go of the GIL)
    list(shared_pool("page touching", TOUCHING_THREADS).map(lambda start: array[start : start + step : mmap.PAGESIZE].fill(0), range(0, size, step)))
    address = array.ctypes.data
    if driver_calls().register_portable(address, size) != 0:
        return None
    region.address = address
    return array[:count]


def device_pointer(array) -> int:
    """The device address of a numba device array or view (what cuBLAS and the driver's copies take)."""
    return array.__cuda_array_interface__["data"][0]


DEVICE_DTYPES = {"bfloat16": np.dtype(np.uint16)}
"""Taskgraph dtypes numba has no array type for -> the storage their device views use (bfloat16.py).
uint16 is no taskgraph dtype, so a uint16 view is always a bfloat16 tensor (`dtype_name`)."""


def device_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a device view of a `dtype` tensor (bfloat16: its uint16 bit patterns)."""
    return DEVICE_DTYPES.get(dtype) or np.dtype(dtype)


def dtype_name(array) -> str:
    """The taskgraph dtype of a device view (or of anything with a dtype): uint16 words are bfloat16."""
    name = str(array.dtype)
    return "bfloat16" if name == "uint16" else name


def device_view(buffer, offset: int, shape: tuple[int, ...], dtype: str):
    """The tensor of `shape` and `dtype` at byte `offset` of a device (or host) uint8 buffer (bfloat16 as
    uint16 words: `device_dtype`)."""
    count = int(np.prod(shape, dtype=np.int64)) * device_dtype(dtype).itemsize
    if offset < 0 or offset + count > buffer.shape[0]:
        raise InputError(f"a {list(shape)} {dtype} tensor at offset {offset} does not fit a buffer of {buffer.shape[0]} bytes")
    if count == 0:
        return None  # nothing to read or write; kernels skip zero-size tensors
    return buffer[offset : offset + count].view(device_dtype(dtype)).reshape(shape)


class PinnedStorage:
    """CPU storage in pinned chunks; `view(region, shape, dtype)` is a numpy view into the chunk holding it."""

    def __init__(self, regions: list[tuple[int, int]], chunk_bytes: int = CHUNK_BYTES, allocate=None, reuse=(), ready=None):
        """`allocate(count)` takes one chunk (default `pinned_bytes`; the simulator's driver passes its own).
        `reuse`: chunks of an earlier memgraph's storage (idle now) to take before allocating: pinning
        many GB costs seconds, and a prepared backend loads memgraph after memgraph (each span gets the
        smallest free chunk that holds it; chunks left over are kept in `spare` for the next load).
        `ready(storage, end)`, if given, is called after each chunk is taken, chunks in offset order:
        every region below `end` can be viewed (and written) from then on, while later chunks are pinned."""
        allocate = allocate or pinned_bytes
        spare = sorted(reuse, key=len)
        self.starts: list[int] = []
        self.chunks: list[np.ndarray] = []
        for start, end in _chunk_spans(regions, chunk_bytes, GAP_BYTES):
            fit = next((i for i, chunk in enumerate(spare) if len(chunk) >= end - start), None)
            self.starts.append(start)
            self.chunks.append(spare.pop(fit) if fit is not None else allocate(end - start))
            if ready is not None:
                ready(self, end)
        self.spare = spare

    def all_chunks(self) -> list[np.ndarray]:
        """Every chunk this storage holds, used or spare (what the next load may reuse)."""
        return [*self.chunks, *self.spare]

    @property
    def nbytes(self) -> int:
        return sum(chunk.shape[0] for chunk in self.chunks)

    def view(self, region: tuple[int, int], shape: tuple[int, ...], dtype: str) -> np.ndarray | None:
        offset, _ = region
        i = bisect_right(self.starts, offset) - 1
        if i < 0:
            raise InputError(f"storage offset {offset} lies before the first storage region")
        view = device_view(self.chunks[i], offset - self.starts[i], shape, dtype)
        return None if view is None else view.view(numpy_dtype(dtype))  # bfloat16 as ml_dtypes' type on the host


def _chunk_spans(regions: list[tuple[int, int]], chunk_bytes: int, gap: int) -> list[tuple[int, int]]:
    """Group sorted, disjoint (offset, size) regions into spans of at most `chunk_bytes` (one region may exceed
    it); a gap of more than `gap` bytes between two regions (storage a load leaves out) starts a new span."""
    spans: list[tuple[int, int]] = []
    for offset, size in sorted(set(regions)):
        end = offset + max(size, 1)
        if spans and end - spans[-1][0] <= chunk_bytes and spans[-1][1] <= offset <= spans[-1][1] + gap:
            spans[-1] = (spans[-1][0], end)
        elif spans and offset < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))  # overlapping regions (a hand-written plan) share a chunk
        else:
            spans.append((offset, end))
    return spans


class Workspace:
    """A GPU's scratch allocation, split into one equal slice per compute lane.

    Work on one lane is ordered by its stream, so a vertex may reuse its lane's slice freely: the next
    vertex on that lane starts only after this one ends. `slice(lane)` is a uint8 device array.
    """

    def __init__(self, lanes: int, per_lane: int):
        self.per_lane = max(0, per_lane)
        self.buffer = device_bytes(self.per_lane * lanes)

    @property
    def nbytes(self) -> int:
        return self.buffer.shape[0]

    def slice(self, lane_slot: int):
        start = lane_slot * self.per_lane
        return self.buffer[start : start + self.per_lane]

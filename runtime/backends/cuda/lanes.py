"""CuPy's allocator while a memgraph runs: no memory outside a lane's scratch.

Every byte is taken in `prepare` (memory.py), so while the loop runs `LaneAllocator` refuses CuPy's
requests, except inside `KernelServices.cupy_scratch(lane)` (services.py), where it bump-allocates from
that lane's workspace slice: work on one lane is ordered by its stream, so the slice is reset per vertex.
`refused` and `served` count calls; the run summary's stats carry them (a GPU test asserts that refused
stays 0).
"""

from __future__ import annotations

from runtime.backends.cuda.memory import device_pointer


class LaneAllocator:
    """A CuPy allocator (`cupy.cuda.set_allocator`) serving one lane's scratch at a time, or nothing."""

    def __init__(self):
        self.area = None
        self.top = 0
        self.served = 0
        self.refused = 0

    def open(self, area) -> None:
        self.area, self.top = area, 0

    def close(self) -> None:
        self.area = None

    def __call__(self, size: int):
        import cupy

        if self.area is None:
            self.refused += 1
            raise MemoryError(f"CuPy asked for {size} bytes while a memgraph runs; turnip allows no allocation outside its workspace")
        start = (self.top + 255) // 256 * 256
        if start + size > self.area.shape[0]:
            self.refused += 1
            raise MemoryError(f"a kernel needs {size} bytes of scratch beyond its lane's {self.area.shape[0]}-byte workspace slice")
        self.top = start + size
        self.served += 1
        pointer = device_pointer(self.area) + start
        memory = cupy.cuda.UnownedMemory(pointer, size, self.area)
        return cupy.cuda.MemoryPointer(memory, 0)

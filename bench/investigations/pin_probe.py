"""How fast host memory can be made page-locked on this machine, and what each way costs a cold start.

Measures, each on its own fresh region of SIZE GiB (default 4), through ctypes calls of libcuda alone:
cuMemHostAlloc in 1 GiB chunks (what the cuda backend does today); anonymous memory touched by threads and
then cuMemHostRegister'ed (4 KiB pages, then transparent huge pages), once whole and from 4 threads at a time;
a file in the page cache mapped read-only and registered in place (CU_MEMHOSTREGISTER_READ_ONLY), with the
host-to-device rate from it; the host-to-device rate from pageable memory; and the rate of copying a mapped
file into pinned memory on 8 threads (the checkpoint loader's copy). Usage: python3 bench/investigations/pin_probe.py [SIZE_GiB]
Prints one line per measurement; with OUT set, writes them to $OUT/pin_probe.json.
"""
import ctypes
import json
import mmap
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

GIB = 1 << 30
SIZE = int(float(sys.argv[1]) * GIB) if len(sys.argv) > 1 else 4 * GIB
cu = ctypes.CDLL("libcuda.so.1")
for name, args in {"cuInit": [ctypes.c_uint], "cuDeviceGet": [ctypes.c_void_p, ctypes.c_int],
                   "cuDevicePrimaryCtxRetain": [ctypes.c_void_p, ctypes.c_int], "cuCtxSetCurrent": [ctypes.c_void_p],
                   "cuMemHostAlloc": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint], "cuMemFreeHost": [ctypes.c_void_p],
                   "cuMemHostRegister_v2": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint],
                   "cuMemHostUnregister": [ctypes.c_void_p], "cuMemAlloc_v2": [ctypes.c_void_p, ctypes.c_size_t],
                   "cuMemcpyHtoD_v2": [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t], "cuCtxSynchronize": []}.items():
    getattr(cu, name).argtypes, getattr(cu, name).restype = args, ctypes.c_int
results = {}


def check(code, what):
    if code != 0:
        raise RuntimeError(f"{what}: CUresult {code}")


def report(name, seconds, nbytes, **more):
    results[name] = {"seconds": seconds, "GB/s": nbytes / seconds / 1e9 if seconds > 0 else None, **more}
    print(f"{name:<58} {seconds:8.3f} s  {nbytes / seconds / 1e9 if seconds > 0 else 0:7.2f} GB/s {more or ''}", flush=True)


def timed(fn):
    began = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - began


check(cu.cuInit(0), "cuInit")
device, context = ctypes.c_int(), ctypes.c_void_p()
check(cu.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), device.value), "retain")
check(cu.cuCtxSetCurrent(context), "set current")
target = ctypes.c_ulonglong()
check(cu.cuMemAlloc_v2(ctypes.byref(target), GIB), "cuMemAlloc")


def h2d_rate(address, nbytes):
    cu.cuCtxSynchronize()
    began = time.perf_counter()
    for offset in range(0, nbytes, GIB):
        check(cu.cuMemcpyHtoD_v2(target.value, address + offset, min(GIB, nbytes - offset)), "cuMemcpyHtoD")
    return time.perf_counter() - began


def touch(array, threads=8):
    pieces = np.array_split(np.arange(array.size // mmap.PAGESIZE) * mmap.PAGESIZE, threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: array[p[0]: p[-1] + mmap.PAGESIZE].fill(1) if len(p) else None, pieces))


def probe(name, fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - a probe that fails is reported and the others go on
        results[name] = {"error": str(err)}
        print(f"{name:<58} failed: {err}", flush=True)


def hostalloc():
    pointers = []
    began = time.perf_counter()
    for _ in range(SIZE // GIB):
        pointer = ctypes.c_void_p()
        check(cu.cuMemHostAlloc(ctypes.byref(pointer), GIB, 1), "cuMemHostAlloc")
        pointers.append(pointer)
    report("cuMemHostAlloc, 1 GiB chunks (today)", time.perf_counter() - began, SIZE)
    array = np.ctypeslib.as_array(ctypes.cast(pointers[0], ctypes.POINTER(ctypes.c_uint8)), shape=(GIB,))
    _, seconds = timed(lambda: array.fill(2))
    report("  write into a fresh pinned chunk, one thread", seconds, GIB)
    report("  H2D from it", h2d_rate(pointers[0].value, GIB), GIB)
    for pointer in pointers:
        cu.cuMemFreeHost(pointer)


def anonymous(huge, threads, touch_first=True):
    def run():
        region = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if huge:
            region.madvise(mmap.MADV_HUGEPAGE)
        array = np.frombuffer(region, dtype=np.uint8)
        address = array.ctypes.data
        _, touched = timed(lambda: touch(array))
        report(f"anonymous {'huge' if huge else '4K'} pages touched by 8 threads", touched, SIZE)
        if not touch_first:
            del array
            region.close()
            region = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if huge:
                region.madvise(mmap.MADV_HUGEPAGE)
            array = np.frombuffer(region, dtype=np.uint8)
            address = array.ctypes.data
        pieces = [(address + i * (SIZE // threads), SIZE // threads) for i in range(threads)]

        def register(piece):
            check(cu.cuCtxSetCurrent(context), "set current")  # a pool thread has no current context
            check(cu.cuMemHostRegister_v2(ctypes.c_void_p(piece[0]), piece[1], 1), "cuMemHostRegister")

        with ThreadPoolExecutor(threads) as pool:
            _, seconds = timed(lambda: list(pool.map(register, pieces)))
        report(f"  cuMemHostRegister ({'huge' if huge else '4K'}, {threads} thread(s){'' if touch_first else ', untouched'})", seconds, SIZE)
        report("  H2D from it", h2d_rate(address, min(SIZE, 2 * GIB)), min(SIZE, 2 * GIB))
        _, seconds = timed(lambda: [cu.cuMemHostUnregister(ctypes.c_void_p(p)) for p, _ in pieces])
        report("  cuMemHostUnregister", seconds, SIZE)
        del array
        region.close()
    return run


def pageable():
    array = np.ones(2 * GIB, dtype=np.uint8)
    report("H2D from pageable memory (synchronous)", h2d_rate(array.ctypes.data, array.size), array.size)


def mapped_file():
    folder = os.environ.get("PROBE_DIR", tempfile.gettempdir())
    path = os.path.join(folder, "pin_probe.bin")
    with open(path, "wb") as f:
        block = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
        for _ in range(SIZE // len(block)):
            f.write(block)
    try:
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass  # page cache warm
        fd = os.open(path, os.O_RDONLY)
        (region, seconds) = timed(lambda: mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ))
        report("file in the page cache: mmap with MAP_POPULATE", seconds, SIZE)
        array = np.frombuffer(region, dtype=np.uint8)
        address = array.ctypes.data
        report("  H2D from the mapping, pageable", h2d_rate(address, 2 * GIB), 2 * GIB)
        pinned = ctypes.c_void_p()
        check(cu.cuMemHostAlloc(ctypes.byref(pinned), 2 * GIB, 1), "cuMemHostAlloc")
        destination = np.ctypeslib.as_array(ctypes.cast(pinned, ctypes.POINTER(ctypes.c_uint8)), shape=(2 * GIB,))
        step = 16 << 20

        def copy(offset):
            destination[offset: offset + step] = array[offset: offset + step]

        for threads in (1, 8):
            with ThreadPoolExecutor(threads) as pool:
                _, seconds = timed(lambda: list(pool.map(copy, range(0, 2 * GIB, step))))
            report(f"  mapping -> pinned memory, {threads} thread(s), 16 MiB pieces", seconds, 2 * GIB)
        cu.cuMemFreeHost(pinned)
        for flags, label in ((1 | 8, "portable | read-only"), (8, "read-only"), (1, "portable")):
            code, seconds = timed(lambda: cu.cuMemHostRegister_v2(ctypes.c_void_p(address), SIZE, flags))
            if code == 0:
                report(f"  cuMemHostRegister of the mapping ({label})", seconds, SIZE)
                report("  H2D from the registered mapping", h2d_rate(address, 2 * GIB), 2 * GIB)
                cu.cuMemHostUnregister(ctypes.c_void_p(address))
                break
            results[f"register mapping {label}"] = {"error": f"CUresult {code}"}
            print(f"  cuMemHostRegister of the mapping ({label}) refused: CUresult {code}", flush=True)
        del array
        region.close()
        os.close(fd)
    finally:
        os.unlink(path)


probe("hostalloc", hostalloc)
probe("anonymous 4K", anonymous(False, 1))
probe("anonymous huge", anonymous(True, 1))
probe("anonymous huge 4 threads", anonymous(True, 4))
probe("anonymous huge untouched", anonymous(True, 1, touch_first=False))
probe("anonymous huge untouched 4 threads", anonymous(True, 4, touch_first=False))
probe("pageable", pageable)
probe("mapped file", mapped_file)
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "pin_probe.json"), "w") as f:
        json.dump({"size": SIZE, "results": results}, f, indent=2)

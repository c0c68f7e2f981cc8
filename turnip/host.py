"""Where a session keeps the host arrays its runs read: page-locked memory on the cuda backend (`HostMemory`)
and the weights, each read and converted once (`Materialized`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from runtime.inputs import fill, mapped

class HostMemory:
    """Where a session keeps the host arrays its runs read (weights, KV caches): page-locked on the cuda
    backend, whose copy engines then read them where they are (a new plan stages nothing,
    runtime/backends/cuda/copies.py), ordinary memory elsewhere."""

    def __init__(self, backend: str):
        self.pinned = backend == "cuda"
        self._soon: list[Soon] = []
        """Work begun on threads of their own (`soon`), joined before `release` frees anything."""
        self._lasting: dict = {}
        """`lasting`'s buffers by key."""
        self.mappings: dict = {}
        """Checkpoint files' maps page-locked in place (`take`), until `release`."""
        if self.pinned:
            from runtime.backends.cuda.driver import MappedFiles, make_driver

            self.mappings = MappedFiles(make_driver())

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if not self.pinned:
            return np.empty(shape, dtype)
        from runtime.backends.cuda.memory import pinned_bytes

        count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return pinned_bytes(count)[:count].view(dtype).reshape(shape)

    def lasting(self, key, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialised `shape` `dtype` array in this memory, kept under `key` until `release`: the bytes
        last asked for under `key` when they are enough (a call's KV cache takes the last call's: page-locking
        a 7b batch's 17 GB takes seconds), else new ones, the old dropped first."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        held = self._lasting.get(key)
        if held is None or held.nbytes < count:
            self._lasting.pop(key, None)
            held = self._lasting[key] = self.empty((max(count, 1),), np.uint8)
        return held[:count].view(dtype).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        if not self.pinned:
            return np.zeros(shape, dtype)
        out = self.empty(shape, dtype)
        out[...] = 0
        return out

    def take(self, value, dtype) -> np.ndarray:
        """`value` (an array or a lazy input) as a C-contiguous `dtype` array in this memory: itself when it
        is one already (pinned weights a benchmark shares); a checkpoint's tensor stored in `dtype`, where
        it lies in the file's map, once the map is page-locked in place (no host copy); else a copy
        (converted in the same pass)."""
        if not self.pinned:
            with np.errstate(over="ignore"):  # a value beyond the dtype's range: the session's check names it
                return np.ascontiguousarray(value, dtype=dtype)
        from runtime.backends.cuda.copies import readable_in_place

        found = _in_place(value, dtype)
        if found is not None and self.mappings.register(found[1]):
            return found[0]
        if readable_in_place(self.mappings.driver, value, dtype):
            return value
        out = self.empty(tuple(int(n) for n in value.shape), dtype)
        fill(out, value)
        return out

    def soon(self, name: str, make, *args) -> Soon:
        """`make(*args)` begun now on a thread of its own, "turnip `name`" (`Soon`), joined by `release` at the
        latest (what it makes may be this memory's: a call's KV cache in `lasting`)."""
        self._soon = [work for work in self._soon if work.thread.is_alive()]
        work = Soon(name, make, *args)
        self._soon.append(work)
        return work

    def lock_soon(self, values, dtype) -> None:
        """Begin page-locking, on a thread of its own (`soon`), the checkpoint maps that `take` reads `values`
        (lazy inputs) in place from as `dtype`, in their order: `take` then finds them locked (a 7b
        checkpoint's 13.5 GB take 0.4 s, while the session sizes its arena and reads its plans). A map the
        thread could not lock is locked by `take`, or not at all, as before. Nothing on other backends."""
        if not self.pinned:
            return

        def lock() -> None:
            for value in values:
                found = _in_place(value, dtype)
                if found is not None:
                    self.mappings.register(found[1])

        self.soon("file locking", lock)

    def release(self) -> None:
        """Drop the `lasting` buffers and the registrations of the checkpoint maps `take` page-locked (the
        session's weights and caches are gone), once the work begun by `soon` is done."""
        for work in self._soon:
            work.thread.join()
        self._soon = []
        self._lasting.clear()
        if self.pinned:
            self.mappings.release()


def _in_place(value, dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """(view, its file's map) where `value` is a lazy input lying in a mapped file as `dtype` values (what
    `take` may read in place once the map is page-locked), else None."""
    found = mapped(value)
    return found if found is not None and found[0].dtype == np.dtype(dtype) else None


class Soon:
    """`make(*args)` on a thread of its own, begun now, with the CUDA context current there too (the
    driver's calls need it): a call's KV cache page-locked (seconds for a 7b batch's 17 GB), a checkpoint's
    maps locked, while the caller compiles or reads its plans. `result()` waits for it; where the thread
    failed (a driver that cannot lock memory from another thread, say), it is made again on the caller's
    thread, so the thread can only save time."""

    def __init__(self, name: str, make, *args):
        self.make, self.args, self.value, self.failed = make, args, None, False
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"turnip {name}")
        self.thread.start()

    def _run(self) -> None:
        try:
            from numba.cuda.cudadrv.devices import get_context

            get_context()
            self.value = self.make(*self.args)
        except Exception:  # noqa: BLE001 (made again on the caller's thread, whose error is the one to see)
            self.failed = True

    def result(self):
        self.thread.join()
        if self.failed or self.value is None:
            self.value = self.make(*self.args)
        return self.value


class Materialized(Mapping):
    """A weights mapping whose tensors are read once, converted to the compute dtype once (into the
    session's host memory), checked once and kept. The check (`check(name, array)`, which raises to
    refuse one: a whole pass over a 7b model's 13.5 GB, 1.6 s on the GPU host) runs on a thread of its
    own while the caller goes on (the runs that read the weights, their plans' loads): `verified()` waits
    for the checks begun so far and raises the first refusal, and a refused tensor is not kept, so it is
    checked, and refused, again at its next read. A session calls it after every run, before any result
    is used."""

    def __init__(self, source: Mapping, dtype: str, host: HostMemory, check=None):
        self.source, self.dtype, self.host, self.check, self.kept = source, dtype, host, check, {}
        self.pending: list[tuple[str, Future]] = []
        """(name, its check) begun and not yet waited for (`verified`)."""
        self._checker: ThreadPoolExecutor | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.kept:
            lazy = getattr(self.source, "lazy", None) if self.host.pinned else None  # a checkpoint: perhaps read in place
            value = self.host.take(lazy(name) if lazy is not None else self.source[name], self.dtype)
            if self.check is not None:
                if self._checker is None:  # one thread: a check of one large tensor is threaded itself
                    self._checker = ThreadPoolExecutor(1, thread_name_prefix="turnip weight check")
                self.pending.append((name, self._checker.submit(self.check, name, value)))
            self.kept[name] = value
        return self.kept[name]

    def verified(self) -> None:
        """Wait for every check begun so far; raise the first refusal (in the order the tensors were read),
        the refused tensors dropped."""
        pending, self.pending = self.pending, []
        refusal = None
        for name, future in pending:
            error = future.exception()
            if error is not None:
                self.kept.pop(name, None)
                refusal = refusal or error
        if refusal is not None:
            raise refusal

    def close(self) -> None:
        """Stop the checks (those not begun are dropped, a running one is waited for: it reads memory the
        caller is about to free)."""
        self.pending = []
        if self._checker is not None:
            self._checker.shutdown(wait=True, cancel_futures=True)
            self._checker = None

    def __contains__(self, name) -> bool:
        return name in self.kept or name in self.source

    def __iter__(self):
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)

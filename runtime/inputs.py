"""Input tensors for a run: read from an .npz keyed by taskgraph input id, the rest drawn from a seed.

An input's value is an array or a lazy input: anything with `shape`, `dtype` and `write_into(out)`,
which writes its values into a buffer view of that shape and dtype (`Tiled` here; a block of a
checkpoint or of random weights from the frontend). Backends put inputs in place with `fill_all` (or a
`Filler`, fed as their buffers become ready), which writes them on a pool of threads (numpy copies and file reads release the GIL), largest first, so a
lazy input goes straight from its source to the backend's buffer with no host copy in between. A lazy
input that lies as it is in a mapped file may also say so (`mapped`): the cuda backend then reads it
from the file's pages in place.

A missing input is `np.random.default_rng(seed).standard_normal(shape).astype(dtype)` with one generator
per input, seeded from (seed, input id), so an input's values do not depend on which others were given.
"""

from __future__ import annotations

import math
import os
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.array_files import read_arrays
from runtime.host_memory import check_host_memory
from turnip_ir.errors import InputError
from turnip_ir.kernels import numpy_dtype


@dataclass(frozen=True)
class Tiled:
    """A big input made by repeating `block` along the first axis, never built whole on the host.

    Benchmarks and random weights need many gigabytes of non-zero values; drawing them costs minutes,
    repeating a drawn block costs a memory copy. Backends write it straight into their buffers (`fill`)."""

    block: np.ndarray
    shape: tuple[int, ...]

    def __post_init__(self):
        rows = self.block.shape[0] if self.block.ndim else 0
        if self.block.shape[1:] != tuple(self.shape[1:]) or rows == 0 or self.shape[0] % rows:
            raise InputError(f"a tiled input of shape {list(self.shape)} cannot repeat a block of shape {list(self.block.shape)}")

    @property
    def dtype(self) -> np.dtype:
        return self.block.dtype

    def write_into(self, out: np.ndarray) -> None:
        rows = self.block.shape[0]
        out.reshape(self.shape[0] // rows, *self.block.shape)[...] = self.block

    def materialize(self) -> np.ndarray:
        out = np.empty(self.shape, self.block.dtype)
        self.write_into(out)
        return out


def is_lazy(value) -> bool:
    """Whether `value` is a lazy input (it writes itself into a buffer) rather than an array."""
    return not isinstance(value, np.ndarray) and hasattr(value, "write_into")


def mapped(value) -> tuple[np.ndarray, np.ndarray] | None:
    """(view, mapping) for a lazy input stored as it is in a mapped file (its `mapped()`: a checkpoint's
    tensor in its stored dtype), else None. `view` is the input, read-only and C-contiguous, inside
    `mapping`, the whole file's map: a backend that can make the map page-locked (the cuda backend
    registers it with the driver) copies from the view where it is, with no host copy at all."""
    get = getattr(value, "mapped", None) if is_lazy(value) else None
    return get() if get is not None else None


def fill(out: np.ndarray, value) -> None:
    """Write an input (an array or a lazy input) into its buffer view."""
    if is_lazy(value):
        value.write_into(out)
    else:
        np.copyto(out, value)


def materialize(value) -> np.ndarray:
    """An input as a C-contiguous array (a lazy input written into a new one)."""
    if not is_lazy(value):
        return np.ascontiguousarray(value)
    out = np.empty(tuple(value.shape), value.dtype)
    value.write_into(out)
    return out


FILL_THREADS = 8
"""Threads that put inputs in place at most: a bound, not a tuned figure (the copies are memory-bound,
so a few threads reach the bus's rate; the H200 run of bench/bench_coldstart.py says how close)."""


class Filler:
    """`fill(out, value)` on a pool of up to `threads` threads (default: the CPUs, at most FILL_THREADS), fed
    as buffers become ready (`add`: the cuda backend adds each pinned chunk's inputs as soon as the chunk
    is pinned, so reading overlaps pinning) and drained by `finish`, which raises the first error (an
    unreadable or overflowing weight) once the rest have stopped."""

    def __init__(self, threads: int | None = None):
        self.pool = ThreadPoolExecutor(threads or min(FILL_THREADS, os.cpu_count() or 1), thread_name_prefix="turnip fill")
        self.futures: list = []

    def add(self, pairs: list[tuple[np.ndarray, object]]) -> None:
        """Queue these fills, largest first."""
        for out, value in sorted(pairs, key=lambda pair: -pair[0].nbytes):
            self.futures.append(self.pool.submit(fill, out, value))

    def finish(self) -> None:
        try:
            for future in self.futures:
                future.result()
        finally:
            for future in self.futures:
                future.cancel()
            self.pool.shutdown(wait=True)


POOL_BYTES = 64 << 20
"""Below this many bytes in all, `fill_all` copies on the calling thread: starting and joining a pool costs
more than a few MB of copies (a decode step's refreshed rows and new activations, every step)."""


def fill_all(pairs: list[tuple[np.ndarray, object]], threads: int | None = None) -> None:
    """`fill(out, value)` for every pair, largest first, on a `Filler`'s threads (one pair, or fewer than
    `POOL_BYTES` in all: no thread)."""
    if len(pairs) <= 1 or threads == 1 or sum(out.nbytes for out, _ in pairs) < POOL_BYTES:
        for out, value in pairs:
            fill(out, value)
        return
    filler = Filler(threads)
    try:
        filler.add(pairs)
    finally:
        filler.finish()


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an .npz file, by key, each header checked before its data (runtime/array_files.py)."""
    expected = "an .npz of input tensors keyed by taskgraph input id"
    arrays = read_arrays(path, "inputs file", expected)
    if not isinstance(arrays, dict):
        raise InputError(f"inputs file '{path}' is an .npy; expected {expected}")
    return arrays


def input_specs(memgraph) -> dict[str, tuple[tuple[int, ...], str]]:
    """Taskgraph input id -> (shape, dtype), from the memgraph's input vertices."""
    return {node.task: (tuple(node.shape), node.dtype) for node in memgraph.nodes if node.op == "input"}


def make_inputs(specs: dict[str, tuple[tuple[int, ...], str]], given: dict[str, np.ndarray] | None, seed: int,
                checked: dict[str, object] | None = None) -> dict[str, np.ndarray]:
    """Check the given arrays against `specs` and draw the missing ones. `checked`: weak references to
    arrays found right for the same specs before (a plan run again), updated with the arrays found
    right now: the very same objects, still alive and of the same shape, are not checked again."""
    given = given or {}
    if given.keys() - specs.keys():
        key = next(key for key in given if key not in specs)
        raise InputError(f"input '{key}' is not an input of the graph (inputs: {', '.join(specs) or 'none'})")
    drawn = [task for task in specs if task not in given] if len(given) < len(specs) else []
    if drawn:
        # standard_normal draws float64 before the cast: 8 bytes per element beside the array itself
        check_host_memory(sum(math.prod(specs[task][0]) * (8 + numpy_dtype(specs[task][1]).itemsize) for task in drawn),
                          "drawing the missing inputs", "give the inputs with --inputs, or run on the sim backend")
    checked = {} if checked is None else checked
    arrays = {}
    for task, value in given.items():
        shape, dtype = specs[task]
        ref = checked.get(task)
        if ref is None or ref() is not value or value.shape != shape:
            value = _checked(task, value, shape, dtype)
            if isinstance(value, np.ndarray):
                checked[task] = weakref.ref(value)
        arrays[task] = value
    for task in drawn:
        arrays[task] = random_input(task, *specs[task], seed)
    return arrays


def random_input(task: str, shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Standard normal values in `dtype` (bfloat16: ml_dtypes' type, rounded to nearest even)."""
    rng = np.random.default_rng([seed, zlib.crc32(task.encode())])
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


def _checked(task: str, array, shape: tuple[int, ...], dtype: str):
    if not isinstance(array, np.ndarray) and not is_lazy(array):
        array = np.asarray(array)
    if tuple(array.shape) != shape:
        raise InputError(f"input '{task}': shape {list(array.shape)} does not match the graph's {list(shape)}")
    if array.dtype.name != dtype:
        raise InputError(f"input '{task}': dtype {array.dtype.name} does not match the graph's {dtype}")
    return array

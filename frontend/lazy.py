"""Lazy tensors: model inputs whose values are made only when written into the buffer that holds them.

A `LazyTensor` is what runtime/inputs.py calls a lazy input: `shape`, `dtype` and `write_into(out)`,
which fills a C-contiguous array of that shape and dtype. `Program.feed` cuts one into blocks by
unit-step slices of its leading axes (`tensor[rows, cols]`, once: a block is not cut again), so a
weight's blocks are read from a checkpoint (`frontend.safetensors.StoredTensor`) or drawn from a seed
(`frontend.workloads.llama.weights.Cycled`) straight into the backend's host storage, and a model is
never held on the host twice. A subclass says how to write its block (`index`) of the whole tensor.
"""

from __future__ import annotations

import copy

import numpy as np


class LazyTensor:
    """A tensor of shape `whole` in `dtype`, or its block `index` (a tuple of unit-step slices)."""

    def __init__(self, whole: tuple[int, ...], dtype: np.dtype, index: tuple[slice, ...] = ()):
        self.whole, self.dtype, self.index = tuple(whole), np.dtype(dtype), index
        self.shape = tuple(len(range(*s.indices(n))) for s, n in zip(index, self.whole)) + self.whole[len(index):]

    def __getitem__(self, index) -> LazyTensor:
        index = index if isinstance(index, tuple) else (index,)
        if self.index or not all(isinstance(s, slice) and s.step in (None, 1) for s in index):
            raise TypeError(f"a lazy tensor is cut once, by unit-step slices, not by {index!r}")
        block = copy.copy(self)
        LazyTensor.__init__(block, self.whole, self.dtype, index)
        return block

    def write_into(self, out: np.ndarray) -> None:
        """Fill `out` (C-contiguous, of `shape` and `dtype`) with the block's values."""
        raise NotImplementedError

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of the whole tensor (an embedding lookup); subclasses make only those rows."""
        return np.ascontiguousarray(self.materialize()[ids])

    def materialize(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.write_into(out)
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self.materialize()
        return array if dtype is None else array.astype(dtype)

"""The batch's KV cache on the host during a generation, in the layout decode steps read
(frontend/workloads/llama/decode.py): per layer, k and v in columns of `block` token rows shared by the
batch, column j = positions j * block .. (j + 1) * block - 1 of every sequence, [block, B, kv_width]
(token-major: a step's last column, `tail` rows long, is a contiguous prefix of its buffer, a view).
Buffers start zeroed and have room for every new token from the start, so a step appends its rows by
writing them, never by copying the cache (a 7b batch of 16 at 2k tokens holds 17 GB of caches).
Rows past a sequence's length are padding the kernels never read.

`dirty[j]` is the set of flat rows (row r of sequence b: r * B + b, in the column seen as [rows * B,
kv_width]) written into column j since `settle()`: a session keeps a column on the GPU between steps
and copies only those (turnip/session.py, `execute(..., refresh=)`; a ragged batch writes rows far
apart, so they are ranges of their own, not one span).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def buffer_rows(capacity: int, block: int) -> int:
    """The token rows of each of a cache's buffers with room for `capacity` tokens: whole columns of
    `block` rows, one at least."""
    return max(1, -(-capacity // block)) * block


class KvCache:
    """Every sequence's cached k and v rows so far, per layer, in columns of `block` rows."""

    def __init__(self, layers: int, batch: int, kv_width: int, block: int, capacity: int, dtype, zeros=np.zeros):
        """Zeroed buffers with room for `capacity` tokens per sequence, none of them held yet; `zeros(shape,
        dtype)` makes each (a session on the cuda backend passes page-locked memory, which its copy
        engines read in place)."""
        rows = buffer_rows(capacity, block)
        zeroed = [tuple(zeros((rows, batch, kv_width), dtype) for _ in "kv") for _ in range(layers)]
        self._hold(zeroed, np.zeros(batch, dtype=np.int64), block)

    @classmethod
    def wrap(cls, layers: Sequence[tuple[np.ndarray, np.ndarray]], lengths: Sequence[int], block: int) -> KvCache:
        """A cache over existing token-major buffers, per layer (k, v) [capacity, B, kv_width], capacity a
        multiple of `block`: its columns are views of them (no copy; pinned buffers stay pinned), and the
        rows the steps write land in them. Sequence b holds lengths[b] rows."""
        capacity, batch, kv_width = layers[0][0].shape
        if capacity % block or any(t.shape != (capacity, batch, kv_width) or not t.flags.c_contiguous for pair in layers for t in pair):
            raise ValueError(f"cache buffers must be contiguous [capacity, B, kv_width] with capacity a multiple of {block}")
        cache = cls.__new__(cls)
        cache._hold(layers, np.asarray(lengths, dtype=np.int64).copy(), block)
        return cache

    def _hold(self, layers: Sequence[tuple[np.ndarray, np.ndarray]], lengths: np.ndarray, block: int) -> None:
        """Take per layer (k, v) [capacity, B, kv_width] buffers as columns of `block` rows (views)."""
        capacity, _, self.kv_width = layers[0][0].shape
        self.block, self.columns, self.lengths = block, capacity // block, lengths
        self.whole = [tuple(pair) for pair in layers]
        """Per layer, (k, v): the token-major buffers [capacity, B, kv_width] the columns are views of."""
        self.buffers = [tuple([t[j * block : (j + 1) * block] for j in range(self.columns)] for t in pair) for pair in layers]
        """Per layer, (k columns, v columns): views [block, B, kv_width] of the layer's buffers."""
        self.dirty: dict[int, set[int]] = {}
        self._views: dict[tuple[int, str, int, int], np.ndarray] = {}
        """`column`'s views, kept: a step that reads the same rows gets the same array objects, which a
        repeated run recognises without checking them again (runtime/api.py)."""

    @classmethod
    def from_prefixes(cls, prefixes: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]], block: int, room: int, dtype,
                      zeros=np.zeros) -> KvCache:
        """A cache holding prefixes[b][layer] = (k, v) [P_b, kv_width] with `room` more rows per sequence."""
        layers = len(prefixes[0])
        kv_width = next((k.shape[1] for seq in prefixes for k, _ in seq), 0)
        longest = max(len(seq[0][0]) for seq in prefixes)
        cache = cls(layers, len(prefixes), kv_width, block, longest + room, dtype, zeros)
        for b, seq in enumerate(prefixes):
            for layer, pair in enumerate(seq):
                for buffers, rows in zip(cache.buffers[layer], pair):
                    for j, start in enumerate(range(0, len(rows), block)):
                        part = rows[start : start + block]
                        buffers[j][: len(part), b] = part
            cache.lengths[b] = len(seq[0][0])
        return cache

    def __len__(self) -> int:
        return len(self.buffers)

    def rows(self, layer: int, which: str, sequence: int, start: int, stop: int, columns: tuple[int, int] | None = None) -> np.ndarray:
        """Sequence `sequence`'s rows at positions [start, stop) of layer `layer`'s `which` ("k" or "v"), and of
        its feature `columns` (all by default): a view [stop - start, width] whose rows lie B * kv_width
        apart, for a prefill to write its k and v rows straight into (`execute(outputs_into=)` pieces).
        `filled` then counts them."""
        first, last = columns if columns is not None else (0, self.kv_width)
        return self.whole[layer]["kv".index(which)][start:stop, sequence, first:last]

    def filled(self, lengths: Sequence[int]) -> None:
        """Each sequence now holds lengths[b] rows from position 0 (written through `rows`)."""
        self.lengths[:] = lengths

    def column(self, layer: int, which: str, j: int, rows: int) -> np.ndarray:
        """The first `rows` rows of column j of `which` ("k" or "v"), [rows, B, kv_width]: a view (the same
        object for the same arguments)."""
        key = (layer, which, j, rows)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self.buffers[layer]["kv".index(which)][j][:rows]
        return view

    def append(self, rows: list[tuple[np.ndarray, np.ndarray]] | None) -> None:
        """One new (k, v) row per sequence and layer: rows[layer] = (k [B, kv_width], v [B, kv_width]);
        None: rows without values (the sim backend computes none), only counted."""
        where = [divmod(int(n), self.block) for n in self.lengths]
        if any(j >= self.columns for j, _ in where):
            raise IndexError("the cache has no room for another row")  # the caller sized it: an internal error
        if rows is None:
            self._written(where)
            return
        together = self.next_rows()
        if together is not None:  # a batch of equal lengths: each column buffer takes one row whole
            for targets, new in zip(together, rows, strict=True):
                for target, values in zip(targets, new):
                    target[...] = values
            self._written(where)
            return
        groups = {}  # column -> (rows, sequences): one fancy-indexed copy per column, not one per sequence
        for b, (j, r) in enumerate(where):
            groups.setdefault(j, ([], []))
            groups[j][0].append(r)
            groups[j][1].append(b)
        groups = {j: (np.asarray(r), np.asarray(b)) for j, (r, b) in groups.items()}
        for buffers, new in zip(self.buffers, rows, strict=True):
            for columns, values in zip(buffers, new):
                for j, (r, b) in groups.items():
                    columns[j][r, b] = values[b]
        self._written(where)

    def next_rows(self) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Where the next `append` puts its rows when every sequence holds as many tokens: per layer (k, v)
        views [B, kv_width] of the one row each column buffer takes, for a step to write its new rows
        into directly (then `appended()` instead of `append`); None for a ragged batch, whose rows lie
        apart."""
        first = int(self.lengths[0])
        if not (self.lengths == first).all():
            return None
        j, r = divmod(first, self.block)
        if j >= self.columns:
            raise IndexError("the cache has no room for another row")  # the caller sized it: an internal error
        return [(k[j][r], v[j][r]) for k, v in self.buffers]

    def appended(self) -> None:
        """The rows `next_rows` pointed at were written (by the step itself): count them as `append` does."""
        self._written([divmod(int(n), self.block) for n in self.lengths])

    def _written(self, where: list[tuple[int, int]]) -> None:
        """Sequence b's row r of column j (where[b]) was written: dirty until `settle`; one more row each."""
        batch = len(self.lengths)
        for b, (j, r) in enumerate(where):
            self.dirty.setdefault(j, set()).add(r * batch + b)
        self.lengths += 1

    def written(self, j: int, rows: int) -> list[tuple[int, int]]:
        """The flat rows of column j's first `rows` rows written since `settle()`, as (start, stop) ranges."""
        limit = rows * len(self.lengths)
        ranges: list[tuple[int, int]] = []
        for flat in sorted(i for i in self.dirty.get(j, ()) if i < limit):
            if ranges and ranges[-1][1] == flat:
                ranges[-1] = (ranges[-1][0], flat + 1)
            else:
                ranges.append((flat, flat + 1))
        return ranges

    def settle(self) -> None:
        """What was written is now where the next step reads it (a run used it): nothing is dirty."""
        self.dirty = {}

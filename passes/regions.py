"""The last-writer sweep: which earlier writes does each node overwrite, byte range by byte range.

`Overwrites(arrays)` visits the nodes in position order. Per space it keeps the last
writer of every byte as sorted disjoint segments [start, end) -> writer; a node that writes a
range first reports every segment it meets (writer, and the part it covers), then becomes their
last writer, trimming or splitting them. An empty range meets and writes nothing. Records come in
node order, and for one node in address order. The memory passes and the verifier ask their
happens-before questions about these records (passes/ancestors.py).

Compiled with numba (cached on disk beside this file): at 280k nodes the sweep is milliseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from passes.compact import NOWHERE, MemArrays, distinct


class Overwrites:
    """Record k: node `node[k]` overwrites [start[k], end[k]) of `space`, last written by `writer[k]`.

    `ptr` indexes the records by node (CSR); `last_writers` queries the last writer of every byte at the end.
    """

    def __init__(self, arrays: MemArrays) -> None:
        spaces = distinct(arrays.space[arrays.space != NOWHERE])
        self.spaces = {int(s): k for k, s in enumerate(spaces)}
        slot = np.searchsorted(spaces, arrays.space)
        slot[arrays.space == NOWHERE] = -1
        ptr, self.writer, self.start, self.end, *final = _sweep(slot.astype(np.int64), arrays.start, arrays.end, len(spaces))
        self.ptr = ptr
        self.node = np.repeat(np.arange(len(arrays), dtype=np.int64), np.diff(ptr))
        self._starts, self._ends, self._owners, self._counts = final

    def last_writers(self, space: int, start: int, end: int) -> list[tuple[int, int, int]]:
        """(start, end, writer) of the final segments of `space` that meet [start, end), ascending."""
        k = self.spaces.get(space)
        if k is None or start >= end:
            return []
        c = self._counts[k]
        starts, ends, owners = self._starts[k, :c], self._ends[k, :c], self._owners[k, :c]
        lo = max(int(np.searchsorted(starts, start, side="right")) - 1, 0)
        hi = int(np.searchsorted(starts, end, side="left"))
        return [(int(starts[i]), int(ends[i]), int(owners[i])) for i in range(lo, hi) if ends[i] > start]


@njit(cache=True)
def _sweep(slot, start, end, nspaces):
    n = slot.shape[0]
    cap = 16
    starts = np.zeros((nspaces, cap), np.int64)
    ends = np.zeros((nspaces, cap), np.int64)
    owners = np.zeros((nspaces, cap), np.int64)
    counts = np.zeros(nspaces, np.int64)
    ptr = np.zeros(n + 1, np.int64)
    out = np.zeros((4, 1024), np.int64)
    m = 0
    for w in range(n):
        k = slot[w]
        lo_addr, hi_addr = start[w], end[w]
        if k >= 0 and lo_addr < hi_addr:
            if counts[k] + 3 > cap:
                cap *= 2
                starts, ends, owners = _grow(starts, cap), _grow(ends, cap), _grow(owners, cap)
            c = counts[k]
            lo = max(np.searchsorted(starts[k, :c], lo_addr, side="right") - 1, 0)
            hi = lo
            while hi < c and starts[k, hi] < hi_addr:
                if ends[k, hi] > lo_addr:
                    if m == out.shape[1]:
                        out = _grow(out, 2 * m)
                    out[1, m] = owners[k, hi]
                    out[2, m], out[3, m] = max(starts[k, hi], lo_addr), min(ends[k, hi], hi_addr)
                    m += 1
                hi += 1
            counts[k] = _write(starts[k], ends[k], owners[k], c, lo, hi, lo_addr, hi_addr, w)
        ptr[w + 1] = m
    return ptr, out[1, :m].copy(), out[2, :m].copy(), out[3, :m].copy(), starts, ends, owners, counts


@njit(cache=True)
def _write(starts, ends, owners, c, lo, hi, lo_addr, hi_addr, w):
    """Replace segments [lo, hi) by what survives of them around [lo_addr, hi_addr) plus the new one."""
    piece_s = np.empty(4, np.int64)
    piece_e = np.empty(4, np.int64)
    piece_o = np.empty(4, np.int64)
    p = 0
    if hi > lo and starts[lo] < lo_addr:
        piece_s[p], piece_e[p], piece_o[p] = starts[lo], min(ends[lo], lo_addr), owners[lo]
        p += 1
    piece_s[p], piece_e[p], piece_o[p] = lo_addr, hi_addr, w
    p += 1
    if hi > lo and ends[hi - 1] > hi_addr:
        piece_s[p], piece_e[p], piece_o[p] = hi_addr, ends[hi - 1], owners[hi - 1]
        p += 1
    shift = p - (hi - lo)
    if shift > 0:
        for i in range(c - 1, hi - 1, -1):
            starts[i + shift], ends[i + shift], owners[i + shift] = starts[i], ends[i], owners[i]
    elif shift < 0:
        for i in range(hi, c):
            starts[i + shift], ends[i + shift], owners[i + shift] = starts[i], ends[i], owners[i]
    for i in range(p):
        starts[lo + i], ends[lo + i], owners[lo + i] = piece_s[i], piece_e[i], piece_o[i]
    return c + shift


@njit(cache=True)
def _grow(a, cap):
    b = np.zeros((a.shape[0], cap), a.dtype)
    b[:, : a.shape[1]] = a
    return b

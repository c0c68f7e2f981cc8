"""The last-writer sweep: which earlier writes does each node overwrite, byte range by byte range.

`Overwrites(arrays)` visits the nodes in position order. Per space it keeps the last
writer of every byte as sorted disjoint segments [start, end) -> writer; a node that writes a
range first reports every segment it meets (writer, and the part it covers), then becomes their
last writer, trimming or splitting them. An empty range meets and writes nothing. Records come in
node order, and for one node in address order. The memory passes and the verifier ask their
happens-before questions about these records (turnip_ir/ancestors.py).

Compiled with numba (cached on disk beside this file): at 280k nodes the sweep is milliseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from turnip_ir.memarrays import NOWHERE, MemArrays, distinct


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
    """Segments per space in rows of 2-D arrays (`counts` used); plain loops keep numba's compile short."""
    n = slot.shape[0]
    starts = np.zeros((nspaces, 16), np.int64)
    ends = np.zeros((nspaces, 16), np.int64)
    owners = np.zeros((nspaces, 16), np.int64)
    counts = np.zeros(nspaces, np.int64)
    ptr = np.zeros(n + 1, np.int64)
    out = np.zeros((3, 1024), np.int64)
    m = 0
    for w in range(n):
        k, lo_addr, hi_addr = slot[w], start[w], end[w]
        if k >= 0 and lo_addr < hi_addr:
            if counts[k] + 3 > starts.shape[1]:
                starts, ends, owners = _grow(starts), _grow(ends), _grow(owners)
            c = counts[k]
            lo = _last_at_or_before(starts, k, c, lo_addr)
            hi = lo
            while hi < c and starts[k, hi] < hi_addr:
                if ends[k, hi] > lo_addr:
                    if m == out.shape[1]:
                        out = _grow(out)
                    out[0, m] = owners[k, hi]
                    out[1, m] = max(starts[k, hi], lo_addr)
                    out[2, m] = min(ends[k, hi], hi_addr)
                    m += 1
                hi += 1
            counts[k] = _write(starts, ends, owners, k, c, lo, hi, lo_addr, hi_addr, w)
        ptr[w + 1] = m
    return ptr, out[0, :m].copy(), out[1, :m].copy(), out[2, :m].copy(), starts, ends, owners, counts


@njit(cache=True)
def _last_at_or_before(starts, k, c, addr):
    """The last segment of row k starting at or before `addr` (0 when none does)."""
    lo, hi = 0, c
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[k, mid] <= addr:
            lo = mid + 1
        else:
            hi = mid
    return max(lo - 1, 0)


@njit(cache=True)
def _write(starts, ends, owners, k, c, lo, hi, lo_addr, hi_addr, w):
    """Replace segments [lo, hi) of row k by what survives of them around [lo_addr, hi_addr) plus the new one."""
    keep_head = hi > lo and starts[k, lo] < lo_addr
    keep_tail = hi > lo and ends[k, hi - 1] > hi_addr
    head_s = head_e = head_o = tail_e = tail_o = 0
    if keep_head:
        head_s, head_e, head_o = starts[k, lo], min(ends[k, lo], lo_addr), owners[k, lo]
    if keep_tail:
        tail_e, tail_o = ends[k, hi - 1], owners[k, hi - 1]
    pieces = 1 + int(keep_head) + int(keep_tail)
    shift = pieces - (hi - lo)
    if shift > 0:
        for i in range(c - 1, hi - 1, -1):
            starts[k, i + shift], ends[k, i + shift], owners[k, i + shift] = starts[k, i], ends[k, i], owners[k, i]
    elif shift < 0:
        for i in range(hi, c):
            starts[k, i + shift], ends[k, i + shift], owners[k, i + shift] = starts[k, i], ends[k, i], owners[k, i]
    at = lo
    if keep_head:
        starts[k, at], ends[k, at], owners[k, at] = head_s, head_e, head_o
        at += 1
    starts[k, at], ends[k, at], owners[k, at] = lo_addr, hi_addr, w
    if keep_tail:
        starts[k, at + 1], ends[k, at + 1], owners[k, at + 1] = hi_addr, tail_e, tail_o
    return c + shift


@njit(cache=True)
def _grow(a):
    b = np.zeros((a.shape[0], 2 * a.shape[1]), np.int64)
    for r in range(a.shape[0]):
        for i in range(a.shape[1]):
            b[r, i] = a[r, i]
    return b

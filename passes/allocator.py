"""The per-GPU allocator the offload planner simulates with: segments over [0, capacity), 256-byte aligned.

Memory is a sorted list of segments that cover [0, capacity). A segment is either free, remembering the
step at which it was last freed, or held by one tensor; free neighbours merge only when freed at the
same step, so every free byte keeps its age. The starts of the free segments are also kept in a sorted
list of their own (`free_starts`), so a search visits the free segments only: CPU storage holds tens of
thousands of held regions (inputs, outputs, live offloads) around a few dozen free ones. Two choices
make the memgraph good:

- with room, `place_free` takes the fitting placement whose covered free segments were freed longest ago,
  so the memory edges it implies point far into the past (loose constraints for the runtime);
- without room, `best_window` picks the contiguous range of free or unpinned segments whose tensors are
  cheapest to evict, by a cost the planner gives per tensor (Belady with costs: bytes moved over steps
  until they are due).

`fit` places several tensors at once (an op's reloads and output) on a copy, so a planner can try
layouts and keep the first that works without emitting anything for the ones that fail.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable

ALIGN = 256
FREE = -1
NEVER = 1 << 62
"""A next use that never comes."""


def aligned(nbytes: int, align: int = ALIGN) -> int:
    """Bytes rounded up to `align` (at least one unit, so every tensor has a place)."""
    return max(align, (nbytes + align - 1) // align * align)


PLACEMENTS = ("loosest", "first-fit")
"""`loosest`: the free placement freed longest ago (the default); `first-fit`: the lowest one (for ablations)."""


class DeviceMemory:
    """Segments of one GPU: `starts`, `ends`, `owners` (a tensor or FREE), `stamps` (step last freed)."""

    def __init__(self, capacity: int, placement: str = "loosest") -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement '{placement}' (known: {', '.join(PLACEMENTS)})")
        self.first_fit = placement == "first-fit"
        self.capacity = capacity
        self.starts = [0]
        self.ends = [capacity]
        self.owners = [FREE]
        self.stamps = [-1]
        self.free_starts = [0]
        """Starts of the free segments, ascending: the free ones among `starts`."""
        self.where: dict[int, int] = {}
        """tensor -> start offset of its segment."""
        self.free = capacity
        """Free bytes in all: when fewer than a request, no free run can hold it (no scan needed)."""

    def place_free(self, size: int) -> int | None:
        """The start of the loosest free placement of `size` bytes, or None when no free run fits.

        A placement starts at a free segment and covers free segments up to `size` bytes; its age is the
        newest stamp it covers. Ties go to the lowest start. A long run of free segments is searched
        once with a sliding window (`_loosest_in_run`), so a search is linear in the free segments (and
        one bisect per run of them to find it among all segments).
        """
        if size > self.free:
            return None
        best_stamp, best_start = NEVER, None  # stamps are steps, below NEVER
        starts, ends, owners, stamps, free_starts = self.starts, self.ends, self.owners, self.stamps, self.free_starts
        n, k = len(starts), 0
        while k < len(free_starts):
            i = stop = bisect_left(starts, free_starts[k])
            while stop + 1 < n and owners[stop + 1] == FREE:
                stop += 1
            k += stop - i + 1  # the run's free segments are the next entries of free_starts
            if ends[stop] - starts[i] >= size:
                if stop == i:  # most runs are one segment
                    stamp, start = stamps[i], starts[i]
                elif stop - i < SHORT_RUN:
                    stamp, start = _loosest_in_short_run(starts, ends, stamps, i, stop, size, self.first_fit)
                else:
                    stamp, start = _loosest_in_run(starts, ends, stamps, i, stop, size, self.first_fit)
                if self.first_fit:
                    return start
                if stamp < best_stamp:
                    best_stamp, best_start = stamp, start
        return best_start

    def freed_at(self, start: int, size: int) -> int:
        """The newest step at which the free segments covering [start, start + size) were freed (-1: never used)."""
        i, end, stamp = _find(self.starts, start), start + size, -1
        while i < len(self.starts) and self.starts[i] < end:
            assert self.owners[i] == FREE, "freed_at asked about a held segment"
            stamp = max(stamp, self.stamps[i])
            i += 1
        return stamp

    def best_window(self, size: int, pinned: set[int], cost: Callable[[int], int]) -> int | None:
        """The start of the range to clear for `size` bytes, evicting unpinned tensors; None if none exists.

        The window minimises the summed `cost(tensor)` of the tensors it evicts (free bytes cost nothing),
        then its start. Windows start at segment starts and never cross a pinned tensor; within each run
        of unpinned segments two pointers slide over it, so a search is linear in the segments.
        """
        starts, ends, owners = self.starts, self.ends, self.owners
        n = len(starts)
        costs = [0 if owner == FREE or owner in pinned else cost(owner) for owner in owners]
        best = None
        run = 0
        while run < n:
            stop = run
            while stop < n and owners[stop] not in pinned:
                stop += 1
            j, total = run, 0
            for i in range(run, stop):
                end = starts[i] + size
                while j < stop and (j == i or ends[j - 1] < end):
                    total += costs[j]
                    j += 1
                if ends[j - 1] < end:
                    break
                if best is None or total < best[0]:
                    best = (total, starts[i])
                total -= costs[i]
            run = stop + 1
        return None if best is None else best[1]

    def fit(self, items: list[tuple[int, int]], pinned: set[int], cost: Callable[[int], int], step: int):
        """Place `items` ((tensor, size) pairs) in turn, each in free room or the cheapest window.

        Returns (the tensors evicted, in order; each item's start), or None when pinned tensors and the
        items already placed leave no room. It changes this memory: call it on a `copy()`.
        """
        pinned = set(pinned)
        victims: list[int] = []
        starts: dict[int, int] = {}
        for tensor, size in items:
            start = self.place_free(size)
            if start is None:
                start = self.best_window(size, pinned, cost)
                if start is None:
                    return None
                for victim in self.holders(start, size):
                    self.release(victim, step)
                    victims.append(victim)
            self.take(start, size, tensor)
            pinned.add(tensor)
            starts[tensor] = start
        return victims, starts

    def grow_for(self, size: int, fresh: bool = False) -> int:
        """Extend the capacity so that `size` bytes fit at the top, and return where they start: in the
        trailing free segment, lengthened as needed, or (`fresh`, or no such segment) in a new segment
        past the end, bytes nothing used before. For CPU storage, which grows as the plan needs it."""
        if self.owners[-1] == FREE and (not fresh or self.stamps[-1] == -1):  # -1: never used
            start = self.starts[-1]
            extra = max(0, start + size - self.ends[-1])
            self.ends[-1] += extra
        else:
            start, extra = self.capacity, size
            for seq, item in ((self.starts, start), (self.ends, start + size), (self.owners, FREE), (self.stamps, -1)):
                seq.append(item)
            self.free_starts.append(start)  # past every segment: the list stays sorted
        self.capacity += extra
        self.free += extra
        return start

    def copy(self) -> DeviceMemory:
        twin = DeviceMemory(self.capacity, "first-fit" if self.first_fit else "loosest")
        twin.starts, twin.ends, twin.owners, twin.stamps = list(self.starts), list(self.ends), list(self.owners), list(self.stamps)
        twin.free_starts = list(self.free_starts)
        twin.where = dict(self.where)
        twin.free = self.free
        return twin

    def holders(self, start: int, size: int) -> list[int]:
        """Tensors held in [start, start + size)."""
        starts, owners = self.starts, self.owners
        end = start + size
        if start >= self.capacity:
            return []
        i = max(0, bisect_right(starts, start) - 1)  # the segment containing `start`
        j = bisect_left(starts, end, i)  # the first segment at or past `end`
        return [o for o in owners[i:j] if o != FREE]

    def take(self, start: int, size: int, tensor: int) -> None:
        """Give [start, start + size), which must be free, to `tensor`."""
        self._carve(start, start + size, tensor, -1)
        self.where[tensor] = start
        self.free -= size

    def release(self, tensor: int, step: int) -> None:
        """Free the segment of `tensor`, stamping it with `step`; merge it with free neighbours of that stamp.

        Neighbours freed at other steps stay apart: merged under the newer stamp, an older region would
        look just freed, and the loosest placement would miss it.
        """
        starts, ends, owners, stamps = self.starts, self.ends, self.owners, self.stamps
        start = self.where.pop(tensor)
        i = bisect_left(starts, start)  # a held segment starts exactly there
        owners[i], stamps[i] = FREE, step
        self.free += ends[i] - start
        insort(self.free_starts, start)
        for k in (i + 1, i):
            if 0 < k < len(starts) and owners[k] == FREE == owners[k - 1] and stamps[k] == stamps[k - 1]:
                ends[k - 1] = ends[k]
                del self.free_starts[bisect_left(self.free_starts, starts[k])]
                for seq in (starts, ends, owners, stamps):
                    del seq[k]

    def _carve(self, start: int, end: int, owner: int, stamp: int) -> None:
        i = _find(self.starts, start)
        free_starts = self.free_starts
        if self.starts[i] == start and self.ends[i] == end and self.owners[i] == FREE:
            self.owners[i], self.stamps[i] = owner, stamp  # the common case: a free segment of the exact size
            del free_starts[bisect_left(free_starts, start)]
            return
        j = i
        while self.ends[j] < end:
            j += 1
        assert all(o == FREE for o in self.owners[i : j + 1]), "allocator placed over a live tensor"
        new = [(self.starts[i], start, FREE, self.stamps[i])] if self.starts[i] < start else []
        new.append((start, end, owner, stamp))
        if self.ends[j] > end:
            new.append((end, self.ends[j], FREE, self.stamps[j]))
        for seq, k in ((self.starts, 0), (self.ends, 1), (self.owners, 2), (self.stamps, 3)):
            seq[i : j + 1] = [item[k] for item in new]
        # segments i..j were free: their starts in [start, end) leave the index, the free tail's start joins it
        free_starts[bisect_left(free_starts, start) : bisect_left(free_starts, end)] = [end] if new[-1][2] == FREE else []

    def used(self) -> int:
        """Bytes held by tensors."""
        return sum(e - s for s, e, o in zip(self.starts, self.ends, self.owners) if o != FREE)


def _loosest_in_run(starts, ends, stamps, first: int, last: int, size: int, first_fit: bool) -> tuple[int, int]:
    """(age, start) of the loosest placement of `size` bytes in the free run first..last, which holds it.

    As the start moves right the placement's last segment only moves right, so the window's newest
    stamp is kept in a deque of decreasing stamps (the sliding-window maximum).
    """
    best = None
    window: deque[int] = deque()
    j = first - 1
    for i in range(first, last + 1):
        end = starts[i] + size
        while j < i or (ends[j] < end and j < last):
            j += 1
            while window and stamps[window[-1]] <= stamps[j]:
                window.pop()
            window.append(j)
        if ends[j] < end:
            break
        while window[0] < i:
            window.popleft()
        stamp = stamps[window[0]]
        if best is None or stamp < best[0]:
            best = (stamp, starts[i])
            if first_fit:
                break
    return best


SHORT_RUN = 8
"""Runs of fewer segments are searched from each start afresh: quadratic, but cheaper than a deque."""


def _loosest_in_short_run(starts, ends, stamps, first: int, last: int, size: int, first_fit: bool) -> tuple[int, int]:
    """`_loosest_in_run` for a short run: the newest stamp of each placement taken afresh."""
    best = None
    for i in range(first, last + 1):
        end, stamp, j = starts[i] + size, stamps[i], i
        while ends[j] < end and j < last:
            j += 1
            if stamps[j] > stamp:
                stamp = stamps[j]
        if ends[j] < end:
            break
        if best is None or stamp < best[0]:
            best = (stamp, starts[i])
            if first_fit:
                break
    return best


def _find(starts: list[int], offset: int) -> int:
    """Index of the segment containing `offset`."""
    return bisect_right(starts, offset) - 1

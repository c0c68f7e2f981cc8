"""The compiled sweeps the memory passes and the verifier stand on, against brute force: the last-writer
sweep against a per-byte map, the ancestor sweep against full ancestor sets (on graphs long enough
that bit ids are recycled many times), and the arrays a pipeline shares between passes against
arrays rebuilt from the graph."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from turnip_ir.ancestors import ancestor_answers, implied_predecessors
from turnip_ir.memarrays import NOWHERE, MemArrays, csr_union
from passes.allocator import FREE, DeviceMemory
from passes.insert_memory_deps import insert_memory_deps
from passes.insert_offload import insert_offload, minimum_budget
from passes.minimize_memory_deps import minimize_memory_deps
from passes.place_devices import place_devices
from passes.reduce_memory_deps import reduce_memory_deps
from turnip_ir.last_writer import Overwrites
from tools.random_graphs import random_taskgraph


def _csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.cumsum([0] + [len(row) for row in rows]).astype(np.int64)
    return ptr, np.array([x for row in rows for x in row], dtype=np.int64)


class _Writes:
    def __init__(self, regions):
        self.space, self.start, self.end = (np.array([r[k] for r in regions], dtype=np.int64) for k in range(3))

    def __len__(self) -> int:
        return len(self.space)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([NOWHERE, -1, 0, 1]), st.integers(0, 60), st.integers(0, 20)), max_size=80))
def test_each_write_reports_exactly_the_last_writers_it_overwrites(writes):
    regions = [(space, start, start + length) for space, start, length in writes]
    over = Overwrites(_Writes(regions))
    owner: dict[tuple[int, int], int] = {}
    for w, (space, start, end) in enumerate(regions):
        got = [(int(over.writer[k]), int(over.start[k]), int(over.end[k])) for k in range(over.ptr[w], over.ptr[w + 1])]
        want: list[tuple[int, int, int]] = []
        if space != NOWHERE:
            for byte in range(start, end):
                x = owner.get((space, byte))
                if x is not None and want and want[-1][0] == x and want[-1][2] == byte:
                    want[-1] = (x, want[-1][1], byte + 1)
                elif x is not None:
                    want.append((x, byte, byte + 1))
                owner[space, byte] = w
        assert sorted(got, key=lambda r: r[1]) == want
    for space in (-1, 0, 1):
        final = {byte: x for (s, byte), x in owner.items() if s == space}
        got = {byte: x for s, e, x in over.last_writers(space, 0, 100) for byte in range(s, e)}
        assert got == final


def _random_dag(rng: random.Random, n: int, reach: int) -> list[list[int]]:
    return [[rng.randrange(max(0, w - reach), w) for _ in range(rng.randint(0, min(w, 3)))] if w else [] for w in range(n)]


def _ancestors(preds: list[list[int]]) -> list[int]:
    sets = [0] * len(preds)
    for w, ps in enumerate(preds):
        for p in ps:
            sets[w] |= sets[p] | (1 << p)
    return sets


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(60, 60), (3000, 25)]))
def test_ancestor_answers_match_full_ancestor_sets(seed, shape):
    n, reach = shape  # the long graphs watch few nodes at once but thousands over time: ids are recycled
    rng = random.Random(seed)
    preds = _random_dag(rng, n, reach)
    asks = [[rng.randrange(max(0, w - 2 * reach), min(n, w + 3)) for _ in range(rng.randint(0, 3))] for w in range(n)]
    sets = _ancestors(preds)
    got = ancestor_answers(*_csr(preds), *_csr(asks))
    assert got.tolist() == [bool(sets[w] >> u & 1) for w in range(n) for u in asks[w]]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_implied_predecessors_are_those_another_predecessor_reaches(seed):
    rng = random.Random(seed)
    preds = _random_dag(rng, 200, 30)
    data = [[p for p in ps if rng.random() < 0.5] for ps in preds]
    mem = [sorted(set(ps) - set(data[w])) for w, ps in enumerate(preds)]
    ptr, idx = csr_union(*_csr(data), *_csr(mem), descending=True)
    implied = implied_predecessors(ptr, idx, *_csr(mem))
    sets = _ancestors(preds)
    for w in range(len(preds)):
        row = idx[ptr[w] : ptr[w + 1]].tolist()
        for k, p in enumerate(row):
            if p in mem[w]:
                assert implied[ptr[w] + k] == any(sets[q] >> p & 1 for q in row if q != p)


def test_arrays_shared_by_the_memory_passes_stay_equal_to_the_graph():
    graph = place_devices(random_taskgraph(3, tasks=300, devices=3, sizes=(8, 16, 24), window=10))
    memgraph = insert_offload(graph, int(1.2 * minimum_budget(graph)))
    arrays = MemArrays.build(memgraph.nodes)
    for step in (insert_memory_deps, minimize_memory_deps, reduce_memory_deps):
        step(memgraph, arrays)
        fresh = MemArrays.build(memgraph.nodes)
        assert np.array_equal(arrays.mem_ptr, fresh.mem_ptr) and np.array_equal(arrays.mem_idx, fresh.mem_idx)
    assert len(arrays.mem_idx) > 0


def _loosest_brute_force(memory, size: int):
    """The seed's definition of the loosest free placement: from every free segment, cover free
    segments until `size` bytes; the newest stamp covered is its age; the oldest wins, then the lowest."""
    segments = list(zip(memory.starts, memory.ends, memory.owners, memory.stamps))
    best = None
    for i, (start, _, owner, _) in enumerate(segments):
        if owner != FREE:
            continue
        covered = [s for s in segments[i:] if s[0] < start + size]
        if covered[-1][1] < start + size or any(s[2] != FREE for s in covered):
            continue
        age = max(s[3] for s in covered)
        if best is None or age < best[0]:
            best = (age, start)
            if memory.first_fit:
                break
    return None if best is None else best[1]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["loosest", "first-fit"]))
def test_place_free_is_the_loosest_placement_on_long_and_short_free_runs(seed, placement):
    rng = random.Random(seed)
    memory = DeviceMemory(256 * 64, placement)
    live, step = [], 0
    for tensor in range(400):
        size = 256 * rng.choice([1, 1, 1, 2, 3])
        if rng.random() < (0.3 if tensor < 200 else 0.7) and live:
            memory.release(live.pop(rng.randrange(len(live))), step)  # many steps: many free runs of mixed stamps
            step += 1
        query = 256 * rng.randint(1, 24)
        assert memory.place_free(query) == _loosest_brute_force(memory, query)
        if tensor >= 200 and rng.random() < 0.6:
            continue  # the second half frees more than it takes: long free runs of mixed stamps
        start = memory.place_free(size)
        if start is not None:
            memory.take(start, size, tensor)
            live.append(tensor)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["loosest", "first-fit"]))
def test_a_growing_storage_places_as_the_definition_says_and_indexes_every_free_segment(seed, placement):
    """CPU storage as the planner uses it: it starts empty, an offload takes the loosest free placement or
    grows at the top, an input always grows with fresh bytes; regions of many sizes die at many steps."""
    rng = random.Random(seed)
    memory = DeviceMemory(0, placement)
    live = []
    for tensor in range(300):
        if live and rng.random() < 0.45:
            memory.release(live.pop(rng.randrange(len(live))), tensor)
        size = 256 * rng.choice([1, 2, 3, 5, 8])
        start = memory.place_free(size)
        assert start == _loosest_brute_force(memory, size)
        if start is None or rng.random() < 0.2:
            start = memory.grow_for(size, fresh=rng.random() < 0.3)
        memory.take(start, size, tensor)
        live.append(tensor)
        assert memory.free_starts == [s for s, o in zip(memory.starts, memory.owners) if o == FREE]
        assert memory.copy().free_starts == memory.free_starts
    assert memory.starts == sorted(memory.starts) and memory.ends[:-1] == memory.starts[1:]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_holders_are_the_tensors_overlapping_the_range(seed):
    """`holders` bisects to the range; the definition looks at every segment."""
    rng = random.Random(seed)
    memory = DeviceMemory(256 * 32)
    live = []
    for tensor in range(120):
        if rng.random() < 0.4 and live:
            memory.release(live.pop(rng.randrange(len(live))), tensor)
        size = 256 * rng.randint(1, 3)
        start = memory.place_free(size)
        if start is not None:
            memory.take(start, size, tensor)
            live.append(tensor)
        start, size = rng.randint(-300, memory.capacity + 300), rng.randint(1, 256 * 8)
        segments = zip(memory.starts, memory.ends, memory.owners)
        assert memory.holders(start, size) == [o for s, e, o in segments if s < start + size and e > start and o != FREE]

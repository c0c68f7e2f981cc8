"""`execute(outputs_into=)` in pieces: rows of an output written into strided views of the caller's buffers
(a batched prefill's k and v rows of each sequence, into a token-major cache: issue 44).

A small graph stands for a prefill: each "layer" computes a k block of several sequences' rows (an
output) and goes on. At its minimum budget the plan leaves one k on the GPU, reloads one for a later
reader and ends with others in host storage; with a wide tail after the layers (`prefill_like(wide=)`),
as a prefill's MLP and LM head under a tight budget, it evicts every k, reloading one. On the cpu
backend and on numba-cuda's simulator (the cuda backend's own Python; its 2-D copies done by numpy), in
random orders: every piece lands exactly where it should, nothing else in the buffers (filled with a
sentinel) changes, the summary counts what the backend wrote straight and what was copied on the host
after, and bad pieces are one-line errors before anything runs. The cuda backend writes an offloaded
output's pieces within its first offload's work (its storage copy only where a reload reads it), a log
of its driver calls shows, so nothing is copied on the host, whatever the budget. The driver's real 2-D
copy (cuMemcpy2DAsync) runs in the `gpu` test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from runtime import execute
from runtime.backends.cuda import simulated
from runtime.inputs import input_specs, make_inputs
from turnip_ir.errors import InputError
from turnip_ir.taskgraph import TaskGraph

LENGTHS = (3, 1, 4)
"""Rows of the three sequences packed end to end in each k block."""
WIDTH = 16
CAPACITY = 6
"""Rows of each sequence's place in the cache; sequence b's rows go to cache[AT : AT + LENGTHS[b], b]."""
AT = 1
SENTINEL = -7.0


def prefill_like(layers: int = 4, width: int = WIDTH, dtype: str = "float32", wide: int = 0) -> TaskGraph:
    """Per layer a k block (an output) from x, and x updated from it; y reads k0 again at the end, after
    a tail of two matmuls through `wide` times the width when `wide` (whose working set evicts every k)."""
    g = TaskGraph(devices=1)
    x = g.input((sum(LENGTHS), width), dtype, device=0, id="x")
    ks = []
    for layer in range(layers):
        k = g.matmul(x, g.input((width, width), dtype, device=0, id=f"w{layer}"), device=0, id=f"k{layer}")
        x = g.add(g.relu(k, device=0, id=f"r{layer}"), x, device=0, id=f"x{layer}")
        ks.append(k)
    if wide:
        up = g.matmul(x, g.input((width, wide * width), dtype, device=0, id="up"), device=0, id="t")
        x = g.matmul(up, g.input((wide * width, width), dtype, device=0, id="down"), device=0, id="u")
    g.output(*ks, g.add(x, ks[0], device=0, id="y"))
    return g


def tight_plan(graph: TaskGraph, holders: set[str] = frozenset({"kernel", "reload", "offload"})):
    """The graph at its minimum budget, and its inputs; the plan holds its k outputs at the end in
    `holders` (the ops of the nodes holding them: each of three places by default)."""
    memgraph = compile_taskgraph(graph, int(minimum_budget(place_devices(graph, 0))) // 256 * 256 + 256)
    held = held_by(memgraph)
    assert {held[task] for task in held if task.startswith("k")} == holders, held
    return memgraph, make_inputs(input_specs(memgraph), None, 0)


def evicting_plan(width: int = WIDTH, dtype: str = "float32"):
    """A plan that offloads every k (k0 is reloaded for y and held so at the end, the others end in storage)."""
    memgraph, inputs = tight_plan(prefill_like(width=width, dtype=dtype, wide=3), {"reload", "offload"})
    assert all(first_offload(memgraph, task) is not None for task in memgraph.outputs if task.startswith("k"))
    return memgraph, inputs


def held_by(memgraph) -> dict[str, str]:
    """Output task -> the op of the node that holds it at the end (offload: in host storage)."""
    nodes = memgraph.by_id()
    return {task: nodes[node_id].op for task, node_id in memgraph.outputs.items()}


def first_offload(memgraph, task: str) -> tuple[int, bool] | None:
    """(index of the first node offloading `task`, whether a reload reads that node's storage), or None."""
    nodes = memgraph.nodes
    offloads = [i for i, node in enumerate(nodes) if node.op == "offload" and node.task == task]
    if not offloads:
        return None
    offload = nodes[offloads[0]].id
    return offloads[0], any(node.op == "reload" and offload in node.inputs for node in nodes)


def caches_and_pieces(tasks, width: int = WIDTH, dtype=np.float32, pinned=None):
    """A token-major cache [CAPACITY, B, width] per task, filled with SENTINEL, and each sequence's rows of
    the task's block as a piece into it. `pinned(nbytes)`: where the caches live (a uint8 array)."""
    caches, into = {}, {}
    for task in tasks:
        shape = (CAPACITY, len(LENGTHS), width)
        if pinned is None:
            cache = np.empty(shape, dtype)
        else:
            cache = pinned(int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype).reshape(shape)
        cache[...] = SENTINEL
        caches[task] = cache
        into[task] = [(start, start + n, cache[AT : AT + n, b]) for b, (start, n) in enumerate(zip(np.cumsum((0, *LENGTHS[:-1])), LENGTHS))]
    return caches, into


def assert_landed(caches: dict, want: dict) -> None:
    """Each sequence's rows of each block are in its place of the cache, and every other value is SENTINEL."""
    for task, cache in caches.items():
        expected = np.full_like(cache, SENTINEL)
        start = 0
        for b, n in enumerate(LENGTHS):
            expected[AT : AT + n, b] = want[task][start : start + n]
            start += n
        np.testing.assert_array_equal(cache, expected, err_msg=task)


def piece_bytes(tasks) -> int:
    return len(tasks) * sum(LENGTHS) * WIDTH * 4


@pytest.fixture(scope="module")
def plan():
    memgraph, inputs = tight_plan(prefill_like())
    return memgraph, inputs, execute(memgraph, "cpu", inputs=inputs).outputs


@pytest.fixture(scope="module")
def evicting():
    memgraph, inputs = evicting_plan()
    return memgraph, inputs, execute(memgraph, "cpu", inputs=inputs).outputs


@pytest.mark.parametrize("seed", range(3))
def test_pieces_land_exactly_on_the_cpu_backend_in_random_orders(plan, seed):
    memgraph, inputs, want = plan
    ks = [task for task in want if task.startswith("k")]
    caches, into = caches_and_pieces(ks)
    result = execute(memgraph, "cpu", order="random", seed=seed, jitter=2e-4, inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    assert sorted(result.outputs) == ["y"]  # a pieced output is left out
    np.testing.assert_array_equal(result.outputs["y"], want["y"])
    # the cpu backend's arena is host memory: one host copy per piece, after the run
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (0, piece_bytes(ks))
    assert "copied on the host after the run" in result.summary.lines()[-1]


def test_the_cpu_backend_copies_on_the_host_also_when_every_output_is_evicted(evicting):
    """It has no GPU: an offloaded output's pieces are copied from the storage after the run, as others are."""
    memgraph, inputs, want = evicting
    ks = [task for task in want if task.startswith("k")]
    caches, into = caches_and_pieces(ks)
    result = execute(memgraph, "cpu", order="random", seed=1, jitter=2e-4, inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (0, piece_bytes(ks))


def test_the_cpu_backend_reads_a_named_output_where_it_is_for_its_one_copy(plan):
    """No copy of a named output before the pieces' (the arena and storage are host memory already)."""
    from runtime.backends.cpu import CpuBackend

    memgraph, inputs, want = plan
    backend = CpuBackend()
    try:
        _, into = caches_and_pieces(["k0", "k1"])
        execute(memgraph, backend, inputs=inputs, close=False, outputs_into=into)
        read = backend.read_outputs()
        held = [*backend.arenas, backend.storage]
        assert all(any(np.shares_memory(read[task], buffer) for buffer in held) for task in into)
        assert not any(np.shares_memory(read["y"], buffer) for buffer in held)
    finally:
        backend.close()


def test_the_sim_backend_writes_nothing_and_counts_nothing(plan):
    memgraph, _, want = plan
    caches, into = caches_and_pieces([task for task in want if task.startswith("k")])
    result = execute(memgraph, "sim", outputs_into=into)
    assert result.outputs == {}
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (0, 0)
    assert all((cache == SENTINEL).all() for cache in caches.values())


def bad_pieces(cache: np.ndarray, rows: int) -> dict[str, tuple]:
    """What is wrong -> (pieces, the message's pattern after "outputs_into['k1']")."""
    wide = np.zeros((rows, 2 * WIDTH), np.float32)
    frozen = np.zeros((rows, WIDTH), np.float32)
    frozen.flags.writeable = False
    return {
        "overlap": ([(0, 4, cache[0:4, 0]), (3, 5, cache[0:2, 1])], r" pieces 0 and 1 overlap: rows \[3, 4\) are in both$"),
        "inside another": ([(1, 2, cache[0:1, 1]), (0, 6, cache[0:6, 0]), (3, 4, cache[0:1, 2])], r" pieces 0 and 1 overlap: rows \[1, 2\) are in both$"),
        "past the end": ([(5, rows + 1, cache[0:rows - 4, 0])], rf" piece 0: rows \[5, {rows + 1}\) do not lie within the output's {rows} rows$"),
        "backwards": ([(3, 2, cache[0:0, 0])], r" piece 0: rows \[3, 2\) do not lie within the output's 8 rows$"),
        "shape": ([(0, 3, cache[0:2, 0])], r" piece 0 must be a float32 view of shape \[3, 16\], got float32 \[2, 16\]$"),
        "dtype": ([(0, 2, cache[0:2, 0].astype(np.float64))], r" piece 0 must be a float32 view of shape \[2, 16\], got float64 \[2, 16\]$"),
        "rows not contiguous": ([(0, 2, wide[0:2, ::2])], r" piece 0: the view must be writeable, each row contiguous .*\(strides \[128, 8\]\)$"),
        "rows backwards": ([(0, 2, cache[1::-1, 0])], r" piece 0: the view must be writeable, .*\(strides \[-192, 4\]\)$"),
        "read-only": ([(0, 2, frozen[0:2])], r" piece 0: the view must be writeable"),
        "not a triple": ([(0, 2)], r" piece 0 must be \(start, stop, view\), got tuple$"),
        "not a list": (cache, r" must be a float32 array of shape \[8, 16\] or a list of \(start, stop, view\) pieces, got float32 \[6, 3, 16\]$"),
        "rows as floats": ([(0.0, 2, cache[0:2, 0])], r" piece 0: rows \[0.0, 2\) do not lie within"),
    }


@pytest.mark.parametrize("what", list(bad_pieces(np.zeros((CAPACITY, len(LENGTHS), WIDTH), np.float32), sum(LENGTHS))))
def test_bad_pieces_are_one_line_errors_before_anything_runs(plan, what):
    memgraph, inputs, want = plan
    good, into = caches_and_pieces(["k0"])
    cache = np.full((CAPACITY, len(LENGTHS), WIDTH), SENTINEL, np.float32)
    pieces, pattern = bad_pieces(cache, sum(LENGTHS))[what]
    with pytest.raises(InputError) as caught:
        execute(memgraph, "cpu", inputs=inputs, outputs_into={**into, "k1": pieces})
    message = str(caught.value)
    assert "\n" not in message, what
    assert re.search(r"^outputs_into\['k1'\]" + pattern, message), (what, message)
    assert (good["k0"] == SENTINEL).all() and (cache == SENTINEL).all()  # refused before the run


def test_pieces_may_leave_rows_out_and_be_empty(plan):
    memgraph, inputs, want = plan
    cache = np.full((4, WIDTH), SENTINEL, np.float32)
    result = execute(memgraph, "cpu", inputs=inputs, outputs_into={"k2": [(6, 8, cache[1:3]), (2, 2, cache[0:0])]})
    np.testing.assert_array_equal(cache[1:3], want["k2"][6:8])
    assert (cache[[0, 3]] == SENTINEL).all()
    assert result.summary.bytes_copied_after == 2 * WIDTH * 4


# ----- the cuda backend under numba-cuda's simulator ---------------------------------------------------------
cuda_sim = pytest.mark.skipif(not simulated(), reason="runs numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")


def _spy_on_copies(monkeypatch) -> list:
    """A log of the cuda backend's submits ("submit", vertex), of the events it records ("record",), and of
    its copies' work as it runs ("copy", kind) and ("rows",) for a 2-D copy's, in the order they happen
    (the simulator runs work at once; a submit records its start event, runs the work, records its end)."""
    from runtime.backends.cuda import CudaBackend
    from runtime.backends.cuda.driver import SimDriver

    log = []
    copy, copy_rows, record, submit = SimDriver.copy, SimDriver.copy_rows, SimDriver.record, CudaBackend.submit

    def spied_copy(driver, kind, *args, **options):
        work = copy(driver, kind, *args, **options)
        return lambda lane: (log.append(("copy", kind)), work(lane))

    def spied_copy_rows(driver, *args, **options):
        work = copy_rows(driver, *args, **options)
        return lambda lane: (log.append(("rows",)), work(lane))

    def spied_record(driver, event, stream):
        log.append(("record",))
        record(driver, event, stream)

    def spied_submit(backend, vertex, lane):
        log.append(("submit", vertex))
        submit(backend, vertex, lane)

    monkeypatch.setattr(SimDriver, "copy", spied_copy)
    monkeypatch.setattr(SimDriver, "copy_rows", spied_copy_rows)
    monkeypatch.setattr(SimDriver, "record", spied_record)
    monkeypatch.setattr(CudaBackend, "submit", spied_submit)
    return log


def assert_written_by_their_writers(log: list, memgraph, tasks) -> None:
    """Each task's pieces in one 2-D copy work per run, made by one vertex: by its first offload, within
    that vertex's work (between its start and end events), after its storage copy where a reload reads
    that storage and with none where no reload does; by the node holding it at the end, right after
    that vertex's end event, where the plan never offloads it. No other vertex copies pieces."""
    index = {node.id: i for i, node in enumerate(memgraph.nodes)}
    offloading, holding = {}, set()
    for task in tasks:
        first = first_offload(memgraph, task)
        if first is None:
            holding.add(index[memgraph.outputs[task]])
        else:
            offloading[first[0]] = first[1]
    starts = [k for k, entry in enumerate(log) if entry[0] == "submit"]
    segments = {log[k][1]: log[k + 1 : end] for k, end in zip(starts, [*starts[1:], len(log)])}
    assert len(starts) == len(segments) == sum(node.op != "input" for node in memgraph.nodes)  # each vertex once
    for vertex, reloaded in offloading.items():
        storage = [("copy", "d2h")] if reloaded else []
        assert segments[vertex] == [("record",), *storage, ("rows",), ("record",)], (memgraph.nodes[vertex].label(), segments[vertex])
    for vertex in holding:
        assert segments[vertex][-2:] == [("record",), ("rows",)] and segments[vertex].count(("rows",)) == 1, memgraph.nodes[vertex].label()
    rows = [vertex for vertex, segment in segments.items() if ("rows",) in segment]
    assert sorted(rows) == sorted([*offloading, *holding])


@cuda_sim
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("order", ["random", "nondet"])
def test_on_the_cuda_simulator_each_piece_is_written_once_by_the_first_offload_or_after_the_final_holder(plan, monkeypatch, seed, order):
    """k outputs held at the end by their kernel, a reload and an offload: the one never offloaded is
    copied from the GPU right after its kernel, the others by their first offload; none on the host."""
    from runtime.backends.cuda import CudaBackend

    memgraph, inputs, want = plan
    ks = [task for task in want if task.startswith("k")]
    caches, into = caches_and_pieces(ks)
    log = _spy_on_copies(monkeypatch)
    result = execute(memgraph, CudaBackend(), order=order, seed=seed, inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    assert sorted(result.outputs) == ["y"]
    np.testing.assert_allclose(result.outputs["y"], want["y"], rtol=1e-5, atol=1e-5)
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (piece_bytes(ks), 0)
    assert_written_by_their_writers(log, memgraph, ks)


@cuda_sim
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("order", ["random", "nondet"])
def test_a_budget_that_evicts_every_output_copies_nothing_on_the_host(evicting, monkeypatch, seed, order):
    """Every k offloaded: all pieces written from the GPU by the offloads, only k0's (reloaded for y)
    with a storage copy; y, which reads it back, is right."""
    from runtime.backends.cuda import CudaBackend

    memgraph, inputs, want = evicting
    ks = [task for task in want if task.startswith("k")]
    caches, into = caches_and_pieces(ks)
    log = _spy_on_copies(monkeypatch)
    result = execute(memgraph, CudaBackend(), order=order, seed=seed, inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    assert sorted(result.outputs) == ["y"]
    np.testing.assert_allclose(result.outputs["y"], want["y"], rtol=1e-5, atol=1e-5)
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (piece_bytes(ks), 0)
    assert "0 B copied on the host after the run" in result.summary.lines()[-1]
    assert_written_by_their_writers(log, memgraph, ks)
    assert [task for task in ks if first_offload(memgraph, task)[1]] == ["k0"]


@cuda_sim
def test_bfloat16_pieces_land_on_the_cuda_simulator():
    """The simulator's device views of bfloat16 are uint16 words, the caller's views ml_dtypes' bfloat16."""
    import ml_dtypes

    from runtime.backends.cuda import CudaBackend

    memgraph, inputs = evicting_plan(dtype="bfloat16")
    want = execute(memgraph, CudaBackend(), inputs=inputs).outputs
    ks = [task for task in want if task.startswith("k")]
    caches, into = caches_and_pieces(ks, dtype=ml_dtypes.bfloat16)
    result = execute(memgraph, CudaBackend(), order="random", inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (piece_bytes(ks) // 2, 0)


@cuda_sim
def test_an_offload_writes_its_storage_again_in_a_run_without_pieces(evicting):
    """The storage copy is skipped only in a run that names the output's pieces: a prepared backend runs
    the plan without pieces (the outputs read from storage), with pieces (the storage of those no
    reload reads untouched: the pieces are the only copy), without again, then with a whole array (a
    decode step's way: copied on the host from storage after the run)."""
    from runtime.backends.cuda import CudaBackend

    memgraph, inputs, want = evicting
    ks = [task for task in want if task.startswith("k")]
    backend = CudaBackend()
    try:
        first = execute(memgraph, backend, inputs=inputs, close=False)
        assert all(np.array_equal(first.outputs[task], want[task]) for task in want if task != "y")
        stored = {task: backend.views.host[first_offload(memgraph, task)[0]] for task in ks}
        for view in stored.values():
            view[...] = SENTINEL
        caches, into = caches_and_pieces(ks)
        execute(memgraph, backend, inputs=inputs, close=False, outputs_into=into)
        assert_landed(caches, want)
        np.testing.assert_array_equal(stored["k0"], want["k0"])  # reloaded for y: stored
        assert all((stored[task] == SENTINEL).all() for task in ks if task != "k0")
        again = execute(memgraph, backend, inputs=inputs, close=False)
        assert all(np.array_equal(again.outputs[task], want[task]) for task in ks)
        whole = np.full((sum(LENGTHS), WIDTH), SENTINEL, np.float32)
        result = execute(memgraph, backend, inputs=inputs, close=False, outputs_into={"k2": whole})
        np.testing.assert_array_equal(whole, want["k2"])
        assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (0, whole.nbytes)
    finally:
        backend.close()


@cuda_sim
def test_a_plan_first_loaded_for_pieces_pins_no_storage_for_what_only_they_read(evicting, monkeypatch):
    """A backend whose first run names the k pieces gives the unread first offloads no storage (the pieces
    are their only copy): less pinned storage, by exactly those offloads' bytes. A run without pieces
    then loads the plan again with its storage (its outputs right), and pieces once more land."""
    from runtime.backends.cuda import CudaBackend, memory

    memgraph, inputs, want = evicting
    ks = [task for task in want if task.startswith("k")]
    unread = [first_offload(memgraph, task)[0] for task in ks if not first_offload(memgraph, task)[1]]
    assert unread  # k1.. are offloaded and never reloaded
    monkeypatch.setattr(memory, "GAP_BYTES", 0)  # this plan's regions are bytes apart: a chunk spans no gap
    whole = CudaBackend()
    try:
        execute(memgraph, whole, inputs=inputs, close=False)
        stored = whole.stats["pinned_bytes"]
    finally:
        whole.close()
    backend = CudaBackend()
    try:
        caches, into = caches_and_pieces(ks)
        execute(memgraph, backend, order="random", inputs=inputs, close=False, outputs_into=into)
        assert_landed(caches, want)
        assert all(backend.views.host[i] is None for i in unread) and backend.views.host[first_offload(memgraph, "k0")[0]] is not None
        spans = sorted(memgraph.nodes[i].storage for i in unread)
        assert stored - backend.stats["pinned_bytes"] >= sum(size for _, size in spans) > 0
        again = execute(memgraph, backend, inputs=inputs, close=False)
        assert all(np.array_equal(again.outputs[task], want[task]) for task in ks)
        assert backend.stats["pinned_bytes"] == stored
        caches, into = caches_and_pieces(ks)
        execute(memgraph, backend, order="random", inputs=inputs, close=False, outputs_into=into)
        assert_landed(caches, want)
    finally:
        backend.close()


@cuda_sim
def test_a_prepared_cuda_backend_takes_pieces_arrays_and_nothing_in_turn(plan):
    """One prepared backend, one plan: pieces, then C-contiguous and strided arrays (a decode step's
    way), then nothing; each run writes only what it names."""
    from runtime.backends.cuda import CudaBackend

    memgraph, inputs, want = plan
    backend = CudaBackend()
    try:
        caches, into = caches_and_pieces(["k0", "k3"])
        execute(memgraph, backend, inputs=inputs, close=False, outputs_into=into)
        assert_landed(caches, want)
        whole = np.full((sum(LENGTHS), WIDTH), SENTINEL, np.float32)
        wider = np.full((sum(LENGTHS), 2, WIDTH), SENTINEL, np.float32)
        second = wider[:, 1]
        result = execute(memgraph, backend, inputs=inputs, close=False, outputs_into={"k0": whole, "y": second})
        assert result.outputs["k0"] is whole and result.outputs["y"] is second
        np.testing.assert_array_equal(whole, want["k0"])
        np.testing.assert_allclose(wider[:, 1], want["y"], rtol=1e-5, atol=1e-5)
        assert (wider[:, 0] == SENTINEL).all()
        assert result.summary.bytes_written_straight == whole.nbytes + wider[:, 1].nbytes  # y's strided rows: one 2-D copy
        assert len(backend.views.targets) == 2 and not backend.views.pieces
        again = execute(memgraph, backend, inputs=inputs, close=False)
        assert not backend.views.targets and not backend.views.named
        assert sorted(again.outputs) == sorted(want) and (result.summary.bytes_copied_after, again.summary.bytes_written_straight) == (0, 0)
        assert_landed(caches, want)  # the pieces of the first run were not written again
    finally:
        backend.close()


@cuda_sim
def test_an_array_whose_rows_are_not_contiguous_is_copied_after_the_run_on_the_simulator(plan):
    from runtime.backends.cuda import CudaBackend

    memgraph, inputs, want = plan
    buffer = np.full((sum(LENGTHS), 2 * WIDTH), SENTINEL, np.float32)
    columns = buffer[:, ::2]
    result = execute(memgraph, CudaBackend(), inputs=inputs, outputs_into={"k3": columns})
    np.testing.assert_array_equal(columns, want["k3"])
    assert (buffer[:, 1::2] == SENTINEL).all()
    assert result.outputs["k3"] is columns
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (0, sum(LENGTHS) * WIDTH * 4)


# ----- a real GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("memory", ["pinned", "pageable"])
@pytest.mark.parametrize("wide", [0, 3])
def test_pieces_are_2d_copies_from_the_gpu_into_strided_views(memory, wide):
    """cuMemcpy2DAsync: each piece lands where it should (pitch = the cache's row stride), no other byte of
    the cache changes; every piece is written straight from the GPU (by the first offload of an output
    the plan offloads, within its work), none on the host, whether the plan keeps some k on the GPU or
    evicts every one (`wide`). Pageable caches are written all the same (each copy then holds the loop
    until done)."""
    from runtime.backends.cuda import CudaBackend
    from runtime.backends.cuda.driver import make_driver

    memgraph, inputs = evicting_plan(width=256) if wide else tight_plan(prefill_like(width=256))
    want = execute(memgraph, "cpu", inputs=inputs).outputs
    ks = [task for task in want if task.startswith("k")]
    pinned = make_driver().pinned if memory == "pinned" else None
    caches, into = caches_and_pieces(ks, width=256, pinned=pinned)
    result = execute(memgraph, CudaBackend(), order="random", inputs=inputs, outputs_into=into)
    for task in ks:  # the GPU sums its GEMMs in another order: compare closely, and every other value exactly
        got = caches[task].copy()
        start = 0
        for b, n in enumerate(LENGTHS):
            np.testing.assert_allclose(got[AT : AT + n, b], want[task][start : start + n], rtol=2e-3, atol=2e-3)
            got[AT : AT + n, b] = SENTINEL
            start += n
        assert (got == SENTINEL).all(), task
    # k0's storage copy, where reloaded: y's values reach 1e7 (sums of GEMMs summed in another order on the GPU),
    # so it is held to the scale of its largest (on the H100 one element near a cancellation was 3.3e-3 off relatively)
    scale = float(np.abs(want["y"]).max())
    np.testing.assert_allclose(result.outputs["y"], want["y"], rtol=2e-3, atol=1e-4 * scale)
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (len(ks) * sum(LENGTHS) * 256 * 4, 0)

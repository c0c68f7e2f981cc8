"""`execute(outputs_into=)` in pieces: rows of an output written into strided views of the caller's buffers
(a batched prefill's k and v rows of each sequence, into a token-major cache: issue 44).

A small graph stands for a prefill: each "layer" computes a k block of several sequences' rows (an
output) and goes on. At its minimum budget the plan leaves one k on the GPU, reloads one for a later
reader and ends with others in host storage. On the cpu backend and on numba-cuda's simulator (the cuda
backend's own Python; its 2-D copies done by numpy), in random orders: every piece lands exactly where
it should, nothing else in the buffers (filled with a sentinel) changes, the summary counts what the
backend wrote straight and what was copied on the host after, and bad pieces are one-line errors before
anything runs. The driver's real 2-D copy (cuMemcpy2DAsync) runs in the `gpu` test.
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


def prefill_like(layers: int = 4, width: int = WIDTH, dtype: str = "float32") -> TaskGraph:
    """Per layer a k block (an output) from x, and x updated from it; y reads k0 again at the end."""
    g = TaskGraph(devices=1)
    x = g.input((sum(LENGTHS), width), dtype, device=0, id="x")
    ks = []
    for layer in range(layers):
        k = g.matmul(x, g.input((width, width), dtype, device=0, id=f"w{layer}"), device=0, id=f"k{layer}")
        x = g.add(g.relu(k, device=0, id=f"r{layer}"), x, device=0, id=f"x{layer}")
        ks.append(k)
    g.output(*ks, g.add(x, ks[0], device=0, id="y"))
    return g


def tight_plan(graph: TaskGraph):
    """The graph at its minimum budget, and its inputs; the plan holds k outputs in each of three places."""
    memgraph = compile_taskgraph(graph, int(minimum_budget(place_devices(graph, 0))) // 256 * 256 + 256)
    holders = held_by(memgraph)
    assert {holders[task] for task in holders if task.startswith("k")} == {"kernel", "reload", "offload"}, holders
    return memgraph, make_inputs(input_specs(memgraph), None, 0)


def held_by(memgraph) -> dict[str, str]:
    """Output task -> the op of the node that holds it at the end (offload: in host storage)."""
    nodes = memgraph.by_id()
    return {task: nodes[node_id].op for task, node_id in memgraph.outputs.items()}


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
    """A log of the cuda backend's submits ("submit", vertex) and of its 2-D copies' work as it runs
    ("rows", the device view copied), in the order they happen (the simulator runs work at once)."""
    from runtime.backends.cuda import CudaBackend
    from runtime.backends.cuda.driver import SimDriver

    log = []
    copy_rows, submit = SimDriver.copy_rows, CudaBackend.submit

    def spied_copy(driver, source, pieces, *args, **options):
        work = copy_rows(driver, source, pieces, *args, **options)
        return lambda lane: (log.append(("rows", source)), work(lane))

    def spied_submit(backend, vertex, lane):
        log.append(("submit", vertex))
        submit(backend, vertex, lane)

    monkeypatch.setattr(SimDriver, "copy_rows", spied_copy)
    monkeypatch.setattr(CudaBackend, "submit", spied_submit)
    return log


@cuda_sim
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("order", ["random", "nondet"])
def test_on_the_cuda_simulator_each_piece_is_copied_once_right_after_the_vertex_holding_its_output(plan, monkeypatch, seed, order):
    """Outputs on the GPU at the end (the kernel's, or a reload's) are copied from there right after that
    vertex, once; those the plan leaves in host storage are copied on the host after the run (counted)."""
    from runtime.backends.cuda import CudaBackend

    memgraph, inputs, want = plan
    ks = [task for task in want if task.startswith("k")]
    holders = held_by(memgraph)
    caches, into = caches_and_pieces(ks)
    log = _spy_on_copies(monkeypatch)
    backend = CudaBackend()
    result = execute(memgraph, backend, order=order, seed=seed, inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    assert sorted(result.outputs) == ["y"]
    np.testing.assert_allclose(result.outputs["y"], want["y"], rtol=1e-5, atol=1e-5)
    on_gpu = [task for task in ks if holders[task] != "offload"]
    assert (result.summary.bytes_written_straight, result.summary.bytes_copied_after) == (piece_bytes(on_gpu), piece_bytes(ks) - piece_bytes(on_gpu))
    index = {node.id: i for i, node in enumerate(memgraph.nodes)}
    copied = [k for k, (kind, _) in enumerate(log) if kind == "rows"]
    assert len(copied) == len(on_gpu)  # one copy work per output on the GPU, none for those in storage
    for k in copied:
        kind, vertex = log[k - 1]  # issued by the submit of the vertex that holds the output, after its work
        assert kind == "submit" and memgraph.nodes[vertex].task in on_gpu
        assert index[memgraph.outputs[memgraph.nodes[vertex].task]] == vertex


@cuda_sim
def test_bfloat16_pieces_land_on_the_cuda_simulator():
    """The simulator's device views of bfloat16 are uint16 words, the caller's views ml_dtypes' bfloat16."""
    import ml_dtypes

    from runtime.backends.cuda import CudaBackend

    memgraph, inputs = tight_plan(prefill_like(dtype="bfloat16"))
    want = execute(memgraph, CudaBackend(), inputs=inputs).outputs
    ks = [task for task in want if task.startswith("k")]
    caches, into = caches_and_pieces(ks, dtype=ml_dtypes.bfloat16)
    result = execute(memgraph, CudaBackend(), order="random", inputs=inputs, outputs_into=into)
    assert_landed(caches, want)
    on_gpu = [task for task in ks if held_by(memgraph)[task] != "offload"]
    assert result.summary.bytes_written_straight == piece_bytes(on_gpu) // 2


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
def test_pieces_are_2d_copies_from_the_gpu_into_strided_views(memory):
    """cuMemcpy2DAsync: each piece lands where it should (pitch = the cache's row stride), no other byte of
    the cache changes; the outputs on the GPU are written straight, the rest after. Pageable caches are
    written all the same (each copy then holds the loop until done)."""
    from runtime.backends.cuda import CudaBackend
    from runtime.backends.cuda.driver import make_driver

    graph = prefill_like(width=256)
    memgraph, inputs = tight_plan(graph)
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
    on_gpu = [task for task in ks if held_by(memgraph)[task] != "offload"]
    row = 256 * 4
    assert result.summary.bytes_written_straight == len(on_gpu) * sum(LENGTHS) * row
    assert result.summary.bytes_copied_after == (len(ks) - len(on_gpu)) * sum(LENGTHS) * row

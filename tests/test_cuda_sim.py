"""The cuda backend without a GPU: numba-cuda's simulator runs its kernels, numpy runs its GEMM plans.

What runs here is the backend's own Python (views at planned offsets, pinned chunks, lanes, event waits,
the completion FIFO, the kernel builders and launch preparation) and every numba kernel at tiny sizes,
against references written from formulas. Simulated threads are slow (~80 us each), so graphs stay tiny.
The same code runs on the H200 through bench/gpu_check.py (tests marked `gpu`).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import replace

import numpy as np
import pytest

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from runtime import execute
from runtime.backends.cuda import CudaBackend, simulated
from runtime.backends.cuda.compat import cuda
from runtime.backends.cuda import builders, completion, gemm, kernels_numba, memory
from runtime.backends.cuda.driver import make_driver
from runtime.executor import Executor
from runtime.graph import build_exec_graph
from runtime.inputs import input_specs, make_inputs
from runtime.policies import make_policy
from tools.float64 import evaluate
from tests import formulas_llama as formulas
from tests.attention_graphs import attention_graph, packed_attention_graph, per_sequence_attention
from turnip_ir.errors import InputError, KernelError
from tools.random_graphs import random_taskgraph
from turnip_ir.taskgraph import TaskGraph

pytestmark = pytest.mark.skipif(not simulated(), reason="these tests run numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")


def _run(graph: TaskGraph, factor: float = 1.3, order: str = "random", seed: int = 0, inputs=None):
    budget = int(minimum_budget(place_devices(graph, 0)) * factor) // 256 * 256 + 256
    memgraph = compile_taskgraph(graph, budget)
    inputs = make_inputs(input_specs(memgraph), inputs, seed)
    return memgraph, inputs, execute(memgraph, backend=CudaBackend(), order=order, seed=seed, inputs=inputs)


def _close(got, want, dtype):
    tol = {"float16": 2e-2, "float32": 1e-5}[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_elementwise_and_row_kernel_matches_numpy(dtype):
    g = TaskGraph(devices=1)
    x = g.input((3, 24), dtype, device=0, id="x")
    y = g.input((3, 24), dtype, device=0, id="y")
    row = g.input((24,), dtype, device=0, id="row")
    outs = [g.kernel(name, x, device=0, id=name) for name in ("relu", "gelu", "silu", "softmax")]
    outs.append(g.scale(x, 0.5, device=0, id="half"))
    outs.append(g.rmsnorm(x, row, device=0, id="norm"))
    outs.append(g.rmsnorm(y, device=0, id="plain"))
    outs += [g.kernel(name, x, y, device=0, id=name) for name in ("add", "sub", "mul")]
    outs.append(g.mul(x, row, device=0, id="broadcast"))
    outs.append(g.swiglu(x, y, device=0, id="swiglu"))
    outs.append(g.exp(g.softmax(y, device=0, id="sq"), device=0, id="exp"))
    g.output(*outs)
    _, inputs, result = _run(g, factor=4.0)
    want = _formulas({k: v.astype(np.float64) for k, v in inputs.items()})
    for name, value in want.items():
        _close(result.outputs[name], value, dtype)


@pytest.mark.parametrize("cols", [5, 36, 37, 100, 130])
def test_quad_loops_and_their_tails_match_numpy(cols):
    """The kernels work on quads (two in flight per thread) and finish with a plain loop: widths below, at
    and between multiples of the unrolled step (8 simulated threads per row, 16 per grid) hit every path.
    The simulator runs `vector.load4` element by element; the GPU test runs the vector instructions."""
    check_quad_kernels(cols, vector=cols % 4 == 0)


def check_quad_kernels(cols: int, rows: int = 3, vector: bool = True) -> None:
    """Every elementwise and row kernel launched directly on [rows, cols] float32, against numpy (also
    run on a GPU by tests/test_cuda_gpu.py, at widths beyond its 256 threads per row). `vector` builds
    read by vector instructions, which need rows of a multiple of four."""
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    x[1, cols // 2] = 30.0  # a large value late in a row: the running maximum must rescale its sum
    flat = lambda a: a.reshape(-1)  # noqa: E731

    got = {}
    for name in ("gelu", "silu", "exp"):
        out = np.zeros(x.size, np.float32)
        kernels_numba.unary(name, "float32", vector)[kernels_numba.element_grid(x.size)](flat(x), out, 1.0)
        got[name] = out.reshape(x.shape)
    for name in kernels_numba.BINARY:
        out = np.zeros(x.size, np.float32)
        kernels_numba.binary_same(name, "float32", vector)[kernels_numba.element_grid(x.size)](flat(x), flat(y), out)
        got[name] = out.reshape(x.shape)
    out = np.zeros(x.size, np.float32)
    kernels_numba.swiglu("float32", vector)[kernels_numba.element_grid(x.size)](flat(x), flat(y), out)
    got["swiglu"] = out.reshape(x.shape)
    out = np.zeros(x.size, np.float32)
    kernels_numba.softmax("float32", vector)[rows, kernels_numba.ROW_THREADS](flat(x), out, cols)
    got["softmax"] = out.reshape(x.shape)
    for weighted in (True, False):
        out = np.zeros(x.size, np.float32)
        kernels_numba.rmsnorm("float32", weighted, vector)[rows, kernels_numba.ROW_THREADS](flat(x), w if weighted else flat(x), out, cols, 1e-6)
        got["norm" if weighted else "plain"] = out.reshape(x.shape)
    want = _formulas({"x": x.astype(np.float64), "y": y.astype(np.float64), "row": w.astype(np.float64)})
    want["plain"] = want["norm"] / w
    want["exp"] = np.exp(x.astype(np.float64))
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("d, vector", [(16, True), (40, True), (16, False), (18, False)])
@pytest.mark.parametrize("has_prev", [True, False])
@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize("interleaved", [True, False])
def test_attention_merge_folds_a_block_into_the_packed_partial(d, vector, has_prev, final, interleaved):
    """Quads of (row, head): the vector build's strided quads, and the element build with a head width
    that leaves a tail; o with its heads contiguous, and interleaved as cuDNN returns it."""
    check_attention_merge(d, has_prev, final, tq=3, vector=vector, interleaved=interleaved)


def _heads_interleaved(o: np.ndarray):
    """A device array [heads, tq, d] whose memory is laid out [tq, heads, d]."""
    base = cuda.to_device(np.ascontiguousarray(o.transpose(1, 0, 2)))
    if simulated():
        return base.transpose((1, 0, 2))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray  # a real DeviceNDArray transposes 2-D arrays only

    heads, tq, d = o.shape
    item = o.dtype.itemsize
    return DeviceNDArray((heads, tq, d), (d * item, heads * d * item, item), o.dtype, gpu_data=base.gpu_data)


def check_attention_merge(d: int, has_prev: bool, final: bool, tq: int, vector: bool = False, interleaved: bool = False) -> None:
    rng = np.random.default_rng(d)
    total_heads, h0, heads = 4, 1, 2
    o = rng.standard_normal((heads, tq, d)).astype(np.float32)
    o_arg = o
    if interleaved:  # [tq, heads, d] in memory, seen as [heads, tq, d], as cuDNN returns o
        o_arg = _heads_interleaved(o)
    lse = rng.standard_normal((heads, tq)).astype(np.float32)
    prev = rng.standard_normal((tq, total_heads * d + total_heads)).astype(np.float32)
    width = total_heads * d
    out = np.zeros((tq, width if final else width + total_heads), np.float32)
    kernel = kernels_numba.attention_merge("float32", has_prev, final, vector)
    grid, block = kernels_numba.merge_grid(tq, heads, d)
    kernel[grid, block](o_arg, lse, prev if has_prev else lse, out, h0, total_heads)
    for h in range(heads):
        cols = slice((h0 + h) * d, (h0 + h + 1) * d)
        lb = lse[h].astype(np.float64)
        if has_prev:
            lp = prev[:, width + h0 + h].astype(np.float64)
            merged = np.logaddexp(lp, lb)
            want = np.exp(lp - merged)[:, None] * prev[:, cols] + np.exp(lb - merged)[:, None] * o[h]
        else:
            merged, want = lb, o[h]
        np.testing.assert_allclose(out[:, cols], want, rtol=1e-5, atol=1e-5)
        if not final:
            np.testing.assert_allclose(out[:, width + h0 + h], merged, rtol=1e-5, atol=1e-5)


def _formulas(v):
    x, y, row = v["x"], v["y"], v["row"]
    soft = lambda a: np.exp(a - a.max(-1, keepdims=True)) / np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)  # noqa: E731
    rms = lambda a: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)  # noqa: E731
    return {
        "relu": np.maximum(x, 0), "gelu": 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
        "silu": x / (1 + np.exp(-x)), "softmax": soft(x), "half": 0.5 * x, "norm": rms(x) * row, "plain": rms(y),
        "add": x + y, "sub": x - y, "mul": x * y, "broadcast": x * row, "swiglu": formulas.swiglu(x, y), "exp": np.exp(soft(y)),
    }


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemms_run_as_planned_contractions(dtype):
    g = TaskGraph(devices=1)
    x = g.input((6, 8), dtype, device=0, id="x")
    w = g.input((5, 8), dtype, device=0, id="w")
    b = g.input((8, 5), dtype, device=0, id="b")
    g.output(g.einsum("ti,oi->to", x, w, device=0, id="proj"), g.matmul(x, b, device=0, id="mm"),
             g.einsum("ti,io->ot", x, b, device=0, id="transposed"), g.einsum("ij->ji", x, device=0, id="swap"))
    _, inputs, result = _run(g, factor=4.0)
    v = {k: a.astype(np.float64) for k, a in inputs.items()}
    for name, want in {"proj": v["x"] @ v["w"].T, "mm": v["x"] @ v["b"], "transposed": (v["x"] @ v["b"]).T, "swap": v["x"].T}.items():
        _close(result.outputs[name], want, dtype)


def test_rope_matches_the_formula_per_head():
    tokens, heads, kv_heads, width = 8, 11, 2, 4  # 11 heads: pairs of heads and a last one alone
    g = TaskGraph(devices=1)
    cos, sin = formulas.rope_tables(tokens, width)
    q = g.input((tokens, heads * width), "float32", device=0, id="q")
    k = g.input((tokens, kv_heads * width), "float32", device=0, id="k")
    v = g.input((tokens, kv_heads * width), "float32", device=0, id="v")
    c = g.input((tokens, width), "float32", device=0, id="cos")
    s = g.input((tokens, width), "float32", device=0, id="sin")
    g.output(g.rope(q, c, s, device=0, id="qr"), g.rope(k, c, s, device=0, id="kr"))
    inputs = {"cos": cos.astype(np.float32), "sin": sin.astype(np.float32)}
    _, drawn, result = _run(g, factor=3.0, inputs=inputs)
    _close(result.outputs["qr"], formulas.rope(drawn["q"], cos, sin), "float32")
    _close(result.outputs["kr"], formulas.rope(drawn["k"], cos, sin), "float32")


@pytest.mark.parametrize("width, vector", [(4, False), (16, True)])
def test_rope_runs_by_quads_where_heads_allow_and_matches_the_formula(monkeypatch, width, vector):
    """Heads of a multiple of 8 columns run the quad build (four pairs a thread, one vector load each);
    narrower heads the element build. Both give the formula's values, over more heads than a sweep covers.
    (The simulator's driver turns vector loads off, and its arrays have no device pointers: here they are
    on and every row taken as aligned; the simulator reads the quads element by element.)"""
    from runtime.backends.cuda.driver import SimDriver

    monkeypatch.setattr(SimDriver, "vector_loads", True)
    monkeypatch.setattr(builders, "arrays_rows_aligned", lambda *arrays: True)
    monkeypatch.setattr(builders, "aligned", lambda *arrays: False)  # the other kernels keep their element builds
    built = []
    rope = kernels_numba.rope
    monkeypatch.setattr(kernels_numba, "rope", lambda dtype, vector=False: built.append(vector) or rope(dtype, vector))
    tokens, heads = 5, 11
    g = TaskGraph(devices=1)
    cos, sin = formulas.rope_tables(tokens, width)
    q = g.input((tokens, heads * width), "float32", device=0, id="q")
    c = g.input((tokens, width), "float32", device=0, id="cos")
    s = g.input((tokens, width), "float32", device=0, id="sin")
    g.output(g.rope(q, c, s, device=0, id="qr"))
    _, drawn, result = _run(g, factor=3.0, inputs={"cos": cos.astype(np.float32), "sin": sin.astype(np.float32)})
    assert built == [vector]
    _close(result.outputs["qr"], formulas.rope(drawn["q"], cos, sin), "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rope_quad_and_element_builds_agree(dtype):
    tokens, heads, width = 4, 5, 16
    cos, sin = formulas.rope_tables(tokens, width)
    x = np.random.default_rng(1).standard_normal((tokens, heads * width)).astype(dtype)
    tables = [cuda.to_device(t.astype(dtype)) for t in (cos, sin)]
    outs = []
    for vector in (False, True):
        out = cuda.to_device(np.zeros_like(x))
        kernels_numba.rope(dtype, vector)[kernels_numba.rope_grid(tokens, width, vector)](cuda.to_device(x), *tables, out)
        outs.append(out.copy_to_host())
    np.testing.assert_array_equal(outs[0], outs[1])
    _close(outs[1], formulas.rope(x.astype(np.float64), cos, sin), dtype)


@pytest.mark.parametrize("dtype, heads, kv_heads", [("float32", 4, 2), ("float16", 2, 2)])
def test_blocked_attention_on_the_cublas_provider_equals_full_causal_attention(dtype, heads, kv_heads):
    tokens, block, width = 6, 3, 2
    g = attention_graph(tokens, block, heads, kv_heads, width, dtype)
    _, inputs, result = _run(g, factor=1.5)
    cat = lambda p: np.concatenate([inputs[f"{p}{i}"] for i in range(tokens // block)])  # noqa: E731
    want = formulas.attention(cat("q"), cat("k"), cat("v"), heads, kv_heads, causal=True)
    got = np.concatenate([result.outputs[f"a{i}.{i}"] for i in range(tokens // block)])
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype, heads, kv_heads, lengths", [("float32", 4, 2, [2, 1, 3]), ("float16", 2, 2, [3, 3]),
                                                              ("float32", 2, 1, [1, 4, 1])])
def test_a_block_of_packed_sequences_on_the_cublas_provider_is_causal_attention_per_sequence(dtype, heads, kv_heads, lengths):
    g = packed_attention_graph(lengths, heads, kv_heads, 2, dtype)
    _, inputs, result = _run(g, factor=1.5)
    _close(result.outputs["a"], per_sequence_attention(inputs["q"], inputs["k"], inputs["v"], heads, kv_heads, lengths), dtype)


def test_a_block_of_packed_sequences_merges_into_the_partial_before_it():
    from kernel_formulas import evaluate as formula

    g = packed_attention_graph([2, 3, 1], 4, 2, 2, "float32", prev=True)
    _, inputs, result = _run(g, factor=1.5)
    _close(result.outputs["a"], formula(g, inputs)["a"], "float32")


def test_a_packed_block_needs_the_scratch_of_its_longest_sequence():
    from runtime.backends.cuda.attention import scratch_bytes

    g = packed_attention_graph([3, 5], 4, 2, 2, "float16")
    node = g["a"]
    sources = [g[i] for i in node.inputs]
    alone = TaskGraph(devices=1)
    q, k = alone.input((5, 8), "float16", id="q"), alone.input((5, 4), "float16", id="k")
    alone.attention(q, k, k, heads=4, kv_heads=2, causal=True, id="a")
    longest = scratch_bytes(alone["a"], [alone["q"], alone["k"], alone["k"]], "cublas")
    assert scratch_bytes(node, sources, "cublas") == longest > 0
    whole = {name: value for name, value in node.attrs.items() if name != "segments"}
    assert longest < scratch_bytes(replace(node, attrs=whole), sources, "cublas")
    assert scratch_bytes(node, sources, "torch-cudnn") == 0  # torch's ops take no scratch


def test_a_packed_llama_prefill_gives_each_sequence_its_own_hidden_states():
    """Three prompts through one prefill (a packed block, then a prompt longer than a block), offloading."""
    from frontend.workloads import llama

    config = replace(llama.load_config("tiny-gqa"), num_hidden_layers=1)
    lengths = [2, 1, 6]
    built = llama.build_llama(config, sum(lengths), 3, sequences=lengths)
    weights = llama.RandomWeights(config, 1)
    prompts = [llama.random_ids(config, n, s) for s, n in enumerate(lengths)]
    memgraph, _, result = _run(built.graph, inputs=built.feed(weights, np.concatenate(prompts)))
    assert memgraph.count("reload") > 0
    for hidden, ids in zip(built.gather_sequences(result.outputs), prompts):
        _close(hidden, llama.float64_forward(config, weights, ids), "float32")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("order", ["random", "nondet"])
def test_random_graphs_under_tight_budgets_match_the_reference(seed, order):
    graph = random_taskgraph(seed, tasks=10, devices=1, sizes=(4, 8))
    memgraph, inputs, result = _run(graph, factor=1.2, order=order, seed=seed)
    assert memgraph.count("offload") + memgraph.count("reload") > 0
    expected = evaluate(graph, inputs)
    for task, want in expected.items():
        np.testing.assert_allclose(result.outputs[task], want, rtol=1e-5, atol=1e-5)


def test_zero_size_tensors_cost_nothing_and_come_back_empty():
    g = TaskGraph(devices=1)
    x = g.input((0, 4), "float32", device=0, id="x")
    g.output(g.relu(x, device=0, id="r"))
    _, _, result = _run(g, factor=4.0)
    assert result.outputs["r"].shape == (0, 4)


def test_every_kernel_of_the_table_has_a_cuda_implementation():
    """Training's too (tests/test_cuda_train.py); one without is refused in one line (tests/test_autodiff.py)."""
    assert builders.missing_kernels() == []


def test_a_launch_that_raises_ends_the_run_naming_the_vertex(monkeypatch):
    g = TaskGraph(devices=1)
    g.output(g.relu(g.input((4,), "float32", device=0, id="x"), device=0, id="r"))

    def broken(node, inputs, out, env):
        def work(lane):
            raise RuntimeError("launch failed")
        return work

    monkeypatch.setitem(builders.BUILDERS, "relu", broken)
    with pytest.raises(KernelError, match=r"\(relu 'r'\) failed: RuntimeError: launch failed"):
        _run(g, factor=4.0)


def test_pinned_storage_chunks_never_split_a_region():
    regions = [(0, 100), (128, 300), (512, 2000), (2560, 10)]
    storage = memory.PinnedStorage(regions, chunk_bytes=1024, allocate=make_driver().pinned)
    assert len(storage.chunks) == 3  # [0, 428), [512, 2512) alone (bigger than a chunk), [2560, 2570)
    for offset, size in regions:
        view = storage.view((offset, size), (size,), "uint8")
        view[:] = offset % 251
    assert all(int(storage.view((o, s), (s,), "uint8")[0]) == o % 251 for o, s in regions)


def test_a_later_storage_reuses_the_smallest_earlier_chunk_that_holds_each_span():
    allocated = []

    def allocate(count):
        allocated.append(count)
        return make_driver().pinned(count)

    first = memory.PinnedStorage([(0, 100), (512, 2000), (2560, 10)], chunk_bytes=1024, allocate=allocate)
    second = memory.PinnedStorage([(0, 50), (64, 1500), (4096, 3000)], chunk_bytes=1024, allocate=allocate, reuse=first.all_chunks())
    assert allocated == [100, 2000, 10, 3000]  # [0, 50) takes the 100-byte chunk, [64, 1564) the 2000-byte one
    assert second.chunks[0] is first.chunks[0] and second.chunks[1] is first.chunks[1]
    assert second.spare == [first.chunks[2]] and len(second.all_chunks()) == 4


def test_the_host_function_counts_per_lane_and_wakes_the_loop_without_a_gpu():
    notifier = completion.HostFuncNotifier(3)
    function = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(notifier.address)
    calls = [0, 2, 2, 1, 2]
    thread = threading.Thread(target=lambda: [function(notifier.user_data[lane]) for lane in calls])
    thread.start()
    thread.join()
    seen: dict[int, int] = {}
    while sum(seen.values()) < len(calls):
        for lane, count in notifier.wait(timeout=1.0).items():
            seen[lane] = seen.get(lane, 0) + count
    assert seen == {0: 1, 1: 1, 2: 3}
    assert notifier.wait(timeout=0.01) == {}
    notifier.close()


def test_broadcast_strides_fold_axes_and_give_zero_strides_where_an_operand_repeats():
    (d1, d2, d3), sa, sb = kernels_numba.broadcast_strides((2, 3, 4), (2, 3, 4), (4,))
    assert (d1, d2, d3) == (1, 6, 4) and sa[2:] == [4, 1] and sb[2:] == [0, 1]
    assert kernels_numba.broadcast_strides((2, 2, 2, 2, 2), (2, 1, 2, 1, 2), (1, 2, 1, 2, 1)) is None


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("order", ["random", "nondet"])
def test_graphs_over_two_gpus_with_moves_match_the_reference(seed, order):
    """Under the simulator every device is the one simulated GPU, but each keeps its own arena, lanes and
    peer-copy lane, so moves between arenas, offloads and the device switches all run."""
    graph = random_taskgraph(seed, tasks=14, devices=2, sizes=(4, 8), move_prob=0.3)
    memgraph, inputs, result = _run(graph, factor=1.3, order=order, seed=seed)
    assert memgraph.count("move") > 0
    expected = evaluate(graph, inputs)
    for task, want in expected.items():
        np.testing.assert_allclose(result.outputs[task], want, rtol=1e-5, atol=1e-5)


def test_every_run_sets_the_current_device_before_its_first_launch(monkeypatch):
    """A run over two GPUs can end on GPU 1, and the thread stays there: the next run's first launch
    must switch even to GPU 0 (a cuBLAS call on GPU 0's handle from GPU 1's context failed on the
    H200s). The simulator does not fail that way, so this checks the rule."""
    graph = random_taskgraph(1, tasks=14, devices=2, sizes=(4, 8), move_prob=0.3)
    log: list = []  # holds the backends themselves: a closed one's id may be reused by the next
    submit, switch = CudaBackend.submit, CudaBackend._switch
    monkeypatch.setattr(CudaBackend, "submit", lambda self, vertex, lane: (log.append((self, "submit", lane.device)), submit(self, vertex, lane))[1])
    monkeypatch.setattr(CudaBackend, "_switch", lambda self, device: (log.append((self, "switch", device)), switch(self, device))[1])
    for seed in range(3):
        _run(graph, factor=1.5, order="random", seed=seed)
    backends = list(dict.fromkeys(entry[0] for entry in log))
    assert len(backends) == 3
    for backend in backends:
        calls = [entry[1:] for entry in log if entry[0] == backend]
        current = None  # unknown when a run begins, so its first submit switches
        for i, (kind, device) in enumerate(calls):
            if kind == "switch":
                current = device
            elif device != current:  # the submit logs before it switches
                assert calls[i + 1] == ("switch", device), calls[max(0, i - 2) : i + 2]
        assert {device for kind, device in calls if kind == "submit"} == {0, 1}


def _run_prepared(backend: CudaBackend, memgraph, inputs, seed: int) -> dict:
    """One run on a backend that stays prepared: prepare (load), the executor's loop, outputs; no close."""
    graph = build_exec_graph(memgraph, 2)
    backend.prepare(graph, inputs)
    Executor(graph, backend, make_policy("random", graph, seed), []).run()
    return backend.read_outputs()


def test_one_prepared_backend_runs_two_memgraphs_of_one_budget_then_closes():
    """Set up once, run many, close: the second memgraph runs on the first one's arenas and streams."""
    check_prepared_backend(sizes=(4, 8), tol=1e-5)


def check_prepared_backend(sizes: tuple[int, ...], tol: float) -> None:
    """Two random memgraphs of one budget through one prepared backend (also run on a GPU by
    tests/test_cuda_gpu.py, at larger sizes)."""
    graphs = [random_taskgraph(seed, tasks=10, devices=1, sizes=sizes) for seed in (4, 5)]
    budget = max(int(minimum_budget(place_devices(g, 0)) * 1.3) for g in graphs) // 256 * 256 + 256
    backend = CudaBackend()
    set_up = None
    try:
        for seed, graph in enumerate(graphs):
            memgraph = compile_taskgraph(graph, budget)
            inputs = make_inputs(input_specs(memgraph), None, seed)
            outputs = _run_prepared(backend, memgraph, inputs, seed)
            held = (backend.devices, *backend.devices.arenas, *backend.devices.streams)
            set_up = set_up or held
            assert all(a is b for a, b in zip(held, set_up, strict=True))
            for task, want in evaluate(graph, inputs).items():
                np.testing.assert_allclose(outputs[task], want, rtol=tol, atol=tol)
    finally:
        backend.close()
    assert backend.devices.streams == [] and backend.devices.arenas == []
    with pytest.raises(InputError, match="closed"):
        backend.prepare(build_exec_graph(compile_taskgraph(graphs[0], budget), 2), {})


def test_a_prepared_backend_refuses_a_memgraph_beyond_its_arena_in_one_line():
    graph = random_taskgraph(4, tasks=10, devices=1, sizes=(4, 8))
    budget = int(minimum_budget(place_devices(graph, 0)) * 1.3) // 256 * 256 + 256
    backend = CudaBackend()
    try:
        memgraph = compile_taskgraph(graph, budget)
        _run_prepared(backend, memgraph, make_inputs(input_specs(memgraph), None, 0), 0)
        bigger = compile_taskgraph(graph, 2 * budget)
        with pytest.raises(InputError, match=r"exceeds the prepared arena"):
            backend.prepare(build_exec_graph(bigger, 2), make_inputs(input_specs(bigger), None, 0))
    finally:
        backend.close()


def test_a_prepared_backend_keeps_unchanged_inputs_across_runs():
    """Inputs kept across runs (runtime/residency.py) on cuda: a `recur` plan run again copies nothing
    that survived, its pinned storage stays, and an ordinary plan in between (overwriting the arena)
    makes the next run copy what it overwrote; every run computes the reference."""
    graph = random_taskgraph(6, tasks=10, devices=1, sizes=(4, 8), dtype="float64")
    budget = int(minimum_budget(place_devices(graph, 0)) * 2) // 256 * 256 + 256
    recur, ordinary = (compile_taskgraph(graph, budget, inputs=inputs) for inputs in ("recur", "gpu"))
    inputs = make_inputs(input_specs(recur), None, 3)
    want = evaluate(graph, inputs)
    backend = CudaBackend()
    placed = []
    try:
        for memgraph in (recur, recur, ordinary, recur):
            result = execute(memgraph, backend, order="random", seed=len(placed), inputs=inputs, close=False, unchanged=list(inputs))
            placed.append((result.summary.bytes_placed, result.summary.bytes_staged))
            for task, value in want.items():
                np.testing.assert_allclose(result.outputs[task], value, rtol=1e-12, atol=1e-12)
    finally:
        backend.close()
    started = sum(n.nbytes for n in recur.nodes if n.op == "input" and n.loc is not None)
    stored = sum(n.nbytes for n in recur.nodes if n.op == "input" and n.storage is not None)
    assert started > 0 and set(recur.surviving_inputs()) == {n.task for n in recur.nodes if n.op == "input" and n.loc is not None}
    assert placed[0] == (started, stored) and placed[1] == (0, 0)
    assert placed[3] == (started, stored)  # another plan in between overwrote the arena and has its own storage


@pytest.mark.parametrize("context_lost", [False, True])
def test_a_launch_that_fails_at_once_names_its_vertex_in_lane_order(monkeypatch, context_lost):
    """A relu whose launch raises: the run fails with a KernelError naming it, whether its lane's later
    driver calls still work (its completion comes in lane order, carrying the error) or the failure
    lost the context (the end event's record raises too: the vertex is named, not the event)."""
    g = TaskGraph()
    x = g.input((8, 8), "float32", id="x")
    y = g.kernel("relu", x, id="y")
    g.output(g.kernel("add", y, x, id="z"))
    plan = compile_taskgraph(g, 1 << 20)

    def boom(*args):
        raise RuntimeError("injected")

    monkeypatch.setitem(builders.BUILDERS, "relu", lambda *args: boom)
    backend = CudaBackend()
    if context_lost:
        driver, real = backend.driver, backend.driver.record
        monkeypatch.setattr(driver, "record", lambda event, stream: real(event, stream) if not backend.errors else (_ for _ in ()).throw(RuntimeError("sticky")))
    with pytest.raises(KernelError, match=r"\by\b.*failed: RuntimeError: injected"):
        execute(plan, backend, inputs={"x": np.ones((8, 8), np.float32)})


def test_library_memory_over_what_the_reserve_held_back_is_said(tmp_path):
    """The notes name a run whose libraries took more than `arena_budget` held back for them (on the H200,
    torch's attention memory at 128k in query groups of 8: 353 MiB against 256), and say nothing otherwise;
    the reserve is the scratch per lane plus that allowance."""
    from runtime.backends.cuda.devices import library_allowance, reserve_bytes, scratch_per_lane

    from frontend.workloads import llama

    nodes = list(llama.build_llama(llama.load_config("tiny"), 64).graph.nodes.values())
    for provider in ("cublas", "torch-cudnn", "triton"):
        assert reserve_bytes(nodes, 2, provider) == 2 * scratch_per_lane(nodes, provider) + library_allowance(nodes, 2, provider)
    backend = CudaBackend()
    stats = {"prepare_s": 1.0, "arena_bytes": 1792 << 20, "workspace_bytes": 1, "pinned_bytes": 0, "load_steps": {}, "built": (0, {}),
             "library_bytes": 200 << 20, "library_allowance": 256 << 20}
    backend.stats.update(stats)
    assert not [line for line in backend.notes() if "over the" in line]
    backend.stats["library_bytes"] = 353 << 20
    (line,) = [line for line in backend.notes() if "over the" in line]
    assert "97.00 MiB over the 256.00 MiB held back" in line and "2.09 GiB per GPU" in line


def test_library_memory_is_never_reported_below_zero():
    """Under the simulator the free memory can grow while a plan loads: the summary says 0 B, not a negative size."""
    g = TaskGraph(1)
    g.output(g.relu(g.input((8, 8), "float32", device=0, id="x"), device=0, id="y"))
    backend = CudaBackend()
    execute(compile_taskgraph(g, 1 << 20), backend, inputs={"x": np.ones((8, 8), np.float32)})
    assert backend.stats["library_bytes"] >= 0
    assert not any("library memory -" in line for line in backend.notes())

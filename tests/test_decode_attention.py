"""The `decode_attention` kernel: one key block of a batch's decode attention, each query row one
sequence's new token (turnip_ir/kernels.py). The numpy kernel (cpu backend) and the numba kernel (cuda
backend, here under numba-cuda's simulator) against the formula of tests/kernel_formulas.py, over ragged
lengths, blocks a sequence sees in part or not at all, sliding windows, grouped heads, the own-key link,
merges into a packed partial, and float16 / bfloat16 / float32 / float64."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_formulas import evaluate

from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.backends.cuda import simulated
from turnip_ir.errors import ShapeError
from turnip_ir.kernels import numpy_dtype
from turnip_ir.taskgraph import TaskGraph

B, H, KV, D, R = 3, 4, 2, 8, 6


def _graph(dtype: str, with_prev: bool, final: bool, **attrs) -> TaskGraph:
    g = TaskGraph(1)
    q = g.input((B, H * D), dtype, device=0, id="q")
    own = attrs.get("own", False)
    kv_shape = (B, KV * D) if own else (R, B, KV * D)
    k, v = (g.input(kv_shape, dtype, device=0, id=name) for name in "kv")
    lengths = g.input((B,), "float32", device=0, id="lengths")
    operands = [q, k, v, lengths]
    if with_prev:
        operands.append(g.input((B, H * D + H), "float32", device=0, id="prev"))
    g.kernel("decode_attention", *operands, device=0, id="out", heads=H, kv_heads=KV, final=final, **attrs)
    g.output("out")
    return g


def _inputs(graph: TaskGraph, lengths, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {}
    for node in graph.nodes.values():
        if node.op != "input":
            continue
        if node.id == "lengths":
            values["lengths"] = np.asarray(lengths, np.float32)
        elif node.id == "prev":
            prev = rng.standard_normal(node.shape)
            prev[:, H * D :] = rng.uniform(-2, 2, (B, H))
            prev[0, H * D] = -np.inf  # a head that has seen no key yet
            prev[0, : D] = 0.0
            values["prev"] = prev.astype(np.float32)
        else:
            values[node.id] = rng.standard_normal(node.shape).astype(numpy_dtype(node.dtype))
    return values


CASES = [
    ({"start": 6}, [7, 3, 12]),            # row 0 sees one key, row 1 none, row 2 all six
    ({"start": 0}, [6, 2, 20]),
    ({"start": 6, "window": 4}, [8, 3, 12]),
    ({"start": 0, "window": 3}, [4, 6, 1]),
    ({"own": True}, [5, 0, 9]),
    ({"own": True, "window": 1}, [5, 0, 9]),
]


def _check(backend: str, dtype: str, attrs: dict, lengths, with_prev: bool, final: bool, tol: float):
    graph = _graph(dtype, with_prev, final, **attrs)
    inputs = _inputs(graph, lengths, 3)
    want = evaluate(graph, {name: value.astype(np.float64) for name, value in inputs.items()})["out"]
    memgraph = compile_taskgraph(graph, 1 << 30)
    got = execute(memgraph, backend, inputs=inputs).outputs["out"].astype(np.float64)
    width = H * D
    np.testing.assert_allclose(got[:, :width], want[:, :width], rtol=tol, atol=tol)
    if not final:  # the log-sum-exp: -inf where a head has seen no key, in both
        np.testing.assert_allclose(got[:, width:], want[:, width:], rtol=tol, atol=tol)


@pytest.mark.parametrize("attrs,lengths", CASES)
@pytest.mark.parametrize("with_prev,final", [(False, False), (True, False), (True, True), (False, True)])
def test_cpu_kernel_matches_the_formula(attrs, lengths, with_prev, final):
    _check("cpu", "float64", attrs, lengths, with_prev, final, 1e-12 if final else 2e-6)  # a partial is float32


@pytest.mark.skipif(not simulated(), reason="runs numba-cuda's simulator")
@pytest.mark.parametrize("attrs,lengths", CASES[:1] + CASES[2:3] + CASES[4:5])
@pytest.mark.parametrize("dtype,tol", [("float64", 2e-6), ("float16", 5e-3), ("bfloat16", 3e-2)])
def test_cuda_kernel_matches_the_formula(attrs, lengths, dtype, tol):
    _check("cuda", dtype, attrs, lengths, True, dtype == "float16", tol)


@pytest.mark.skipif(not simulated(), reason="runs numba-cuda's simulator")
def test_cuda_kernel_takes_blocks_longer_than_a_chunk():
    """Keys in several passes of the online softmax (the simulator's chunk is 16 keys)."""
    global R
    saved, R = R, 40
    try:
        _check("cuda", "float32", {"start": 0}, [40, 17, 33], True, False, 1e-5)
    finally:
        R = saved


@pytest.mark.skipif(not simulated(), reason="runs numba-cuda's simulator")
@pytest.mark.parametrize("width,vector", [(12, False), (8, True), (20, True)])
def test_cuda_kernel_splits_heads_over_lanes(monkeypatch, width, vector):
    """Head widths over more than one lane's share (the simulator's warp is 4 lanes: element by element a
    lane keeps elements l, l+4, ...; by quads 4l.., 4l+16..), read by quads or element by element."""
    from runtime.backends.cuda import attention
    from runtime.backends.cuda.driver import SimDriver

    global D, R
    saved = D, R
    D, R = width, 40
    monkeypatch.setattr(SimDriver, "vector_loads", vector)
    monkeypatch.setattr(attention, "_merge_quads", lambda d, *arrays: d % 4 == 0)  # the simulator's arrays have no pointers
    try:
        _check("cuda", "float32", {"start": 0}, [40, 17, 33], True, False, 1e-5)
        _check("cuda", "float16", {"start": 6, "window": 4}, [8, 3, 12], False, True, 5e-3)
    finally:
        D, R = saved


@pytest.mark.parametrize("change,message", [
    (lambda shapes: shapes.update(lengths=(B + 1,)), "lengths"),
    (lambda shapes: shapes.update(k=(R, B, KV * D + 1)), "must both be"),
    (lambda shapes: shapes.update(q=(B, H * D + 1)), "must be \\[batch, heads\\*D\\]"),
])
def test_bad_shapes_are_one_line_errors(change, message):
    shapes = {"q": (B, H * D), "k": (R, B, KV * D), "v": (R, B, KV * D), "lengths": (B,)}
    change(shapes)
    if shapes["k"][-1] != KV * D:
        shapes["v"] = shapes["k"]
    g = TaskGraph(1)
    xs = [g.input(shape, "float32" if name == "lengths" else "float16", device=0, id=name) for name, shape in shapes.items()]
    with pytest.raises(ShapeError, match=message):
        g.kernel("decode_attention", *xs, device=0, id="out", heads=H, kv_heads=KV)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [("float16", 5e-3), ("bfloat16", 3e-2)])
def test_decode_attention_on_the_gpu_at_7b_head_sizes(dtype, tol):
    """On a real GPU (bench/gpu_bench.sh), 7b's heads (32 of 128) over a column of 1024 keys and ragged
    lengths, in one launch per (sequence, head), against the formula in float64."""
    global B, H, KV, D, R
    saved = B, H, KV, D, R
    B, H, KV, D, R = 4, 32, 8, 128, 1024
    try:
        _check("cuda", dtype, {"start": 1024}, [1500, 2048, 1024, 2100], True, False, tol)
        _check("cuda", dtype, {"own": True}, [1500, 2048, 1024, 2100], True, True, tol)
    finally:
        B, H, KV, D, R = saved

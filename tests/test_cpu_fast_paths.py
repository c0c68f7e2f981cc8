"""The cpu backend's fast paths against plain definitions.

- einsum as a BLAS matrix product (`MatmulForm`): random two-operand equations (batch, row, column and
  contracted letters in any order, transposed operands and outputs, outer products, empty axes) equal
  numpy's einsum in float64, float32 and float16; matmul-shaped ones never reach np.einsum.
- attention a chunk of query rows at a time over the keys the chunk can see (`QUERY_ROWS`): blocks of
  several chunks, causal, windowed, with keys before the queries and rows that see no key, equal the
  formula of tests/kernel_formulas.py.
- products (runtime/blas.py), a large one cut over the threads given, equal one matmul; the cpu backend
  runs BLAS on one thread and leaves it as it found it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_formulas import apply
from threadpoolctl import threadpool_info, threadpool_limits

from passes.pipeline import compile_taskgraph
from runtime import blas, execute, kernels_numpy
from runtime.backends.cpu import CpuBackend
from runtime.kernels_numpy import NUMPY_KERNELS, QUERY_ROWS, matmul_form
from turnip_ir.kernels import KERNELS
from turnip_ir.taskgraph import TaskGraph

TOLERANCE = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3}
"""Relative to the largest |value| of the float64 product (float16: half an ulp of the rounded output)."""


@st.composite
def equations(draw):
    """A two-operand equation: letters drawn as batch, rows, columns or contracted, each operand and the
    output in a random order, with sizes (some 0 or 1)."""
    letters = iter("abcdefgh")
    kinds = draw(st.lists(st.sampled_from(["batch", "rows", "columns", "contracted"]), min_size=1, max_size=5))
    roles = [(next(letters), kind) for kind in kinds]
    x = [c for c, kind in roles if kind != "columns"]
    y = [c for c, kind in roles if kind != "rows"]
    z = [c for c, kind in roles if kind != "contracted"]
    x, y, z = (draw(st.permutations(side)) for side in (x, y, z))
    sizes = {c: draw(st.sampled_from([0, 1, 2, 3, 5]) if draw(st.booleans()) else st.integers(1, 4)) for c, _ in roles}
    return f"{''.join(x)},{''.join(y)}->{''.join(z)}", [tuple(sizes[c] for c in side) for side in (x, y)]


def _einsum_kernel(equation: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    attrs = {"equation": equation}
    shape, dtype = KERNELS["einsum"].infer([a.shape, b.shape], [a.dtype.name, b.dtype.name], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS["einsum"]([a, b], out, attrs)
    return out


@settings(max_examples=120, deadline=None)
@given(equations(), st.sampled_from(["float64", "float32", "float16"]), st.integers(0, 2**31))
def test_a_matmul_shaped_einsum_equals_numpys_einsum(case, dtype, seed):
    equation, shapes = case
    assert matmul_form(equation) is not None, equation
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(shape).astype(dtype) for shape in shapes)
    expected = np.einsum(equation, a.astype(np.float64), b.astype(np.float64))
    got = _einsum_kernel(equation, a, b)
    assert got.dtype == np.dtype(dtype) and got.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=0, atol=TOLERANCE[dtype] * scale)


def test_the_projection_einsum_is_a_blas_product_and_never_calls_einsum(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("np.einsum was called for a matmul-shaped equation")

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((5, 8)).astype(np.float32)
    expected = x.astype(np.float64) @ w.T.astype(np.float64)
    monkeypatch.setattr(kernels_numpy.np, "einsum", refuse)
    for equation, operands in (("ti,oi->to", (x, w)), ("oi,ti->to", (w, x)), ("ti,oi->ot", (x, w))):
        got = _einsum_kernel(equation, *operands)
        np.testing.assert_allclose(got, expected.T if equation.endswith("ot") else expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("equation", ["ii,ij->ij", "ij,jk->i", "ij,k->ik", "i,i->i"])
def test_what_is_not_one_matrix_product_is_left_to_einsum(equation):
    """A letter twice in an operand, or summed within one operand alone, is no plain matrix product;
    the same letter in both operands and the output is a batch letter of length-1 matrices."""
    assert (matmul_form(equation) is None) == (equation != "i,i->i")


@pytest.mark.parametrize("attrs", [
    {"causal": True},
    {"causal": False},
    {"causal": True, "window": 100},
    {"causal": False, "window": 150, "offset": -200},
    {"causal": False, "window": 40, "offset": -QUERY_ROWS - 90},  # the first chunk's rows see no key
])
@pytest.mark.parametrize("dtype, with_prev", [("float64", False), ("float64", True), ("float32", True)])
def test_attention_over_several_chunks_of_query_rows_equals_its_formula(attrs, dtype, with_prev):
    rng = np.random.default_rng(len(attrs) + with_prev)
    tokens, width, heads, kv_heads = 2 * QUERY_ROWS + 37, 8, 4, 2
    q = rng.standard_normal((tokens, heads * width)).astype(dtype)
    k, v = (rng.standard_normal((tokens, kv_heads * width)).astype(dtype) for _ in range(2))
    xs = [q, k, v]
    if with_prev:  # the partial an earlier key block leaves
        earlier = [q, rng.standard_normal(k.shape), rng.standard_normal(v.shape)]
        xs.append(apply("attention", earlier, {"heads": heads, "kv_heads": kv_heads, "final": False}).astype(np.float32))
    attrs = {"heads": heads, "kv_heads": kv_heads, "final": not with_prev, **attrs}
    shape, out_dtype = KERNELS["attention"].infer([x.shape for x in xs], [str(x.dtype) for x in xs], attrs)
    out = np.full(shape, np.nan, dtype=out_dtype)
    NUMPY_KERNELS["attention"](xs, out, attrs)
    tolerance = 1e-9 if dtype == "float64" and not with_prev else 2e-5
    np.testing.assert_allclose(out, apply("attention", xs, attrs), rtol=tolerance, atol=tolerance)



def _blas_threads() -> int:
    return next(info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas")


@pytest.mark.parametrize("a_shape, b_shape, parts", [
    ((300, 200), (200, 700), 3),  # cut along a's rows
    ((5, 300), (300, 40000), 3),  # too few rows: cut along b's columns
    ((4, 1, 200, 64), (1, 3, 64, 700), 3),  # broadcast batches: cut along the first, b taken whole
    ((6, 100, 64), (64, 900), 3),  # b without the batch axis
    ((2, 300, 200), (2, 200, 700), 3),  # fewer batches than threads: cut along the rows
    ((2, 3), (3, 4), 1),  # small: one matmul
])
def test_a_product_cut_over_threads_equals_one_matmul(monkeypatch, a_shape, b_shape, parts):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    calls = []
    matmul = np.matmul

    def watched(x, y, out=None):
        calls.append(x.shape)
        return matmul(x, y, out=out)

    monkeypatch.setattr(blas.np, "matmul", watched)
    blas.BLAS.use(3)
    try:
        got = blas.product(a, b)
        into = np.full(got.shape, np.nan)
        blas.product(a, b, out=into)
        with blas.BLAS.lock:  # another product has the helpers: this one is one matmul on this thread
            alone = blas.product(a, b)
    finally:
        blas.BLAS.use(None)
    expected = matmul(a, b)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(into, got)
    np.testing.assert_allclose(alone, expected, rtol=1e-12, atol=1e-12)
    assert len(calls) == 2 * parts + 1, calls  # the first two products in `parts` matmuls each


def test_the_cpu_backend_runs_blas_on_one_thread_and_gives_it_back_as_it_found_it():
    graph = TaskGraph(1)
    a, b = graph.input((64, 64), id="a"), graph.input((64, 64), id="b")
    graph.output(graph.matmul(a, b, device=0, id="c"))
    memgraph = compile_taskgraph(graph, 1 << 20)
    seen = []
    with threadpool_limits(limits=2, user_api="blas"):
        ones = np.ones((64, 64), np.float32)
        backend = CpuBackend(threads=3)
        result = execute(memgraph, backend=backend, inputs={"a": ones, "b": ones}, close=False)
        seen.append((_blas_threads(), blas.BLAS.threads))
        backend.close()
        assert result.outputs["c"][0, 0] == 64
        assert seen == [(1, 3)]
        assert _blas_threads() == 2 and blas.BLAS.threads == 1


@pytest.mark.parametrize("name, shapes, attrs", [
    ("rmsnorm", [(300, 2048), (2048,)], {"eps": 1e-5}),  # three chunks, the weight converted once
    ("rmsnorm", [(2, 300, 1024)], {"eps": 1e-5}),  # rank 3: cut along the first axis
    ("rmsnorm", [(700,)], {"eps": 1e-5}),  # a vector: one chunk (its axis is the reduced one)
    ("rope", [(300, 2048), (300, 64), (300, 64)], {}),
    ("swiglu", [(300, 2048), (300, 2048)], {}),
    ("swiglu", [(0, 8), (0, 8)], {}),
])
def test_half_kernels_computed_in_float32_chunks_equal_their_formula(name, shapes, attrs):
    """float16 in, float16 out, within half an ulp of the float64 formula on the float16 inputs, where a
    half loop rounds every pass (the squares of rmsnorm alone overflow past 256)."""
    rng = np.random.default_rng(len(shapes))
    xs = [(rng.standard_normal(shape) * 20).astype(np.float16) for shape in shapes]
    if name == "rmsnorm" and len(xs) == 2:
        xs[1] = (1 + 0.1 * rng.standard_normal(shapes[1])).astype(np.float16)
    shape, dtype = KERNELS[name].infer([x.shape for x in xs], [x.dtype.name for x in xs], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS[name](xs, out, attrs)
    expected = apply(name, [x.astype(np.float64) for x in xs], attrs)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=2**-11, atol=1e-6 * max(1.0, float(np.abs(expected).max(initial=0))))

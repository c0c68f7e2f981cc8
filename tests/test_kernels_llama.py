"""The LLaMA kernels (rope, swiglu, blocked attention) against float64 formulas written independently
(tests/formulas_llama.py), their shape and attribute errors, their costs, and small graphs of them
compiled under budgets that force offload and run on the cpu backend in random orders."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import formulas_llama as formulas
from passes.pipeline import compile_taskgraph
from runtime import execute
from turnip_ir.cost import CostModel
from runtime.kernels_numpy import NUMPY_KERNELS
from turnip_ir.errors import ShapeError
from turnip_ir.kernels import KERNELS
from turnip_ir.memgraph import MemNode
from turnip_ir.taskgraph import TaskGraph

TOLERANCE = {"float64": 1e-12, "float32": 2e-5, "float16": 4e-3}
"""Absolute tolerance on outputs of magnitude about 1."""


def _random(rng, shape, dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _run(name: str, inputs: list[np.ndarray], attrs: dict) -> np.ndarray:
    """One kernel call through the numpy implementation, into an output of the table's shape and dtype."""
    shape, dtype = KERNELS[name].infer([a.shape for a in inputs], [a.dtype.name for a in inputs], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS[name](inputs, out, attrs)
    return out


def _blocked_attention(q, k, v, bounds: list[int], heads: int, kv_heads: int) -> np.ndarray:
    """Causal attention as the chain of the kernel's contract: query block i over key blocks 0..i."""
    spans = list(itertools.pairwise([0, *itertools.accumulate(bounds)]))
    rows = []
    for i, (q0, q1) in enumerate(spans):
        prev = None
        for j, (k0, k1) in enumerate(spans[: i + 1]):
            attrs = {"heads": heads, "kv_heads": kv_heads, "causal": i == j, "final": i == j}
            operands = [q[q0:q1], k[k0:k1], v[k0:k1]] + ([] if prev is None else [prev])
            prev = _run("attention", operands, attrs)
        rows.append(prev)
    return np.concatenate(rows)


# ----- numerics against the formulas -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (4, 4)])
@pytest.mark.parametrize("bounds", [[16], [4, 4, 4, 4], [5, 3, 8], [1] * 6 + [10]], ids=str)
def test_blocked_attention_equals_full_causal_attention(bounds, heads, kv_heads, dtype) -> None:
    rng = np.random.default_rng(len(bounds) * 10 + kv_heads)
    tokens, width = sum(bounds), 8
    q = _random(rng, (tokens, heads * width), dtype)
    k = _random(rng, (tokens, kv_heads * width), dtype)
    v = _random(rng, (tokens, kv_heads * width), dtype)
    got = _blocked_attention(q, k, v, bounds, heads, kv_heads)
    assert got.dtype == np.dtype(dtype)
    want = formulas.attention(q, k, v, heads, kv_heads, causal=True)
    # a chain passes float32 partials by contract, so float64 inputs keep float32 precision across blocks
    atol = TOLERANCE["float32"] if dtype == "float64" and len(bounds) > 1 else TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def test_one_non_causal_block_sees_every_key_with_a_given_scale() -> None:
    rng = np.random.default_rng(1)
    q, k, v = _random(rng, (3, 12), "float64"), _random(rng, (7, 6), "float64"), _random(rng, (7, 6), "float64")
    got = _run("attention", [q, k, v], {"heads": 2, "kv_heads": 1, "softmax_scale": 0.25})
    want = formulas.attention(q, k, v, 2, 1, causal=False, scale=0.25)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_a_packed_partial_holds_the_output_and_log_sum_exp_per_head() -> None:
    rng = np.random.default_rng(2)
    heads, width = 2, 4
    q, k, v = (_random(rng, (5, heads * width), "float32") for _ in range(3))
    packed = _run("attention", [q, k, v], {"heads": heads, "kv_heads": heads, "final": False})
    assert packed.shape == (5, heads * width + heads) and packed.dtype == np.float32
    np.testing.assert_allclose(packed[:, : heads * width], formulas.attention(q, k, v, heads, heads, causal=False), atol=2e-6)
    for h in range(heads):
        scores = q[:, h * width : (h + 1) * width].astype(np.float64) @ k[:, h * width : (h + 1) * width].T / np.sqrt(width)
        lse = np.log(np.exp(scores).sum(axis=1))
        np.testing.assert_allclose(packed[:, heads * width + h], lse, rtol=1e-5)


def test_attention_is_safe_for_large_scores() -> None:
    """exp of scores near 1e4 overflows unless each row's maximum is subtracted first."""
    rng = np.random.default_rng(3)
    q = _random(rng, (8, 16), "float32") * 100
    k = _random(rng, (8, 8), "float32") * 100
    v = _random(rng, (8, 8), "float32")
    got = _blocked_attention(q, k, v, [2, 6], heads=4, kv_heads=2)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, formulas.attention(q, k, v, 4, 2), atol=1e-4)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_rope_matches_the_formula(dtype) -> None:
    rng = np.random.default_rng(4)
    cos, sin = formulas.rope_tables(6, 8, start=100)
    x = _random(rng, (6, 3 * 8), dtype)
    got = _run("rope", [x, cos.astype(dtype), sin.astype(dtype)], {})
    want = formulas.rope(x, cos.astype(dtype), sin.astype(dtype))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE[dtype])
    # heads are independent: rotating one head alone gives that head's columns
    alone = formulas.rope(x[:, 8:16], cos, sin)
    np.testing.assert_allclose(got[:, 8:16], alone, rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_swiglu_matches_the_formula(dtype) -> None:
    rng = np.random.default_rng(5)
    gate, up = _random(rng, (5, 12), dtype) * 4, _random(rng, (5, 12), dtype)
    gate[0, :3] = [-30.0, 0.0, 30.0]  # exp(30) overflows float16: the limit is exact
    with np.errstate(invalid="raise", divide="raise"):
        got = _run("swiglu", [gate, up], {})
    np.testing.assert_allclose(got, formulas.swiglu(gate, up), rtol=2 * TOLERANCE[dtype], atol=TOLERANCE[dtype])


# ----- errors and costs ----------------------------------------------------------------------------------

ERRORS = [
    ("attention", [(4, 66), (4, 32), (4, 32)], {"heads": 4, "kv_heads": 2}, "attention: heads 4 does not divide q width 66"),
    ("attention", [(4, 16), (4, 8), (4, 8)], {"heads": 4, "kv_heads": 3}, "attention: kv_heads 3 must be positive and divide heads 4"),
    ("attention", [(4, 16), (4, 8), (4, 8)], {"heads": 0, "kv_heads": 1}, "attention: kv_heads 1 must be positive and divide heads 0"),
    ("attention", [(4, 16), (4, 16), (4, 16)], {"heads": 4, "kv_heads": 2},
     "attention: k [4, 16] and v [4, 16] must both be [tokens, 8] (kv_heads * D)"),
    ("attention", [(4, 16), (4, 8), (3, 8)], {"heads": 4, "kv_heads": 2},
     "attention: k [4, 8] and v [3, 8] must both be [tokens, 8] (kv_heads * D)"),
    ("attention", [(4, 16), (6, 8), (6, 8)], {"heads": 4, "kv_heads": 2, "causal": True},
     "attention: a causal block needs as many queries as keys, got 4 and 6"),
    ("attention", [(4, 16), (4, 8), (4, 8), (4, 16)], {"heads": 4, "kv_heads": 2},
     "attention: prev [4, 16] must be the packed partial [4, 20]"),
    ("attention", [(16,), (4, 8), (4, 8)], {"heads": 4, "kv_heads": 2},
     "attention: operands must be 2-D [tokens, width], got [[16], [4, 8], [4, 8]]"),
    ("attention", [(4, 16), (4, 8), (4, 8)], {"kv_heads": 2}, "attention needs the attribute 'heads'"),
    ("attention", [(4, 16), (4, 8)], {"heads": 4, "kv_heads": 2}, "attention takes 3 to 4 operands, got 2"),
    ("rope", [(4, 16), (4, 6), (4, 6)], {}, "rope: head width 6 does not divide x width 16"),
    ("rope", [(4, 16), (4, 3), (4, 3)], {}, "rope: head width 3 (cos columns) must be even and positive"),
    ("rope", [(4, 16), (5, 8), (5, 8)], {}, "rope: cos has 5 rows, x has 4 tokens"),
    ("rope", [(4, 16), (4, 8), (4, 4)], {}, "rope: cos [4, 8] and sin [4, 4] differ"),
    ("rope", [(2, 4, 16), (4, 8), (4, 8)], {}, "rope: x [2, 4, 16] and cos [4, 8] must be 2-D [tokens, width]"),
    ("swiglu", [(4, 8), (4, 1)], {}, "swiglu: operand shapes differ: [4, 8] and [4, 1]"),
]


@pytest.mark.parametrize("name,shapes,attrs,message", ERRORS, ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_shape_errors_are_one_line_and_name_the_node(name, shapes, attrs, message) -> None:
    g = TaskGraph()
    operands = [g.input(s, id=f"x{i}") for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError) as caught:
        g.kernel(name, *operands, id="bad", **attrs)
    assert str(caught.value) == f"node 'bad': {message}"


@pytest.mark.parametrize(
    "name,dtypes,message",
    [
        ("rope", ["float16", "float32", "float32"], "rope operands have mixed dtypes ['float16', 'float32']"),
        ("swiglu", ["float16", "bfloat16"], "swiglu operands have mixed dtypes ['bfloat16', 'float16']"),
        ("attention", ["float16", "float16", "float16", "float16"], "attention: prev must be float32 (a packed partial), got float16"),
    ],
)
def test_dtype_errors(name, dtypes, message) -> None:
    shapes = {"rope": [(4, 16), (4, 8), (4, 8)], "swiglu": [(4, 8), (4, 8)], "attention": [(4, 16), (4, 8), (4, 8), (4, 20)]}[name]
    g = TaskGraph()
    operands = [g.input(s, d) for s, d in zip(shapes, dtypes)]
    attrs = {"heads": 4, "kv_heads": 2} if name == "attention" else {}
    with pytest.raises(ShapeError) as caught:
        g.kernel(name, *operands, id="bad", **attrs)
    assert str(caught.value) == f"node 'bad': {message}"


def test_flops_follow_the_contract() -> None:
    q, kv = (64, 4 * 16), (32, 2 * 16)
    attention = KERNELS["attention"]
    assert attention.flops([q, kv, kv], q, {"heads": 4, "kv_heads": 2}) == 4 * 64 * 32 * 4 * 16
    square = (32, 4 * 16)
    assert attention.flops([square, kv, kv], square, {"heads": 4, "kv_heads": 2, "causal": True}) == 2 * 32 * 32 * 4 * 16
    assert KERNELS["rope"].flops([(8, 64), (8, 16), (8, 16)], (8, 64), {}) == 3 * 8 * 64
    assert KERNELS["swiglu"].flops([(8, 64), (8, 64)], (8, 64), {}) == 5 * 8 * 64


def test_cost_model_rates_a_partial_at_its_operands_dtype() -> None:
    """A non-final attention writes float32 but multiplies fp16: it runs at the half-precision attention rate."""
    q = MemNode(0, "input", "q", 0, (0, 0), None, (), shape=(4096, 4096), dtype="float16")
    k = MemNode(1, "input", "k", 0, (0, 0), None, (), shape=(4096, 1024), dtype="float16")
    attrs = {"heads": 32, "kv_heads": 8, "final": False}
    partial = MemNode(2, "kernel", "p", 0, (0, 0), None, (0, 1, 1), kernel="attention", shape=(4096, 4128), dtype="float32", attrs=attrs)
    model = CostModel(launch=0.0)
    flops = 4 * 4096 * 4096 * 4096
    assert model.kernel_time(partial, [q, k, k]) == pytest.approx(flops / model.attention_flops)
    fp32 = [MemNode(i, "input", n, 0, (0, 0), None, (), shape=x.shape, dtype="float32") for i, (n, x) in enumerate((("q", q), ("k", k)))]
    assert model.kernel_time(partial, [fp32[0], fp32[1], fp32[1]]) == pytest.approx(flops / model.fp32_flops)


def test_cost_model_prices_causal_blocks_and_slow_memory_kernels_at_their_own_rates() -> None:
    """A causal (diagonal) block at `causal_attention_flops` on the half FLOPs it is counted at, a full one at
    `attention_flops`; rope and rmsnorm at their share of HBM, other memory-bound kernels at all of it."""
    q = MemNode(0, "input", "q", 0, (0, 0), None, (), shape=(4096, 4096), dtype="float16")
    k = MemNode(1, "input", "k", 0, (0, 0), None, (), shape=(4096, 1024), dtype="float16")
    model = CostModel(launch=0.0)
    flops = 4 * 4096 * 4096 * 4096

    def block(causal: bool) -> float:
        attrs = {"heads": 32, "kv_heads": 8, "causal": causal}
        node = MemNode(2, "kernel", "a", 0, (0, 0), None, (0, 1, 1), kernel="attention", shape=(4096, 4096), dtype="float16", attrs=attrs)
        return model.kernel_time(node, [q, k, k])

    assert block(False) == pytest.approx(flops / model.attention_flops)
    assert block(True) == pytest.approx(flops / 2 / model.causal_attention_flops)
    assert model.causal_attention_flops < model.attention_flops  # measured: 0.67 of a full block's time for half its work
    table = MemNode(1, "input", "t", 0, (0, 0), None, (), shape=(4096, 64), dtype="float32")
    traffic = {"rope": 2 * q.nbytes + 2 * table.nbytes, "rmsnorm": 2 * q.nbytes + 4096 * 2, "add": 3 * q.nbytes}
    weight = MemNode(1, "input", "w", 0, (0, 0), None, (), shape=(4096,), dtype="float16")
    operands = {"rope": [q, table, table], "rmsnorm": [q, weight], "add": [q, q]}
    for kernel, share in (("rope", model.memory_share("rope")), ("rmsnorm", model.memory_share("rmsnorm")), ("add", 1.0)):
        node = MemNode(3, "kernel", kernel, 0, (0, 0), None, (0,), kernel=kernel, shape=(4096, 4096), dtype="float16", attrs={})
        assert model.kernel_time(node, operands[kernel]) == pytest.approx(traffic[kernel] / (model.hbm_bw * share))
    assert max(model.memory_share("rope"), model.memory_share("rmsnorm")) < 1.0 == model.memory_share("add")


# ----- compiled graphs on the cpu backend ------------------------------------------------------------------


def _llama_block_graph(bounds: list[int], heads: int, kv_heads: int, width: int, dtype: str):
    """Per token block: q and k through rope, v, the attention chain, then a SwiGLU of the result.

    Blocks alternate between two GPUs; the kernels are left for the placement pass.
    Returns the graph and the inputs by id.
    """
    rng = np.random.default_rng(7)
    hidden = heads * width
    g = TaskGraph(devices=2)
    arrays: dict[str, np.ndarray] = {}

    def given(name: str, array: np.ndarray, device: int):
        arrays[name] = array.astype(dtype)
        return g.input(array.shape, dtype, device=device, id=name)

    tokens = sum(bounds)
    cos, sin = formulas.rope_tables(tokens, width)
    starts = [0, *itertools.accumulate(bounds)]
    q, k, v = [], [], []
    for b, (t0, t1) in enumerate(itertools.pairwise(starts)):
        dev = b % 2
        c, s = given(f"cos{b}", cos[t0:t1], dev), given(f"sin{b}", sin[t0:t1], dev)
        q.append(g.rope(given(f"q{b}", rng.standard_normal((t1 - t0, hidden)), dev), c, s, id=f"rq{b}"))
        k.append(g.rope(given(f"k{b}", rng.standard_normal((t1 - t0, kv_heads * width)), dev), c, s, id=f"rk{b}"))
        v.append(given(f"v{b}", rng.standard_normal((t1 - t0, kv_heads * width)), dev))
    up = given("up", rng.standard_normal((bounds[-1], hidden)), 0)
    for i in range(len(bounds)):
        prev = None
        for j in range(i + 1):
            prev = g.attention(q[i], k[j], v[j], prev, heads=heads, kv_heads=kv_heads, causal=i == j, final=i == j, id=f"a{i}.{j}")
        g.output(prev)
    g.output(g.swiglu(prev, up, id="ffn"))
    return g, arrays


def _expected(arrays: dict[str, np.ndarray], bounds: list[int], heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    blocks = range(len(bounds))
    cos = np.concatenate([arrays[f"cos{b}"] for b in blocks])
    sin = np.concatenate([arrays[f"sin{b}"] for b in blocks])
    q = formulas.rope(np.concatenate([arrays[f"q{b}"] for b in blocks]), cos, sin)
    k = formulas.rope(np.concatenate([arrays[f"k{b}"] for b in blocks]), cos, sin)
    v = np.concatenate([arrays[f"v{b}"] for b in blocks])
    out = formulas.attention(q, k, v, heads, kv_heads)
    starts = [0, *itertools.accumulate(bounds)]
    want = {f"a{i}.{i}": out[t0:t1] for i, (t0, t1) in enumerate(itertools.pairwise(starts))}
    want["ffn"] = formulas.swiglu(out[starts[-2] :], arrays["up"])
    return want


def _working_set(graph: TaskGraph) -> int:
    nodes = graph.nodes
    return max(node.nbytes + sum(nodes[i].nbytes for i in node.inputs) for node in nodes.values())


@pytest.mark.parametrize("dtype,heads,kv_heads", [("float32", 4, 2), ("float16", 4, 1)])
def test_compiled_attention_chain_under_offload_in_random_orders(dtype, heads, kv_heads) -> None:
    bounds = [6, 4, 6]
    graph, arrays = _llama_block_graph(bounds, heads, kv_heads, width=8, dtype=dtype)
    memgraph = compile_taskgraph(graph, int(_working_set(graph) * 1.25))
    assert memgraph.count("offload") > 0 and memgraph.count("reload") > 0
    want = _expected(arrays, bounds, heads, kv_heads)
    for seed in range(3):
        result = execute(memgraph, backend="cpu", order="random", seed=seed, inputs=arrays)
        for task, expected in want.items():
            assert result.outputs[task].dtype == np.dtype(dtype)
            np.testing.assert_allclose(result.outputs[task], expected, rtol=0, atol=2 * TOLERANCE[dtype], err_msg=task)


def test_sim_backend_times_the_new_kernels() -> None:
    graph, _ = _llama_block_graph([4, 4], 4, 2, width=8, dtype="float16")
    memgraph = compile_taskgraph(graph, 1 << 20)
    summary = execute(memgraph, backend="sim", order="nondet").summary
    assert summary.makespan > 0

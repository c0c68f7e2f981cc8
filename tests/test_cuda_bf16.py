"""bfloat16 on the cuda backend: the kernels on uint16 words, GEMMs, attention and a llama, against float32.

Under the CUDA simulator (the default): every memory-bound kernel launched on bfloat16 operands equals the
float32 result of the same inputs rounded to bfloat16, within one bfloat16 ulp (the kernels compute in
float32 and round once; fastmath's exp and a different summation order may land on the other side of a
rounding boundary, never further); graphs in bfloat16 run end to end (views, copies, offloads, GEMMs,
the cublas attention provider) and a tiny llama matches the float64 forward within bfloat16's tolerance.
Marked `gpu`: a llama-3-shaped model (6 layers, hidden 1024, 16 query and 4 kv heads, 3000 tokens) in
bfloat16 on every attention provider against the float64 numpy forward.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import ml_dtypes
import numpy as np
import pytest

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from runtime import execute
from runtime.backends.cuda import CudaBackend, kernels_numba as kn, simulated
from runtime.inputs import input_specs, make_inputs
from tests import formulas_llama as formulas
from tests.attention_graphs import attention_graph
from turnip_ir.taskgraph import TaskGraph

BF16 = ml_dtypes.bfloat16
on_simulator = pytest.mark.skipif(not simulated(), reason="runs numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")

LLAMA_TOLERANCE = 5e-2
"""max |bf16 - float64| / max |float64| of a llama's final hidden states: bfloat16 keeps 8 significant
bits (a relative rounding error up to 2^-9 = 2e-3 per operation), and the weights themselves are rounded
to bfloat16; over a few layers the residual stream's errors add up to about ten rounding errors at its
largest values. float16's tests hold 2e-2 with 3 more bits."""


def words(values) -> np.ndarray:
    """float values rounded to bfloat16, as the uint16 words the kernels take."""
    return np.ascontiguousarray(np.asarray(values, np.float32).astype(BF16)).view(np.uint16)


def decoded(bits: np.ndarray) -> np.ndarray:
    return bits.view(BF16).astype(np.float32)


def ulps(got_bits: np.ndarray, want: np.ndarray) -> int:
    """The largest distance in bfloat16 steps between words and float32 values rounded to bfloat16."""
    def ordered(bits):
        bits = bits.astype(np.int32)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits & 0x7FFF)

    return int(np.max(np.abs(ordered(got_bits).reshape(-1) - ordered(words(want)).reshape(-1))))


def _references(x, y, w) -> dict[str, np.ndarray]:
    """float32 numpy of every elementwise and row kernel, on the decoded bfloat16 inputs."""
    soft = np.exp(x - x.max(-1, keepdims=True))
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True, dtype=np.float32) + np.float32(1e-6))
    return {
        "relu": np.maximum(x, 0), "silu": x / (1 + np.exp(-x)), "exp": np.exp(x),
        "gelu": x / (1 + np.exp(np.float32(-2 * np.sqrt(2 / np.pi)) * x * (1 + np.float32(0.044715) * x * x))),
        "scale": x * np.float32(0.5), "add": x + y, "sub": x - y, "mul": x * y, "swiglu": x / (1 + np.exp(-x)) * y,
        "softmax": soft / soft.sum(-1, keepdims=True), "norm": rms * w, "plain": rms, "broadcast": x * w,
    }


@on_simulator
@pytest.mark.parametrize("cols", [24, 13])
def test_every_memory_bound_kernel_in_bfloat16_is_the_float32_result_rounded(cols):
    """Quads and their tails (13 columns leave one); launched directly on uint16 words."""
    check_bfloat16_kernels(cols, rows=3, vector=False)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [4096, 4100, 11008])
def test_bfloat16_kernels_with_vector_loads_on_the_gpu_are_the_float32_result_rounded(cols):
    """The libdevice bit casts and four uint16 words per vector load, on rows wider than a block."""
    check_bfloat16_kernels(cols, rows=5, vector=True)


def check_bfloat16_kernels(cols: int, rows: int, vector: bool) -> None:
    rng = np.random.default_rng(cols)
    x, y, w = (words(rng.standard_normal(shape) * 2) for shape in ((rows, cols), (rows, cols), (cols,)))
    y.reshape(-1)[5] = words([7e4])[0]  # beyond float16, which bfloat16 keeps (y: the simulator's exp raises past 709)
    y.reshape(-1)[6] = words([-1e-30])[0]  # below float16's smallest subnormal
    got = {}
    size = x.size
    flat = lambda a: a.reshape(-1)  # noqa: E731
    for name in ("relu", "gelu", "silu", "exp", "scale"):
        out = np.zeros(size, np.uint16)
        kn.unary(name, "bfloat16", vector)[kn.element_grid(size)](flat(x), out, 0.5 if name == "scale" else 1.0)
        got[name] = out
    for name in kn.BINARY:
        out = np.zeros(size, np.uint16)
        kn.binary_same(name, "bfloat16", vector)[kn.element_grid(size)](flat(x), flat(y), out)
        got[name] = out
    out = np.zeros(size, np.uint16)
    (d1, d2, d3), sa, sb = kn.broadcast_strides((rows, cols), (rows, cols), (cols,))
    kn.binary_broadcast("mul", "bfloat16")[kn.element_grid(size)](flat(x), w, out, d1, d2, d3, *sa, *sb)
    got["broadcast"] = out
    out = np.zeros(size, np.uint16)
    kn.swiglu("bfloat16", vector)[kn.element_grid(size)](flat(x), flat(y), out)
    got["swiglu"] = out
    out = np.zeros(size, np.uint16)
    kn.softmax("bfloat16", vector and cols % 4 == 0)[rows, kn.ROW_THREADS](flat(y), out, cols)  # y: its 7e4 makes a one-hot row
    got["softmax"] = out
    for weighted in (True, False):
        out = np.zeros(size, np.uint16)
        kn.rmsnorm("bfloat16", weighted, vector and cols % 4 == 0)[rows, kn.ROW_THREADS](flat(y), w if weighted else flat(y), out, cols, 1e-6)
        got["norm" if weighted else "plain"] = out
    with np.errstate(over="ignore"):
        want = _references(decoded(x), decoded(y), decoded(w))
        ys = _references(decoded(y), decoded(y), decoded(w))
        for name in ("softmax", "norm", "plain"):
            want[name] = ys[name]
        for name, bits in got.items():
            assert ulps(bits, want[name].reshape(-1)) <= 1, name


@on_simulator
def test_rope_in_bfloat16_is_the_float32_result_rounded():
    tokens, heads, d = 3, 3, 4
    cos, sin = formulas.rope_tables(tokens, d)
    rng = np.random.default_rng(0)
    x = words(rng.standard_normal((tokens, heads * d)))
    c, s = words(cos), words(sin)
    out = np.zeros_like(x)
    kn.rope("bfloat16")[kn.rope_grid(tokens, d)](x, c, s, out)
    xs, cs, ss = decoded(x).reshape(tokens, heads, d), decoded(c)[:, None, :], decoded(s)[:, None, :]
    rotated = np.concatenate([-xs[..., d // 2:], xs[..., : d // 2]], axis=-1)
    assert ulps(out, (xs * cs + rotated * ss).reshape(-1)) <= 1


@on_simulator
@pytest.mark.parametrize("has_prev, final", [(True, True), (True, False), (False, True)])
def test_attention_merge_reads_and_writes_bfloat16(has_prev, final):
    """o in bfloat16 (a block's output), the packed partial in float32, the final output in bfloat16."""
    tq, d, total_heads, h0, heads = 3, 8, 4, 1, 2
    rng = np.random.default_rng(d)
    o = words(rng.standard_normal((heads, tq, d)))
    lse = rng.standard_normal((heads, tq)).astype(np.float32)
    prev = rng.standard_normal((tq, total_heads * d + total_heads)).astype(np.float32)
    width = total_heads * d
    out = np.zeros((tq, width), np.uint16) if final else np.zeros((tq, width + total_heads), np.float32)
    kernel = kn.attention_merge("bfloat16" if final else "float32", has_prev, final, False, "bfloat16")
    kernel[kn.merge_grid(tq, heads, d)](o, lse, prev if has_prev else lse, out, h0, total_heads)
    of = decoded(o)
    for h in range(heads):
        cols = slice((h0 + h) * d, (h0 + h + 1) * d)
        if has_prev:
            lp = prev[:, width + h0 + h]
            merged = np.logaddexp(lp, lse[h])
            want = np.exp(lp - merged)[:, None] * prev[:, cols] + np.exp(lse[h] - merged)[:, None] * of[h]
        else:
            want = of[h]
        if final:
            assert ulps(out[:, cols], want) <= 1
        else:
            np.testing.assert_allclose(out[:, cols], want, rtol=1e-5, atol=1e-6)


def _run(graph: TaskGraph, factor: float, seed: int = 0, inputs=None):
    budget = int(minimum_budget(place_devices(graph, 0)) * factor) // 256 * 256 + 256
    memgraph = compile_taskgraph(graph, budget)
    inputs = make_inputs(input_specs(memgraph), inputs, seed)
    return memgraph, inputs, execute(memgraph, backend=CudaBackend(), order="random", seed=seed, inputs=inputs)


def _close(got, want, tol=2e-2):
    assert got.dtype == BF16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@on_simulator
def test_a_bfloat16_graph_runs_with_offloads_and_returns_bfloat16_arrays():
    """Kernels through their builders, GEMMs (numpy standing in for cuBLAS), and copies both ways under a
    budget that forces offloads: inputs go in and outputs come back as ml_dtypes.bfloat16."""
    g = TaskGraph(devices=1)
    x = g.input((6, 8), "bfloat16", device=0, id="x")
    w = g.input((5, 8), "bfloat16", device=0, id="w")
    row = g.input((8,), "bfloat16", device=0, id="row")
    proj = g.einsum("ti,oi->to", x, w, device=0, id="proj")
    norm = g.rmsnorm(x, row, device=0, id="norm")
    chain = [g.scale(x, 0.5, device=0, id="s0")]
    for i in range(1, 6):  # outputs done early, kept to the end: at the minimum budget some are offloaded
        chain.append(g.scale(chain[-1], 2.0, device=0, id=f"s{i}"))
    g.output(proj, g.add(g.silu(norm, device=0, id="silu"), x, device=0, id="sum"), g.softmax(proj, device=0, id="soft"), *chain)
    memgraph, inputs, result = _run(g, factor=1.0)
    assert memgraph.count("offload") > 0 and all(inputs[k].dtype == BF16 for k in inputs)
    v = {k: a.astype(np.float64) for k, a in inputs.items()}
    projected = v["x"] @ v["w"].T
    normed = v["x"] / np.sqrt((v["x"] ** 2).mean(-1, keepdims=True) + 1e-6) * v["row"]
    soft = np.exp(projected - projected.max(-1, keepdims=True))
    _close(result.outputs["proj"], projected)
    _close(result.outputs["sum"], normed / (1 + np.exp(-normed)) + v["x"], tol=4e-2)  # two roundings on the way
    _close(result.outputs["soft"], soft / soft.sum(-1, keepdims=True))
    for i in range(6):  # scaling by powers of two is exact
        np.testing.assert_array_equal(result.outputs[f"s{i}"].view(np.uint16), words(v["x"] * 2.0 ** (i - 1)))


@on_simulator
def test_blocked_attention_in_bfloat16_on_the_cublas_provider_equals_full_causal_attention():
    tokens, block, heads, kv_heads, width = 6, 3, 4, 2, 4
    g = attention_graph(tokens, block, heads, kv_heads, width, "bfloat16")
    _, inputs, result = _run(g, factor=1.5)
    cat = lambda p: np.concatenate([inputs[f"{p}{i}"].astype(np.float64) for i in range(tokens // block)])  # noqa: E731
    want = formulas.attention(cat("q"), cat("k"), cat("v"), heads, kv_heads, causal=True)
    got = np.concatenate([result.outputs[f"a{i}.{i}"] for i in range(tokens // block)])
    _close(got, want)


def _llama_error(config, tokens: int, block: int, provider: str, factor: float) -> float:
    """max |bf16 - float64| / max |float64| of the final hidden states, planned at `factor` x the minimum."""
    from frontend.workloads import llama

    bf16 = replace(config, dtype="bfloat16")
    weights = llama.RandomWeights(bf16, 1)  # the float32 draw rounded to bfloat16: the model's own weights
    ids = llama.random_ids(config, tokens, 1)
    built = llama.build_llama(bf16, tokens, block=block)
    budget = int(minimum_budget(place_devices(built.graph, 0)) * factor)
    memgraph = compile_taskgraph(built.graph, budget)
    assert memgraph.count("offload") + memgraph.count("reload") > 0
    backend = CudaBackend(attention_provider=provider)
    result = execute(memgraph, backend=backend, order="nondet", inputs=built.feed(weights, ids))
    got = built.gather(result.outputs)
    assert got.dtype == BF16
    want = _float64_forward(config, tokens)
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


@lru_cache(maxsize=None)
def _float64_forward(config, tokens: int) -> np.ndarray:
    """The float64 numpy forward of the float32 weights the bfloat16 ones were rounded from (once per shape)."""
    from frontend.workloads import llama
    from frontend.workloads.llama.float64_forward import float64_forward

    f32 = replace(config, dtype="float32")
    return float64_forward(f32, llama.RandomWeights(f32, 1), llama.random_ids(config, tokens, 1))


@on_simulator
def test_a_tiny_llama_in_bfloat16_matches_the_float64_forward():
    from frontend.workloads import llama

    error = _llama_error(llama.load_config("tiny-gqa"), tokens=16, block=8, provider="cublas", factor=1.5)
    assert error < LLAMA_TOLERANCE, error


LLAMA3_SHAPE = {"hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 6, "num_attention_heads": 16,
                "num_key_value_heads": 4, "vocab_size": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "max_position_embeddings": 8192, "dtype": "bfloat16"}
"""A llama-3-shaped model, small: grouped-query heads 16/4 of width 64, rope theta 500000."""


@pytest.mark.gpu
@pytest.mark.parametrize("provider", ["torch-cudnn", "triton", "cublas"])
def test_a_llama3_shaped_model_in_bfloat16_on_the_gpu_matches_the_float64_forward(provider):
    from frontend.workloads.llama.config import from_hf

    config = from_hf(LLAMA3_SHAPE, "llama3-shaped")
    error = _llama_error(config, tokens=3000, block=1000, provider=provider, factor=1.5)
    print(f"bf16 llama3-shaped, {provider}: max error / max value {error:.3g} (tolerance {LLAMA_TOLERANCE})")
    assert error < LLAMA_TOLERANCE, error


@on_simulator
def test_an_einsum_that_is_no_gemm_computes_bfloat16_in_float32():
    """A contraction summing a letter of one operand only (no GEMM) takes the einsum path: its bfloat16
    words are widened to float32 and the result rounded back, never summed as integers."""
    g = TaskGraph(devices=1)
    x = g.input((4, 6), "bfloat16", device=0, id="x")
    y = g.input((4, 6), "bfloat16", device=0, id="y")
    g.output(g.einsum("ij,ij->i", x, y, device=0, id="dot"), g.einsum("ij->ji", x, device=0, id="swap"))
    _, inputs, result = _run(g, factor=4.0)
    v = {k: a.astype(np.float32) for k, a in inputs.items()}
    assert ulps(result.outputs["dot"].view(np.uint16), np.einsum("ij,ij->i", v["x"], v["y"])) <= 1
    np.testing.assert_array_equal(result.outputs["swap"], inputs["x"].T)

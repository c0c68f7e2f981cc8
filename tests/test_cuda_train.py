"""The training kernels on the cuda backend (runtime/backends/cuda/kernels_train.py, attention_grad.py).

Under numba-cuda's simulator: each training kernel, run as a one-vertex plan by the cuda backend, equals the
cpu backend's numpy kernel on the same operands (float32, float16, bfloat16), which tests/test_autodiff.py
holds against the float64 formulas; attention's backward on the cublas path over GQA, the causal diagonal,
windows, a partial `prev`, and chunks of heads and rows smaller than a block; a whole tiny LLaMA LoRA
training step (frontend/workloads/llama/train.py) under a budget that offloads equals the cpu backend's.
Shapes are tiny: the simulator runs each thread as Python. The same checks at real sizes, on every path of
attention's backward, are in tests/test_cuda_train_gpu.py (marked `gpu`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.backends.cuda import CudaBackend, attention_grad, simulated
from runtime.kernels_numpy import NUMPY_KERNELS
from tests.kernel_formulas import apply
from turnip_ir.kernels import KERNELS, numpy_dtype
from turnip_ir.taskgraph import TaskGraph

pytestmark = pytest.mark.skipif(not simulated(), reason="these tests run numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")

TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-12}
"""Relative to the largest |value|: the cuda and numpy kernels compute in float32 (float64) and round once,
in a different order, so the results differ by about one rounding of the output's dtype."""


def run_kernel(name: str, xs: list[np.ndarray], attrs: dict, backend: str = "cuda", provider: str = "auto") -> np.ndarray:
    """`name` on `xs` as a one-vertex plan on the cuda backend (the simulator, or a GPU for
    tests/test_cuda_train_gpu.py) with attention `provider`, or with the numpy kernel (`backend` cpu)."""
    shape, dtype = KERNELS[name].infer([x.shape for x in xs], [_name(x) for x in xs], attrs)
    if backend != "cuda":
        out = np.full(shape, np.nan, dtype=numpy_dtype(dtype))
        NUMPY_KERNELS[name](xs, out, attrs)
        return out
    g = TaskGraph(devices=1)
    ids = [g.input(x.shape, _name(x), device=0, id=f"x{i}") for i, x in enumerate(xs)]
    g.output(g.kernel(name, *ids, device=0, id="out", **attrs))
    room = 2 * (sum(x.nbytes for x in xs) + int(np.prod(shape)) * numpy_dtype(dtype).itemsize)
    memgraph = compile_taskgraph(g, room + (1 << 20))
    return execute(memgraph, backend=CudaBackend(attention_provider=provider), inputs={f"x{i}": x for i, x in enumerate(xs)}).outputs["out"]


def _name(x: np.ndarray) -> str:
    return "bfloat16" if x.dtype == ml_dtypes.bfloat16 else str(x.dtype)


def assert_near(got, want, dtype: str, what: str = "") -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    error = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.2e}"


def both(name: str, xs: list[np.ndarray], attrs: dict, dtype: str, what: str = "") -> np.ndarray:
    got = run_kernel(name, xs, attrs)
    assert_near(got, run_kernel(name, xs, attrs, backend="cpu"), dtype, what or name)
    return got


def draw(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(numpy_dtype(dtype))


# ----- the memory-bound kernels -------------------------------------------------------------------------------
@pytest.mark.parametrize("source, target", [("float16", "float32"), ("float32", "float16"), ("bfloat16", "float32"),
                                            ("float32", "bfloat16"), ("float64", "float16"), ("float16", "float64")])
def test_cast_converts_every_element_as_numpy_does(source, target):
    x = draw(np.random.default_rng(0), (3, 13), source, 3.0)  # 39 elements: quads and a tail
    got = run_kernel("cast", [x], {"dtype": target})
    assert got.dtype == numpy_dtype(target)
    np.testing.assert_array_equal(got, x.astype(numpy_dtype(target)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("weighted", [True, False])
def test_rmsnorm_grad_equals_the_numpy_kernel(dtype, weighted):
    rng = np.random.default_rng(1)
    x, dy = draw(rng, (3, 13), dtype), draw(rng, (3, 13), dtype)
    xs = [x, draw(rng, (13,), dtype), dy] if weighted else [x, dy]
    got = both("rmsnorm_grad", xs, {"eps": 1e-5}, dtype)
    if dtype == "float32":  # and the float64 formula (the Jacobian written out)
        assert_near(got, apply("rmsnorm_grad", xs, {"eps": 1e-5}), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_swiglu_grad_equals_the_numpy_kernel(dtype):
    rng = np.random.default_rng(2)
    xs = [draw(rng, (5, 7), dtype, 3.0) for _ in range(3)]
    got = both("swiglu_grad", xs, {}, dtype)
    if dtype == "float32":
        assert_near(got, apply("swiglu_grad", xs, {}), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_attention_unpack_takes_the_output_from_the_packed_partial(dtype):
    packed = draw(np.random.default_rng(3), (3, 2 * 4 + 2), "float32")
    got = run_kernel("attention_unpack", [packed], {"heads": 2, "dtype": dtype})
    np.testing.assert_array_equal(got, packed[:, :8].astype(numpy_dtype(dtype)))


def _labels(tokens: int, vocab: int) -> np.ndarray:
    """Labels of one block's tokens: in this block, in another (vocab + 2), and ignored (-100)."""
    labels = np.arange(tokens, dtype=np.float32) % vocab
    labels[1], labels[-1] = -100, vocab + 2
    return labels


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_the_cross_entropy_chain_equals_the_numpy_kernels(dtype):
    """Two vocabulary blocks (13 and 9 columns) chained, the loss, and each block's gradient with and without
    a scale operand: every step fed the cuda result of the one before."""
    rng = np.random.default_rng(4)
    tokens = 5
    left, right = draw(rng, (tokens, 13), dtype, 4.0), draw(rng, (tokens, 9), dtype, 4.0)
    labels = _labels(tokens, 13)
    work = "float64" if dtype == "float64" else "float32"
    first = both("xent", [left, labels], {}, work, "xent first block")
    stats = both("xent", [right, labels, first], {"start": 13}, work, "xent second block")
    total = both("xent_loss", [stats, labels], {}, work, "xent_loss")
    assert total[1] == tokens - 1
    scale = np.array([0.5], dtype=numpy_dtype(work))
    both("xent_grad", [left, labels, stats, total], {"factor": 3.0}, dtype, "xent_grad")
    both("xent_grad", [right, labels, stats, total, scale], {"start": 13}, dtype, "xent_grad with a scale")


# ----- attention's backward ------------------------------------------------------------------------------------
def attention_grad_operands(rng, dtype: str, heads: int, kv_heads: int, tq: int, tk: int, d: int, masks: dict, wrt: str, with_prev: bool):
    """q, k, v, the forward's packed partial of this key block alone (float32, from the numpy kernel), dO
    and, `with_prev`, a float32 partial gradient."""
    q, d_out = draw(rng, (tq, heads * d), dtype), draw(rng, (tq, heads * d), dtype)
    k, v = draw(rng, (tk, kv_heads * d), dtype), draw(rng, (tk, kv_heads * d), dtype)
    packed = run_kernel("attention", [q, k, v], {"heads": heads, "kv_heads": kv_heads, "final": False, **masks}, backend="cpu")
    xs = [q, k, v, packed, d_out]
    if with_prev:
        xs.append(draw(rng, q.shape if wrt == "q" else (2 * tk, kv_heads * d), "float64" if dtype == "float64" else "float32"))
    return xs


CASES = [
    ("float32", 4, 2, {"causal": True}),
    ("float32", 2, 2, {}),
    ("float32", 4, 1, {"window": 3, "offset": -2}),
    ("float32", 4, 2, {"causal": True, "window": 2}),
    ("float16", 4, 2, {"causal": True}),
    ("float16", 2, 2, {}),
    ("bfloat16", 2, 1, {"causal": True}),
    ("float64", 2, 1, {}),
]


@pytest.mark.parametrize("dtype, heads, kv_heads, masks", CASES)
@pytest.mark.parametrize("wrt", ["q", "kv"])
@pytest.mark.parametrize("with_prev, final", [(False, True), (True, False), (True, True)])
def test_attention_grad_on_the_cublas_path_equals_the_numpy_kernel(dtype, heads, kv_heads, masks, wrt, with_prev, final):
    tokens, d = 5, 4
    xs = attention_grad_operands(np.random.default_rng(heads + kv_heads), dtype, heads, kv_heads, tokens, tokens, d, masks, wrt, with_prev)
    attrs = {"heads": heads, "kv_heads": kv_heads, "wrt": wrt, "final": final, **masks}
    got = both("attention_grad", xs, attrs, dtype)  # half blocks round P and dS to their dtype for the GEMMs, as flash attention does
    if dtype in ("float32", "float64"):  # and the float64 formula, head by head from the softmax's Jacobian
        assert_near(got, apply("attention_grad", xs, attrs), "float32")


@pytest.mark.parametrize("wrt, cap, chunks", [("q", 1, (1, 1)), ("q", 270, (1, 4)), ("q", 600, (1, 6)), ("q", 1040, (2, 6)),
                                              ("kv", 1, (1, 1)), ("kv", 300, (1, 2)), ("kv", 1040, (2, 6))])
def test_attention_grad_in_chunks_of_heads_and_rows_equals_one_chunk(monkeypatch, wrt, cap, chunks):
    """Scratch caps (bytes) below one kv head's block take rows at a time (4 then 2 of 6: a shorter last
    chunk), one that holds two kv heads' blocks takes both at once: the same gradients every time. float16,
    6 x 5 blocks of d 4: a score takes 10 bytes wrt q (S, dP in float32, dS), 12 wrt kv (and P), beside the
    partials (16 bytes a row wrt q, 160 a head wrt kv)."""
    dtype, heads, kv_heads, tq, tk, d = "float16", 4, 2, 6, 5, 4
    xs = attention_grad_operands(np.random.default_rng(7), dtype, heads, kv_heads, tq, tk, d, {"causal": False}, wrt, True)
    attrs = {"heads": heads, "kv_heads": kv_heads, "wrt": wrt, "final": False}
    want = run_kernel("attention_grad", xs, attrs, backend="cpu")
    monkeypatch.setattr(attention_grad, "GRAD_SCRATCH", cap)
    assert attention_grad.grad_chunks(tq, tk, d, kv_heads, dtype, wrt) == chunks
    assert_near(run_kernel("attention_grad", xs, attrs), want, dtype)


def test_a_fused_backward_fed_the_packed_partial_gives_each_links_gradients():
    """What the torch paths rely on, shown with torch's CPU flash backward: fed one (query block, key block)
    pair, O and the log-sum-exp taken from the packed partial of the whole row (as attention_grad.py hands
    them over), it returns that link's dQ, dK and dV, as the numpy attention_grad kernel computes them."""
    torch = pytest.importorskip("torch")
    heads, d, block = 2, 8, 3
    rng = np.random.default_rng(5)
    q, d_out = draw(rng, (2 * block, heads * d), "float32"), draw(rng, (2 * block, heads * d), "float32")
    k, v = draw(rng, (2 * block, heads * d), "float32"), draw(rng, (2 * block, heads * d), "float32")
    rows, base = slice(block, 2 * block), {"heads": heads, "kv_heads": heads}
    keys = [slice(0, block), slice(block, 2 * block)]
    packed = run_kernel("attention", [q[rows], k[keys[0]], v[keys[0]]], {**base, "final": False}, backend="cpu")
    packed = run_kernel("attention", [q[rows], k[keys[1]], v[keys[1]], packed], {**base, "causal": True, "final": False}, backend="cpu")
    view = lambda x: torch.from_numpy(np.ascontiguousarray(x)).view(block, heads, d).transpose(0, 1).unsqueeze(0)
    o, lse = view(packed[:, : heads * d]), torch.from_numpy(np.ascontiguousarray(packed[:, heads * d :].T)).unsqueeze(0)
    for j, causal in ((0, False), (1, True)):
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            view(d_out[rows]), view(q[rows]), view(k[keys[j]]), view(v[keys[j]]), o, lse, 0.0, causal, scale=1 / np.sqrt(d))
        flat = [g[0].transpose(0, 1).reshape(block, heads * d).numpy() for g in grads]
        xs = [q[rows], k[keys[j]], v[keys[j]], packed, d_out[rows]]
        attrs = {**base, "causal": causal}
        assert_near(flat[0], run_kernel("attention_grad", xs, {**attrs, "wrt": "q"}, backend="cpu"), "float32", f"dq of link {j}")
        assert_near(np.concatenate(flat[1:]), run_kernel("attention_grad", xs, {**attrs, "wrt": "kv"}, backend="cpu"), "float32", f"dk, dv of link {j}")


def test_grad_paths_follow_the_provider_and_the_dtype(monkeypatch):
    path = attention_grad.grad_path
    assert path("torch-cudnn", "float16", {}) == "torch-cudnn"
    assert path("torch-flash", "bfloat16", {}) == "torch-flash"
    assert path("triton", "float16", {}) == "torch-flash"
    assert path("torch-cudnn", "float32", {}) == path("cublas", "float16", {}) == path("torch-cudnn", "float16", {"window": 4}) == "cublas"
    monkeypatch.setenv(attention_grad.PATH_ENV, "cublas")
    assert path("torch-cudnn", "float16", {}) == "cublas"
    monkeypatch.setenv(attention_grad.PATH_ENV, "flash")
    assert path("torch-cudnn", "float16", {}) == "torch-flash"


# ----- a whole training step -----------------------------------------------------------------------------------
TINY = {"hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 12, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "model_type": "llama"}
"""One layer, GQA (2 query heads of 4 on one kv head): every simulated attention vertex costs about a second."""


def tiny_step(dtype: str, batch: int = 1, seq_len: int = 4, block: int = 2, loss_scale: float = 1.0, doc: dict = TINY, rank: int = 2):
    """A LoRA training step of the `doc` model (rank `rank` on q, k, v and o) and its inputs: random weights,
    adapters with B nonzero (so every adapter has a gradient), random token ids."""
    from frontend.workloads import llama
    from frontend.workloads.llama.config import from_hf
    from frontend.workloads.llama.train import LoraSpec, build_training_step

    config = from_hf({**doc, "dtype": dtype}, "tiny")
    lora = LoraSpec(rank=rank, alpha=2.0 * rank, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    step = build_training_step(config, batch, seq_len, lora, block=block, loss_scale=loss_scale)
    rng = np.random.default_rng(0)
    weights = {name: np.asarray(value, numpy_dtype(dtype)) for name, value in llama.RandomWeights(config, seed=1).items()}
    adapters = {name: 0.2 * rng.standard_normal(shape).astype(np.float32) for name, shape in lora.shapes(config).items()}
    ids = rng.integers(0, config.vocab_size, (batch, seq_len))
    return step, step.feed(weights, adapters, ids)


def _plan_and_runs(step, inputs, dtype: str):
    """The step planned under a budget that offloads, run on the cpu backend and on the simulator (random order)."""
    from passes.insert_offload import minimum_budget

    memgraph = compile_taskgraph(step.graph, int(minimum_budget(step.graph) * 1.3))
    assert memgraph.count("offload") > 0
    kernels = {node.kernel for node in memgraph.nodes if node.op == "kernel"}
    training = {"rmsnorm_grad", "swiglu_grad", "attention_unpack", "attention_grad", "xent", "xent_loss", "xent_grad"}
    assert training | ({"cast"} if dtype == "float16" else set()) <= kernels  # float16 casts partial products to float32
    return execute(memgraph, "cpu", inputs=inputs).outputs, execute(memgraph, backend=CudaBackend(), order="random", seed=3, inputs=inputs).outputs


def test_a_float32_lora_training_step_on_cuda_equals_the_cpu_backend():
    """Forward, LM head, loss and the adapters' gradients (rmsnorm_grad, swiglu_grad, attention_unpack,
    attention_grad on both chains, the cross-entropy chain) on the simulator against the cpu backend."""
    step, inputs = tiny_step("float32")
    want, got = _plan_and_runs(step, inputs, "float32")
    assert step.loss(got) == pytest.approx(step.loss(want), rel=1e-5)
    for name, expected in step.grads(want).items():
        assert_near(step.grads(got)[name], expected, "float32", name)


def test_a_float16_step_of_two_sequences_is_as_near_float32_as_the_cpu_backends():
    """Two sequences side by side, a loss scale, casts: each backend's float16 gradients against the float32
    step on the same (rounded) inputs. Both round at every kernel, in different places (the cuda backend
    rounds P and dS for attention's GEMMs), so an adapter's error differs between them (1e-3 to 2e-2 here):
    each of the cuda backend's is within 3e-2 of the float32 step, or twice the cpu backend's largest where
    that is more (the cpu backend's rmsnorm, rope and swiglu now round once, in float32, so its largest fell
    to 5.5e-3), where a wrong kernel gives O(1)."""
    step, inputs = tiny_step("float16", batch=2, loss_scale=64.0)
    cpu, cuda = _plan_and_runs(step, inputs, "float16")
    wide, _ = tiny_step("float32", batch=2)
    exact = execute(compile_taskgraph(wide.graph, 1 << 30), "cpu",
                    inputs={k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in {**inputs, "loss_scale": np.ones(1, np.float32)}.items()}).outputs
    assert step.loss(cuda) == pytest.approx(wide.loss(exact), rel=1e-3) and step.loss(cpu) == pytest.approx(wide.loss(exact), rel=1e-3)
    errors = {name: [np.abs(step.grads(run)[name] - want).max() / np.abs(want).max() for run in (cpu, cuda)]
              for name, want in wide.grads(exact).items()}
    worst_cpu = max(cpu_error for cpu_error, _ in errors.values())
    assert worst_cpu < 0.05
    for name, (_, cuda_error) in errors.items():
        assert cuda_error <= max(2 * worst_cpu, 3e-2), f"{name}: cuda {cuda_error:.2e}, the cpu backend's worst {worst_cpu:.2e}"


# ----- compiled for the GPU --------------------------------------------------------------------------------------
PTX_SCRIPT = r'''
import re
import sys
import types
import numba.cuda.dispatcher as D
from numba import cuda
from numba.cuda import types as T
from runtime.backends.cuda import kernels_train as K
D.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))  # as tests/test_cuda_ptx.py

def arr(dt, nd, layout="C"):
    return T.Array({"float16": T.float16, "bfloat16": T.uint16, "float32": T.float32, "float64": T.float64}[dt], nd, layout)

def ptx(kernel, sig):
    return cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0]

for dt in sys.argv[1].split(","):
    work = "float64" if dt == "float64" else "float32"
    vector = dt in ("float16", "bfloat16")  # the quad builds of half tensors; the element builds of the others
    for other in {"float32", "float16"} - {dt}:
        ptx(K.cast(dt, other, vector), (arr(dt, 1), arr(other, 1)))
    ptx(K.swiglu_grad(dt, vector), (arr(dt, 1),) * 4)
    ptx(K.rmsnorm_grad(dt, True, vector), (arr(dt, 1),) * 4 + (T.int64, T.float64))
    ptx(K.attention_unpack(dt, vector), (arr("float32", 1), arr(dt, 1), T.int64, T.int64))
    ptx(K.xent(dt, work, True, vector), (arr(dt, 1), arr("float32", 1), arr(work, 1), arr(work, 1), T.int64, T.int64))
    ptx(K.xent_grad(dt, work, True, vector), (arr(dt, 1), arr("float32", 1)) + (arr(work, 1),) * 3 + (arr(dt, 1), T.int64, T.int64, T.float64))
    ptx(K.xent_loss(work), (arr(work, 1), arr("float32", 1), arr(work, 1)))
    ptx(K.attention_grad_scores(dt, work, True, True, True), (arr(work, 3),) * 2 + (arr(dt, 3),) * 2 + (arr("float32", 2), arr(dt, 2)) + (T.int64,) * 7)
    for source in {dt, work}:  # torch's gradients (the block's dtype) or the cublas path's partials
        prev = "float32" if source != "float64" else work
        ptx(K.attention_grad_finish(source, dt, True, vector), (arr(source, 3, "A"), arr(prev, 2, "A"), arr(dt, 2, "A")) + (T.int64,) * 4)
if "checks" in sys.argv:
    for vector in (True, False):  # the quad builds read and write by vector instructions, the element builds do not
        text = ptx(K.swiglu_grad("float16", vector), (arr("float16", 1),) * 4)
        assert ("ld.global.v4.u16" in text and "st.global.v4.u16" in text) == vector, vector
        text = ptx(K.attention_grad_finish("float16", "float32", True, vector), (arr("float16", 3, "A"), arr("float32", 2, "A"), arr("float32", 2, "A")) + (T.int64,) * 4)
        found = [bool(re.search(p, text)) for p in (r"ld(\.global)?\.v4\.u16", r"ld(\.global)?\.v4\.f32", r"st(\.global)?\.v4\.f32")]
        assert found == [vector] * 3, (vector, found)
print("compiled")
'''


@pytest.mark.parametrize("args", [("float16,float64", "checks"), ("bfloat16,float32",)], ids=["float16-float64", "bfloat16-float32"])
def test_every_training_kernel_compiles_to_ptx_for_sm90(args):
    """What the simulator cannot catch (a type numba cannot unify, a conversion it lacks), in a process of its
    own per pair of dtypes, where NVVM is installed (tests/test_cuda_ptx.py's check)."""
    import os
    import subprocess
    import sys

    from tests.test_cuda_ptx import _toolchain

    if not _toolchain():
        pytest.skip("no NVVM/NVRTC here to compile PTX with")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    proc = subprocess.run([sys.executable, "-c", PTX_SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled" in proc.stdout

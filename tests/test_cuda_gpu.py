"""The cuda backend on a real GPU (marked `gpu`; bench/gpu_check.py runs them on the H200).

Correctness against float64 references, the memory promise (nothing allocated while the loop runs, the
GPU's free memory never drops by more than the budget), a 100,000-vertex stress test over every lane,
and clean endings after a failing kernel and after Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from runtime import arena_budget, execute
from runtime.inputs import input_specs, make_inputs
from tools.float64 import evaluate
from tools.synthetic import random_memgraph
from tests import formulas_llama as formulas
from tests.attention_graphs import attention_graph, packed_attention_graph, per_sequence_attention
from tools.random_graphs import random_taskgraph
from turnip_ir.taskgraph import TaskGraph

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _backend(**options):
    from runtime.backends.cuda import CudaBackend

    return CudaBackend(**options)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("order", ["random", "nondet"])
def test_random_graphs_under_tight_budgets_match_float64(seed, order):
    graph = random_taskgraph(seed, tasks=60, devices=1, sizes=(64, 128, 256))
    budget = int(minimum_budget(place_devices(graph, 0)) * 1.25)
    memgraph = compile_taskgraph(graph, budget)
    assert memgraph.count("reload") > 0
    inputs = make_inputs(input_specs(memgraph), None, seed)
    result = execute(memgraph, backend=_backend(), order=order, seed=seed, inputs=inputs)
    expected = evaluate(graph, {k: v.astype(np.float64) for k, v in inputs.items()})
    for task, want in expected.items():
        np.testing.assert_allclose(result.outputs[task], want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("notifier", ["hostfunc-side", "hostfunc", "poll", "thread"])
def test_every_notifier_runs_random_graphs_to_the_float64_result(notifier):
    from bench import notifiers  # noqa: F401  (registers the alternatives the benchmarks compare)
    from runtime.backends.cuda.completion import NOTIFIERS

    assert set(NOTIFIERS) == {"hostfunc-side", "hostfunc", "poll", "thread"}  # a new notifier joins this test
    graph = random_taskgraph(11, tasks=120, devices=1, sizes=(64, 128, 256))
    memgraph = compile_taskgraph(graph, int(minimum_budget(place_devices(graph, 0)) * 1.25))
    inputs = make_inputs(input_specs(memgraph), None, 11)
    expected = evaluate(graph, {k: v.astype(np.float64) for k, v in inputs.items()})
    for order in ("random", "nondet"):
        result = execute(memgraph, backend=_backend(notifier=notifier), order=order, seed=3, inputs=inputs)
        for task, want in expected.items():
            np.testing.assert_allclose(result.outputs[task], want, rtol=2e-3, atol=2e-3)


def test_one_prepared_backend_runs_two_memgraphs_on_the_gpu():
    from tests.test_cuda_sim import check_prepared_backend

    check_prepared_backend(sizes=(64, 128, 256), tol=2e-3)


@pytest.mark.parametrize("cols", [100, 1025, 4096, 16387])
def test_quad_kernels_match_numpy_at_widths_beyond_a_block(cols):
    from tests.test_cuda_sim import check_quad_kernels

    check_quad_kernels(cols, rows=5, vector=cols % 4 == 0)
    check_quad_kernels(cols, rows=5, vector=False)


@pytest.mark.parametrize("d", [64, 128, 200])
@pytest.mark.parametrize("has_prev", [True, False])
@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("interleaved", [True, False])
def test_attention_merge_matches_numpy(d, has_prev, vector, interleaved):
    from tests.test_cuda_sim import check_attention_merge

    for final in (True, False):
        check_attention_merge(d, has_prev, final, tq=33, vector=vector, interleaved=interleaved)


@pytest.mark.parametrize("provider", ["torch-cudnn", "torch-flash", "triton", "cublas"])
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_blocked_attention_providers_equal_full_causal_attention(provider, kv_heads):
    _blocked_attention_matches(provider, 512, kv_heads, input_seed=3)


def _blocked_attention_matches(provider: str, tokens: int, kv_heads: int, input_seed: int, order: str = "nondet", seeds=(0,)) -> None:
    """Causal attention over `tokens` in 128-token blocks (8 heads of 64) through `provider`, run in `order`
    with each of `seeds`, equals the float64 formula over the whole sequence."""
    block, heads, width = 128, 8, 64
    graph = attention_graph(tokens, block, heads, kv_heads, width, "float16")
    memgraph = compile_taskgraph(graph, 64 << 20)
    inputs = make_inputs(input_specs(memgraph), None, input_seed)
    cat = lambda p: np.concatenate([inputs[f"{p}{i}"] for i in range(tokens // block)])  # noqa: E731
    want = formulas.attention(cat("q"), cat("k"), cat("v"), heads, kv_heads, causal=True)
    for seed in seeds:
        result = execute(memgraph, backend=_backend(attention_provider=provider), order=order, seed=seed, inputs=inputs)
        got = np.concatenate([result.outputs[f"a{i}.{i}"] for i in range(tokens // block)]).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def _mixed_graph(size=2048):
    """GEMMs, elementwise, rows, rope, swiglu and attention: every kind of launch the backend makes."""
    g = TaskGraph(devices=1)
    x = g.input((size, size), "float16", device=0, id="x")
    w = g.input((size, size), "float16", device=0, id="w")
    c = g.input((size, 64), "float16", device=0, id="cos")
    s = g.input((size, 64), "float16", device=0, id="sin")
    h = g.rmsnorm(g.einsum("ti,oi->to", x, w, device=0), device=0)
    q = g.rope(h, c, s, device=0)
    a = g.attention(q, h, h, heads=size // 64, kv_heads=size // 64, causal=True, device=0)
    g.output(g.swiglu(g.gelu(a, device=0), g.softmax(h, device=0), device=0))
    return g


def test_nothing_is_allocated_while_the_loop_runs_and_free_memory_stays_within_the_budget():
    graph = _mixed_graph()
    budget = 512 << 20
    memgraph = compile_taskgraph(graph, arena_budget(graph, budget, "cuda"))
    backend = _backend(sample_memory=0.0002)
    execute(memgraph, backend=backend, order="nondet")
    stats = backend.stats
    assert stats["cupy_refused"] == 0 and stats["cupy_served"] == 0
    assert stats.get("torch_new_segments", 0) == 0
    assert 0 < stats["peak_drop"] <= budget, stats


def test_torch_attention_holds_one_set_of_blocks_per_gpu_whatever_the_lanes():
    """torch's attention runs on the GPU's one attention stream, so compute lanes beyond the first add no
    attention blocks: each added 19 MiB plus half a block (23 MiB at 2048) while it ran on the lanes' own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("library_probe", os.path.join(ROOT, "bench", "investigations", "library_probe.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    one, three = (probe.measure("torch-cudnn", streams, 2048) for streams in (1, 3))
    assert "error" not in one and "error" not in three, (one, three)
    assert three["library"] - one["library"] <= 12 << 20, (one, three)
    assert three["library"] <= three["allowance"], three


@pytest.mark.parametrize("order", ["random", "nondet"])
def test_torch_attention_on_its_own_stream_matches_float64_in_any_order(order):
    """Query blocks on two lanes, their attention on the GPU's one attention stream: each lane waits for it,
    and it for the lane, in any dispatch order."""
    _blocked_attention_matches("torch-cudnn", 1024, 2, input_seed=5, order=order, seeds=range(3))


def test_a_hundred_thousand_tiny_vertices_over_every_lane_finish_in_both_orders():
    script = (
        "import sys, time; from tools.synthetic import random_memgraph; from runtime import execute;"
        "from runtime.backends.cuda import CudaBackend;"
        "g = random_memgraph(7, vertices=100_000, devices=1);"
        "[print(o, execute(g, backend=CudaBackend(), order=o, seed=1).summary.wall_time) for o in ('random', 'nondet')]"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "random" in proc.stdout and "nondet" in proc.stdout


def test_a_kernel_that_faults_ends_the_run_with_one_line_naming_what_ran():
    script = r'''
import numpy as np
from numba import cuda
from runtime.backends.cuda import builders
from runtime import execute
from runtime.backends.cuda import CudaBackend
from turnip_ir.taskgraph import TaskGraph
from passes.pipeline import compile_taskgraph
from turnip_ir.errors import KernelError

@cuda.jit
def wild(out):
    out[cuda.grid(1) + (1 << 40)] = 1.0

def broken(node, inputs, out, env):
    go = env.launch(wild, 1, 32, (out.reshape(out.size),))
    return lambda lane: go(env.launch_streams[lane])

builders.BUILDERS["relu"] = broken
g = TaskGraph(devices=1)
g.output(g.relu(g.input((1024,), "float32", device=0, id="x"), device=0, id="r"))
try:
    execute(compile_taskgraph(g, 1 << 20), backend=CudaBackend())
except KernelError as err:
    print("KernelError:", err)
'''
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    assert "KernelError:" in proc.stdout and "(relu 'r')" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_ctrl_c_ends_a_gpu_run_cleanly(tmp_path):
    graph = random_memgraph(3, vertices=400_000, devices=1)
    path = tmp_path / "long.json"
    path.write_text(graph.dumps())
    proc = subprocess.Popen([sys.executable, "-m", "turnip_cli.main", "run", str(path), "--backend", "cuda", "--no-verify"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    time.sleep(12)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("preset, dtype", [("tiny", "float32"), ("tiny-gqa", "float16")])
@pytest.mark.parametrize("provider", ["torch-cudnn", "triton", "cublas"])
def test_llama_prefill_on_the_gpu_equals_the_float64_reference(preset, dtype, provider):
    from dataclasses import replace

    from frontend.workloads import llama
    from frontend.workloads.llama.float64_forward import float64_forward

    config = replace(llama.load_config(preset), dtype=dtype)
    weights = llama.RandomWeights(config, 1)
    ids = llama.random_ids(config, 256, 1)
    built = llama.build_llama(config, 256, block=64)
    budget = int(minimum_budget(place_devices(built.graph, 0)) * 1.5)
    memgraph = compile_taskgraph(built.graph, budget)
    assert memgraph.count("offload") + memgraph.count("reload") > 0
    result = execute(memgraph, backend=_backend(attention_provider=provider), order="nondet", inputs=built.feed(weights, ids))
    got = built.gather(result.outputs).astype(np.float64)
    want = float64_forward(config, weights, ids)
    tol = 2e-2 if dtype == "float16" else 1e-4
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < tol


@pytest.mark.parametrize("provider", ["torch-cudnn", "torch-flash", "torch-efficient", "triton", "cublas"])
@pytest.mark.parametrize("lengths", [[128] * 4, [200, 56, 129, 127]])  # one batched torch call; one call per sequence
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_blocks_of_packed_sequences_equal_causal_attention_per_sequence_on_every_provider(provider, lengths, kv_heads):
    """A segmented causal block (and one merged into a partial before it) against the float64 formulas,
    in two orders; torch's sequences of one length run as one batched call, uneven ones one call each."""
    from kernel_formulas import evaluate as formula

    heads, width = 8, 64
    for prev in (False, True):
        graph = packed_attention_graph(lengths, heads, kv_heads, width, "float16", prev=prev)
        memgraph = compile_taskgraph(graph, 64 << 20)
        inputs = make_inputs(input_specs(memgraph), None, 5)
        f64 = {name: value.astype(np.float64) for name, value in inputs.items()}
        want = formula(graph, f64)["a"]
        if not prev:
            np.testing.assert_allclose(want, per_sequence_attention(f64["q"], f64["k"], f64["v"], heads, kv_heads, lengths), atol=1e-9)
        for order in ("nondet", "random"):
            result = execute(memgraph, backend=_backend(attention_provider=provider), order=order, seed=1, inputs=inputs)
            np.testing.assert_allclose(result.outputs["a"].astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("provider", ["torch-cudnn", "triton", "cublas"])
def test_a_packed_llama_prefill_on_the_gpu_gives_each_prompt_its_own_hidden_states(provider):
    from dataclasses import replace

    from frontend.workloads import llama
    from frontend.workloads.llama.float64_forward import float64_forward

    config = replace(llama.load_config("tiny-gqa"), dtype="float16")
    weights = llama.RandomWeights(config, 1)
    lengths = [64, 64, 30, 1, 97, 200]  # a block of two, a block of three uneven, a prompt longer than a block
    prompts = [llama.random_ids(config, n, s) for s, n in enumerate(lengths)]
    built = llama.build_llama(config, sum(lengths), block=128, sequences=lengths)
    budget = int(minimum_budget(place_devices(built.graph, 0)) * 1.5)
    memgraph = compile_taskgraph(built.graph, budget)
    assert memgraph.count("offload") + memgraph.count("reload") > 0
    result = execute(memgraph, backend=_backend(attention_provider=provider), order="nondet", inputs=built.feed(weights, np.concatenate(prompts)))
    for hidden, ids in zip(built.gather_sequences(result.outputs), prompts):
        want = float64_forward(config, weights, ids)
        assert np.max(np.abs(hidden.astype(np.float64) - want)) / np.max(np.abs(want)) < 2e-2


def _two_gpus() -> bool:
    from runtime.backends.cuda import gpu_count

    return gpu_count() >= 2


@pytest.mark.skipif("not _two_gpus()")
@pytest.mark.parametrize("seed", range(3))
def test_random_graphs_over_two_gpus_move_data_by_peer_copies_and_match_float64(seed):
    graph = random_taskgraph(seed, tasks=60, devices=2, sizes=(64, 128), move_prob=0.25)
    memgraph = compile_taskgraph(graph, int(minimum_budget(place_devices(graph, 0)) * 1.3))
    assert memgraph.count("move") > 0
    inputs = make_inputs(input_specs(memgraph), None, seed)
    result = execute(memgraph, backend=_backend(), order="nondet", seed=seed, inputs=inputs)
    assert result.summary.bytes_moved > 0
    expected = evaluate(graph, {k: v.astype(np.float64) for k, v in inputs.items()})
    for task, want in expected.items():
        np.testing.assert_allclose(result.outputs[task], want, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif("not _two_gpus()")
@pytest.mark.parametrize("placement", ["sequence", "layers", "heads"])
def test_llama_over_two_gpus_equals_the_float64_reference(placement):
    from dataclasses import replace

    from frontend.workloads import llama
    from frontend.workloads.llama.float64_forward import float64_forward

    config = replace(llama.load_config("tiny-gqa"), dtype="float32")
    weights = llama.RandomWeights(config, 2)
    ids = llama.random_ids(config, 256, 2)
    built = llama.build_llama(config, 256, block=64, gpus=2, placement=placement)
    memgraph = compile_taskgraph(built.graph, int(minimum_budget(place_devices(built.graph, 0)) * 1.5))
    result = execute(memgraph, backend=_backend(), order="nondet", inputs=built.feed(weights, ids))
    got = built.gather(result.outputs).astype(np.float64)
    want = float64_forward(config, weights, ids)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4

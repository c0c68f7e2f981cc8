"""GPU benchmarks of the cuda backend, each figure a ratio to a ceiling or baseline measured in the same run.

    python3 bench/bench_cuda.py SECTION... [--json results.json] [--quick] [--peer-n N]

Sections: ceilings (H2D, D2H, both at once, HBM copy, fp16 GEMM), notifiers (completion latency and a
100,000-vertex stress test per notifier), lookahead (idle gap between dependent GEMMs, queued ahead or
not), dispatch (host cost per tiny vertex), kernels (memory-bound kernels against the HBM copy rate),
merge (the attention merge alone), attention (providers on 7B blocks against
torch's best SDPA), copies (reload-bound and duplex chains),
ffn (16 layers 8192x32768 fp16 at 8 GiB: turnip nondet and fixed, a synchronous layer-by-layer copy, a
hand-written double-buffered prefetch, and the PCIe floor), sim (the sim prediction beside the measured run),
triton (the triton provider's tile sweep), contention (H2D alone and under GEMMs), peer (two GPUs: the
peer-copy ceiling, then the seed's blocked matmul, 49152^3 fp32 by default, at 16 and 6 GiB per GPU).
Run on the GPU machine after `source bench/gpu_setup.sh` (bench/gpu_bench.sh has the stages).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import arena_budget, execute, sim_makespan  # noqa: E402
from runtime.backends import make_backend  # noqa: E402
from runtime.backends.cuda import CudaBackend  # noqa: E402
import notifiers  # noqa: E402,F401  (registers the alternative notifiers this script may pick)
from runtime.backends.cuda.completion import DEFAULT_NOTIFIER, NOTIFIERS  # noqa: E402
from runtime.callbacks import Recorder  # noqa: E402
from runtime.executor import Executor  # noqa: E402
from runtime.graph import build_exec_graph  # noqa: E402
from runtime.inputs import Tiled, input_specs  # noqa: E402
from runtime.policies import make_policy  # noqa: E402
from runtime.summary import summarize, union_length  # noqa: E402
from tools.synthetic import chain_memgraph, random_memgraph  # noqa: E402
from turnip_ir.memgraph import MemGraph, MemNode  # noqa: E402
from turnip_ir.taskgraph import TaskGraph  # noqa: E402

GIB = 1 << 30
RESULTS: dict = {}


def row(*cells) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def cuda_time(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of `fn()` on torch's current stream, timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


# ----- ceilings ----------------------------------------------------------------------------------------
def ceilings(quick: bool) -> dict:
    import torch

    n = GIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev, dev2 = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = n / cuda_time(lambda: dev.copy_(host, non_blocking=True))
    d2h = n / cuda_time(lambda: back.copy_(dev2, non_blocking=True))
    side = torch.cuda.Stream()

    def duplex():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            back.copy_(dev2, non_blocking=True)
        dev.copy_(host, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    both = 2 * n / cuda_time(duplex)
    hbm = 2 * n / cuda_time(lambda: dev2.copy_(dev))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    gemm = 2 * 8192**3 / cuda_time(lambda: torch.matmul(a, a), repeats=10)
    del host, back, dev, dev2, a
    torch.cuda.empty_cache()
    out = {"h2d": h2d, "d2h": d2h, "duplex": both, "hbm": hbm, "gemm_fp16": gemm}
    print("\n### Ceilings\n")
    row("H2D GB/s", "D2H GB/s", "both at once GB/s", "HBM copy GB/s (read+write)", "fp16 GEMM 8192^3 TFLOP/s")
    row("---", "---", "---", "---", "---")
    row(f"{h2d / 1e9:.1f}", f"{d2h / 1e9:.1f}", f"{both / 1e9:.1f}", f"{hbm / 1e9:.0f}", f"{gemm / 1e12:.0f}")
    return out


# ----- prepared runs: one prepare, several loops ------------------------------------------------------
def loops(memgraph: MemGraph, backend, orders=("nondet",), repeats: int = 3, inputs=None, streams: int = 2) -> dict:
    """Prepare once, run the loop `repeats` times per order (inputs are read-only, so reruns are valid).

    Returns per order the median loop wall time, device makespan and the last run's summary."""
    graph = build_exec_graph(memgraph, streams)
    specs = input_specs(memgraph)
    arrays = inputs or {task: _zeros_free(shape, dtype) for task, (shape, dtype) in specs.items()}
    backend.prepare(graph, arrays)
    out = {}
    try:
        for order in orders:
            walls, spans, summary = [], [], None
            for repeat in range(repeats + 1):
                if repeat or order != orders[0]:
                    backend.place_inputs(arrays)  # the last run may have reused inputs' memory
                recorder = Recorder()
                began = time.perf_counter()
                Executor(graph, backend, make_policy(order, graph, repeat), [recorder]).run()
                wall = time.perf_counter() - began
                summary = summarize(graph, recorder.completions, "cuda", order, wall)
                if repeat:  # the first run is the warm-up
                    walls.append(wall)
                    spans.append(summary.makespan)
            out[order] = {"wall": statistics.median(walls), "makespan": statistics.median(spans), "summary": summary, "recorder": recorder}
        out["outputs"] = backend.read_outputs()
    finally:
        backend.close()
    out["stats"] = dict(getattr(backend, "stats", {}))
    out["notes"] = backend.notes()
    return out


def _zeros_free(shape, dtype, scale: float = 0.1):
    """A cheap non-zero input: a small random block repeated (never zeros: they time faster than data)."""
    rng = np.random.default_rng(0)
    if not shape or shape[0] == 0:
        return rng.standard_normal(shape).astype(dtype)
    rows = next(r for r in (64, 32, 16, 8, 4, 2, 1) if shape[0] % r == 0)
    block = (rng.standard_normal((rows, *shape[1:])) * scale).astype(dtype)
    return Tiled(block, tuple(shape))


def _weights(graph):
    """Inputs for a graph: activations ~N(0, 1), 2-D weights ~N(0, 1/fan_in) so deep stacks stay finite in fp16."""
    return {task: _zeros_free(node.shape, node.dtype, 1.0 if task == "x" or len(node.shape) < 2 else node.shape[1] ** -0.5)
            for task, node in graph.nodes.items() if node.op == "input"}


# ----- notifiers ----------------------------------------------------------------------------------------
def notifiers(quick: bool) -> dict:
    out = {}
    print("\n### Completion notifiers\n")
    row("notifier", "chain latency us/vertex (no queueing)", "stress vertices", "random us/vertex", "nondet us/vertex")
    row("---", "---", "---", "---", "---")
    chain = chain_memgraph(2000)
    for kind in NOTIFIERS:
        size = 100_000 if kind == DEFAULT_NOTIFIER and not quick else 20_000
        stress = random_memgraph(7, vertices=size, devices=1)
        lat = loops(chain, CudaBackend(notifier=kind, lookahead=False), repeats=2)["nondet"]["wall"] / len(chain)
        runs = loops(stress, CudaBackend(notifier=kind), orders=("random", "nondet"), repeats=1)
        per = {o: runs[o]["wall"] / len(stress) for o in ("random", "nondet")}
        out[kind] = {"latency": lat, "vertices": size, **per}
        row(kind, f"{lat * 1e6:.1f}", f"{size:,}", f"{per['random'] * 1e6:.1f}", f"{per['nondet'] * 1e6:.1f}")
    return out


# ----- lookahead ----------------------------------------------------------------------------------------
def gemm_chain(length: int = 32, n: int = 4096) -> MemGraph:
    g = TaskGraph(devices=1)
    w = g.input((n, n), "float16", device=0, id="w")
    x = g.input((n, n), "float16", device=0, id="x")
    for i in range(length):
        x = g.matmul(x, w, device=0, id=f"m{i}")
    g.output(x)
    return compile_taskgraph(g, (length + 3) * n * n * 2)


def lookahead(quick: bool) -> dict:
    chain = gemm_chain(16 if quick else 48)
    out = {}
    print("\n### Dependent kernels: host round trip against queueing ahead (4096^3 fp16 GEMM chain)\n")
    row("mode", "median GEMM us", "median idle gap us", "us per GEMM (wall)")
    row("---", "---", "---", "---")
    for label, ahead in (("host waits (lookahead off)", False), ("queued ahead (default)", True)):
        run = loops(chain, CudaBackend(lookahead=ahead), repeats=3)["nondet"]
        spans = sorted((c.start, c.end) for c in run["recorder"].completions)
        gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        busy = statistics.median(e - s for s, e in spans)
        gap = statistics.median(gaps)
        out[label] = {"gemm": busy, "gap": gap, "wall_per": run["wall"] / len(spans)}
        row(label, f"{busy * 1e6:.1f}", f"{gap * 1e6:.1f}", f"{run['wall'] / len(spans) * 1e6:.1f}")
    return out


# ----- dispatch -------------------------------------------------------------------------------------
def dispatch(quick: bool) -> dict:
    graph = random_memgraph(11, vertices=20_000, devices=1)
    run = loops(graph, CudaBackend(), repeats=2)["nondet"]
    completions = run["recorder"].completions
    busy = union_length([(c.start, c.end) for c in completions])
    per = (run["wall"] - busy) / len(completions)
    print("\n### Dispatch overhead (20,000 tiny vertices over compute, H2D and D2H lanes)\n")
    row("loop wall s", "device busy s (any lane)", "(wall - busy) / vertex us")
    row("---", "---", "---")
    row(f"{run['wall']:.3f}", f"{busy:.3f}", f"{per * 1e6:.1f}")
    return {"wall": run["wall"], "busy": busy, "per_vertex": per}


# ----- memory-bound kernels ---------------------------------------------------------------------------
def kernels(quick: bool, hbm: float) -> dict:
    rows, cols = 8192, 16384  # 256 MiB of fp16
    g = TaskGraph(devices=1)
    x = g.input((rows, cols), "float16", device=0, id="x")
    y = g.input((rows, cols), "float16", device=0, id="y")
    w = g.input((cols,), "float16", device=0, id="w")
    c = g.input((rows, 128), "float16", device=0, id="cos")
    s = g.input((rows, 128), "float16", device=0, id="sin")
    made = {"add": g.add(x, y, device=0, id="add"), "gelu": g.gelu(x, device=0, id="gelu"), "rmsnorm": g.rmsnorm(x, w, device=0, id="rmsnorm"),
            "softmax": g.softmax(x, device=0, id="softmax"), "rope": g.rope(x, c, s, device=0, id="rope"), "swiglu": g.swiglu(x, y, device=0, id="swiglu")}
    g.output(*made.values())
    memgraph = compile_taskgraph(g, 12 * rows * cols * 2)
    run = loops(memgraph, CudaBackend(), repeats=3, streams=1)["nondet"]  # one stream: kernels one at a time
    by_task = {}
    for done in run["recorder"].completions:
        node = memgraph.nodes[done.vertex]
        by_task[node.task] = done.end - done.start
    traffic = {"add": 3, "gelu": 2, "rmsnorm": 2, "softmax": 2, "rope": 2, "swiglu": 3}
    out = {}
    print(f"\n### Memory-bound kernels, fp16 [{rows}, {cols}] (HBM copy rate in the same run: {hbm / 1e9:.0f} GB/s)\n")
    row("kernel", "us", "GB/s (read+write)", "fraction of HBM copy rate")
    row("---", "---", "---", "---")
    for name, factor in traffic.items():
        seconds = by_task[name]
        rate = factor * rows * cols * 2 / seconds
        out[name] = {"seconds": seconds, "rate": rate, "fraction": rate / hbm}
        row(name, f"{seconds * 1e6:.0f}", f"{rate / 1e9:.0f}", f"{rate / hbm:.2f}")
    return out


# ----- attention providers ---------------------------------------------------------------------------
def attention_bench(quick: bool) -> dict:
    import torch
    import torch.nn.functional as F

    heads, block, width = 32, 4096, 128
    q4 = torch.randn(1, heads, block, width, device="cuda", dtype=torch.float16)
    full = 4 * block * block * heads * width
    best_full = full / cuda_time(lambda: F.scaled_dot_product_attention(q4, q4, q4), repeats=10)
    best_causal = full / 2 / cuda_time(lambda: F.scaled_dot_product_attention(q4, q4, q4, is_causal=True), repeats=10)
    del q4
    g = TaskGraph(devices=1)
    q = g.input((block, heads * width), "float16", device=0, id="q")
    k = g.input((block, heads * width), "float16", device=0, id="k")
    v = g.input((block, heads * width), "float16", device=0, id="v")
    first = g.attention(q, k, v, heads=heads, kv_heads=heads, final=False, device=0, id="full")
    g.output(g.attention(q, k, v, first, heads=heads, kv_heads=heads, causal=True, device=0, id="diagonal"))
    memgraph = compile_taskgraph(g, 1 << 30)
    out = {"torch_sdpa_full": best_full, "torch_sdpa_causal": best_causal}
    strided = torch.randn(block, heads * width, device="cuda", dtype=torch.float16).view(block, heads, width).transpose(0, 1).unsqueeze(0)
    cudnn = lambda x, causal: torch.ops.aten._scaled_dot_product_cudnn_attention(x, x, x, None, True, 0.0, causal, False)  # noqa: E731
    op_alone = {"full": full / cuda_time(lambda: cudnn(strided, False), repeats=10), "causal": full / 2 / cuda_time(lambda: cudnn(strided, True), repeats=10)}
    out["cudnn_op_alone_strided"] = op_alone
    del strided
    print("\n### Attention providers on a 7B block (32 heads, 4096 x 4096, d128, fp16), merge included\n")
    row("provider", "full block TFLOP/s", "causal block TFLOP/s", "full / torch best SDPA")
    row("---", "---", "---", "---")
    row("torch SDPA (public, no lse)", f"{best_full / 1e12:.0f}", f"{best_causal / 1e12:.0f}", "1.00")
    row("cudnn op alone, lse, heads strided (no merge)", f"{op_alone['full'] / 1e12:.0f}", f"{op_alone['causal'] / 1e12:.0f}", f"{op_alone['full'] / best_full:.2f}")
    for provider in ("torch-cudnn", "torch-flash", "torch-efficient", "triton", "cublas"):
        try:
            run = loops(memgraph, CudaBackend(attention_provider=provider), repeats=5)["nondet"]
        except Exception as err:  # a provider this torch lacks
            row(provider, f"failed: {type(err).__name__}: {str(err)[:80]}", "", "")
            continue
        times = {memgraph.nodes[c.vertex].task: c.end - c.start for c in run["recorder"].completions}
        rate_full, rate_causal = full / times["full"], full / 2 / times["diagonal"]
        out[provider] = {"full": rate_full, "causal": rate_causal}
        row(provider + " (a lone block: includes the host's launch latency)", f"{rate_full / 1e12:.0f}", f"{rate_causal / 1e12:.0f}", f"{rate_full / best_full:.2f}")
    queued = queued_blocks(8)
    for provider in ("torch-cudnn", "torch-flash", "triton"):
        try:
            run = loops(queued, CudaBackend(attention_provider=provider), repeats=3, streams=1)["nondet"]
        except Exception as err:  # a provider this machine lacks
            row(provider + " queued", f"failed: {type(err).__name__}: {str(err)[:80]}", "", "")
            continue
        spans = {"full": [], "diagonal": []}
        for c in run["recorder"].completions:
            task = queued.nodes[c.vertex].task
            spans["full" if task.startswith("full") else "diagonal"].append(c.end - c.start)
        rate_full = full / statistics.median(spans["full"])
        rate_causal = full / 2 / statistics.median(spans["diagonal"])
        out[f"{provider} queued"] = {"full": rate_full, "causal": rate_causal, "makespan": run["makespan"]}
        row(provider + " (8 blocks of each kind queued on one stream, as the runtime runs them)", f"{rate_full / 1e12:.0f}", f"{rate_causal / 1e12:.0f}", f"{rate_full / best_full:.2f}")
    return out


def queued_blocks(count: int, heads: int = 32, block: int = 4096, width: int = 128) -> MemGraph:
    """`count` full attention blocks, each followed by a causal final block folding it in: what a prefill
    queues, so the host prepares one block while the GPU runs the previous."""
    g = TaskGraph(devices=1)
    q = g.input((block, heads * width), "float16", device=0, id="q")
    k = g.input((block, heads * width), "float16", device=0, id="k")
    v = g.input((block, heads * width), "float16", device=0, id="v")
    outs = []
    for i in range(count):
        first = g.attention(q, k, v, heads=heads, kv_heads=heads, final=False, device=0, id=f"full{i}")
        outs.append(g.attention(q, k, v, first, heads=heads, kv_heads=heads, causal=True, device=0, id=f"diagonal{i}"))
    g.output(*outs)
    return compile_taskgraph(g, 4 << 30)


# ----- the host link while the GPU computes ----------------------------------------------------------
def contention(quick: bool) -> dict:
    """H2D copies of 1 GiB from pinned memory alone, and while fp16 GEMMs (the FFN's shapes: 2048 x 32768
    x 8192) run back to back on another stream: does the host link keep its rate when the SMs are busy?"""
    import torch

    n = GIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    a = torch.randn(2048, 8192, device="cuda", dtype=torch.float16)
    w = torch.randn(8192, 32768, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    alone = n / cuda_time(lambda: dev.copy_(host, non_blocking=True), repeats=5)
    gemm_alone = cuda_time(lambda: torch.matmul(a, w), repeats=10)
    count = int(4 * (n / alone) / gemm_alone) + 1  # enough GEMMs to outlast the copy even if it ran at a quarter of its rate

    rates = []
    for attempt in range(6):  # the first is a warm-up
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(count):
                torch.matmul(a, w)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)  # on the current stream, while the side stream computes
        end.record()
        torch.cuda.synchronize()
        if attempt:
            rates.append(n / (start.elapsed_time(end) * 1e-3))
    under = statistics.median(rates)
    print("\n### The host link while the GPU computes (1 GiB H2D from pinned memory)\n")
    row("H2D alone GB/s", "H2D while fp16 GEMMs run GB/s", "ratio", "GEMM 2048x32768x8192 alone TFLOP/s")
    row("---", "---", "---", "---")
    row(f"{alone / 1e9:.1f}", f"{under / 1e9:.1f}", f"{under / alone:.3f}", f"{2 * 2048 * 32768 * 8192 / gemm_alone / 1e12:.0f}")
    del host, dev, a, w
    torch.cuda.empty_cache()
    return {"h2d_alone": alone, "h2d_under_gemm": under, "gemm_seconds": gemm_alone}


# ----- the triton provider's tile shapes ---------------------------------------------------------------
TRITON_CONFIGS = ("64,64,4,3", "128,64,8,3", "128,128,8,3", "128,64,8,4", "128,128,8,2", "128,64,4,3", "64,64,4,4", "128,32,4,3")


def triton_sweep(quick: bool, heads: int = 32, block: int = 4096, d: int = 128, device: str = "cuda", timer=None) -> dict:
    """The triton provider's kernel called directly on a 7B block (32 heads, 4096 x 4096, d128, fp16) under
    each tile shape: a full block writing the packed partial, a full block folding into one, and a causal
    block folding into one and writing the final output; each checked against torch's SDPA. The shape with
    the least time over the three becomes $TURNIP_TRITON_ATTENTION for the sections after this one."""
    import torch
    import torch.nn.functional as F

    from runtime.backends.cuda import attention_triton as A

    timer = timer or cuda_time
    width = heads * d
    scale = 1.0 / math.sqrt(d)
    full = 4 * block * block * heads * d
    q, k, v = (torch.randn(block, width, device=device, dtype=torch.float16) for _ in range(3))
    prev = torch.randn(block, width + heads, device=device, dtype=torch.float32)
    partial = torch.empty(block, width + heads, device=device, dtype=torch.float32)
    final = torch.empty(block, width, device=device, dtype=torch.float16)
    as_heads = lambda x: x.view(block, heads, d).transpose(0, 1).unsqueeze(0)  # noqa: E731
    want_full = F.scaled_dot_product_attention(as_heads(q).float(), as_heads(k).float(), as_heads(v).float())[0].transpose(0, 1).reshape(block, width).float()
    want_causal = F.scaled_dot_product_attention(as_heads(q).float(), as_heads(k).float(), as_heads(v).float(), is_causal=True)[0].transpose(0, 1).reshape(block, width).float()
    configs = TRITON_CONFIGS[:3] if quick else TRITON_CONFIGS
    print("\n### The triton provider's tile shapes on a 7B block (TFLOP/s; max error against torch SDPA)\n")
    row("BLOCK_M,BLOCK_N,warps,stages", "full", "full + fold", "causal + fold, final", "max error")
    row("---", "---", "---", "---", "---")
    out, best = {}, None
    for text in configs:
        config = A.Config.parse(text)
        try:
            A.launch(q, k, v, None, partial, heads, heads, False, False, scale, config)
            error_full = (partial[:, :width] - want_full).abs().max().item()
            # a causal block folding into a partial whose log-sum-exp is -inf everywhere is the causal block alone
            prev_empty = torch.zeros_like(prev)
            prev_empty[:, width:] = float("-inf")
            A.launch(q, k, v, prev_empty, final, heads, heads, True, True, scale, config)
            error_causal = (final.float() - want_causal).abs().max().item()
            t_full = timer(lambda: A.launch(q, k, v, None, partial, heads, heads, False, False, scale, config), repeats=10)
            t_fold = timer(lambda: A.launch(q, k, v, prev, partial, heads, heads, False, False, scale, config), repeats=10)
            t_causal = timer(lambda: A.launch(q, k, v, prev, final, heads, heads, True, True, scale, config), repeats=10)
        except Exception as err:  # a shape that does not fit this GPU's shared memory
            row(text, f"failed: {type(err).__name__}: {str(err)[:80]}", "", "", "")
            out[text] = {"error": f"{type(err).__name__}: {err}"}
            continue
        error = max(error_full, error_causal)
        out[text] = {"full": full / t_full, "full_fold": full / t_fold, "causal_fold_final": full / 2 / t_causal, "max_error": error}
        row(text, f"{full / t_full / 1e12:.0f}", f"{full / t_fold / 1e12:.0f}", f"{full / 2 / t_causal / 1e12:.0f}", f"{error:.1e}")
        total = t_full + t_fold + t_causal
        if error < 5e-2 and (best is None or total < best[1]):
            best = (text, total)
    if best:
        os.environ[A.ENVIRONMENT] = best[0]
        out["chosen"] = best[0]
        print(f"\nchosen for the sections after this one: {A.ENVIRONMENT}={best[0]}")
    return out


# ----- the attention merge, alone ---------------------------------------------------------------------
def merge(quick: bool) -> dict:
    """The attention merge alone on a 7B block (32 heads, 4096 queries, d 128), with o laid out as cuDNN
    returns it and as contiguous heads; and the fused op's layouts."""
    import torch
    from numba import cuda

    from runtime.backends.cuda import kernels_numba as kn

    heads, tq, d = 32, 4096, 128
    width = heads * d
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    x = torch.randn(tq, width, device="cuda", dtype=torch.float16)
    q4 = x.view(tq, heads, d).transpose(0, 1).unsqueeze(0)
    o_fused, lse_fused = torch.ops.aten._scaled_dot_product_cudnn_attention(q4, q4, q4, None, True, 0.0, False, False)[:2]
    layouts = {"cudnn o": (tuple(o_fused.shape), tuple(o_fused.stride())), "cudnn lse": (tuple(lse_fused.shape), tuple(lse_fused.stride()))}
    print(f"\n### Attention merge alone (32 heads x 4096 rows x d128); the fused op returns {layouts}\n")
    o_layouts = {"o as cuDNN returns it": o_fused[0], "o heads contiguous": torch.randn(heads, tq, d, device="cuda", dtype=torch.float16)}
    lse = torch.randn(heads, tq, device="cuda", dtype=torch.float32)
    prev = torch.randn(tq, width + heads, device="cuda", dtype=torch.float32)
    partial = torch.empty(tq, width + heads, device="cuda", dtype=torch.float32)
    final_out = torch.empty(tq, width, device="cuda", dtype=torch.float16)
    out = {"layouts": {k: str(v) for k, v in layouts.items()}}
    row("case", "o layout", "kernel", "us", "GB/s", "max error")
    row("---", "---", "---", "---", "---", "---")
    grid, block = kn.merge_grid(tq, heads, d)
    for case, has_prev, final in (("first block (no prev, partial out)", False, False), ("last block (prev, final out)", True, True)):
        target = final_out if final else partial
        for vector in (False, True):
            kernel = kn.attention_merge(str(target.dtype).split(".")[-1], has_prev, final, vector)
            name = "quads, vector loads" if vector else "quads, element loads"
            for label, o in o_layouts.items():
                traffic = o.numel() * 2 + target.numel() * target.element_size() + (prev.numel() * 4 if has_prev else 0)
                args = [cuda.as_cuda_array(a) for a in (o, lse, prev if has_prev else lse, target)] + [0, heads]
                if vector and not kn.merge_vector_ok(d, *((a.data_ptr(), tuple(s * a.element_size() for s in a.stride()), a.element_size()) for a in (o, target, prev))):
                    row(case, label, name, "not aligned", "")
                    continue
                kernel[grid, block, stream](*args)
                expect = o.float().transpose(0, 1).reshape(tq, width)
                if has_prev:
                    lp, lb = prev[:, width:], lse.transpose(0, 1)
                    top = torch.maximum(lp, lb)
                    wp, wb = torch.exp(lp - top), torch.exp(lb - top)
                    wp, wb = (wp / (wp + wb)).repeat_interleave(d, 1), (wb / (wp + wb)).repeat_interleave(d, 1)
                    expect = prev[:, :width] * wp + expect * wb
                error = (target[:, :width].float() - expect).abs().max().item()
                go = lambda: [kernel[grid, block, stream](*args) for _ in range(10)]  # noqa: E731
                seconds = cuda_time(go, repeats=5) / 10
                out[f"{case} / {label} / {name}"] = {"seconds": seconds, "rate": traffic / seconds, "max_error": error}
                row(case, label, name, f"{seconds * 1e6:.0f}", f"{traffic / seconds / 1e9:.0f}", f"{error:.1e}")
    return out


# ----- copy engines -------------------------------------------------------------------------------------
def copy_graph(count: int, size: int, duplex: bool) -> MemGraph:
    """`count` reloads of `size`-byte tensors from CPU storage; with `duplex`, as many offloads at once."""
    elements = size // 2
    graph = MemGraph(1, (2 * count + 1) * size)
    nodes = []
    for i in range(count):
        nodes.append(MemNode(len(nodes), "input", f"s{i}", None, None, (i * size, size), (), shape=(elements,), dtype="float16"))
    for i in range(count):
        nodes.append(MemNode(len(nodes), "reload", f"s{i}", 0, (i * size, size), None, (i,), shape=(elements,), dtype="float16"))
    if duplex:
        for i in range(count):
            gpu = MemNode(len(nodes), "input", f"g{i}", 0, ((count + i) * size, size), None, (), shape=(elements,), dtype="float16")
            nodes.append(gpu)
            nodes.append(MemNode(len(nodes), "offload", f"g{i}", 0, None, ((count + i) * size, size), (gpu.id,), shape=(elements,), dtype="float16"))
    for node in nodes:
        graph.add(node)
    graph.outputs = {f"s{count - 1}": 2 * count - 1}
    return graph


def copies(quick: bool, ceiling: dict) -> dict:
    size, count = 256 << 20, 8 if quick else 24
    out = {}
    print("\n### Copy engines (256 MiB tensors)\n")
    row("chain", "GB/s achieved (bytes / loop makespan)", "ceiling in this run GB/s", "fraction")
    row("---", "---", "---", "---")
    for label, duplex, ceil in (("reloads only", False, ceiling["h2d"]), ("reloads and offloads at once", True, ceiling["duplex"])):
        graph = copy_graph(count, size, duplex)
        run = loops(graph, CudaBackend(), repeats=3)["nondet"]
        moved = count * size * (2 if duplex else 1)
        rate = moved / run["makespan"]
        out[label] = {"rate": rate, "fraction": rate / ceil}
        row(label, f"{rate / 1e9:.1f}", f"{ceil / 1e9:.1f}", f"{rate / ceil:.2f}")
    return out


# ----- the FFN, transfer-bound -----------------------------------------------------------------------
def ffn_graph(layers, tokens, hidden, ffn):
    """The `ffn` workload: x -> gelu(x W1^T) W2^T per layer, weights in HF layout [out, in], one token block."""
    from frontend.workloads import ffn as workload

    config = workload.FfnConfig(layers=layers, tokens=tokens, hidden=hidden, ffn=ffn, block=tokens, dtype="float16")
    return workload.build(config).taskgraph()


def ffn(quick: bool, ceiling: dict) -> dict:
    import torch

    layers, tokens, hidden, width = (4, 2048, 8192, 32768) if quick else (16, 2048, 8192, 32768)
    budget = 8 * GIB
    graph = ffn_graph(layers, tokens, hidden, width)
    weights = _weights(graph)
    weight_bytes = sum(node.nbytes for task, node in graph.nodes.items() if task.startswith("w") and node.op == "input")
    memgraph = compile_taskgraph(graph, arena_budget(graph, budget, "cuda"), inputs="host")
    runs = loops(memgraph, CudaBackend(sample_memory=0.001), orders=("nondet", "fixed"), repeats=3, inputs=weights)
    sim = {order: execute(memgraph, backend="sim", order=order).summary.makespan for order in ("nondet", "fixed")}
    floor = weight_bytes / ceiling["h2d"]
    base = ffn_torch(layers, tokens, hidden, width, weights)
    turnip_out = runs["outputs"][graph.outputs[-1]].astype(np.float32)
    agree = float(np.max(np.abs(turnip_out - base["output"])) / (np.max(np.abs(base["output"])) + 1e-6))
    out = {"floor": floor, "weight_bytes": weight_bytes, "sim": sim, "agreement": agree,
           "sync": base["sync"], "prefetch": base["prefetch"], "prefetch_peak": base["peak"]}
    print(f"\n### FFN {layers}x{hidden}x{width} fp16, {tokens} tokens, weights in pinned host memory, budget 8 GiB\n")
    row("system", "seconds", "x floor", "sim prediction s")
    row("---", "---", "---", "---")
    for order in ("nondet", "fixed"):
        seconds = runs[order]["makespan"]
        out[f"turnip-{order}"] = {"seconds": seconds, "wall": runs[order]["wall"], "lines": runs[order]["summary"].lines()}
        row(f"turnip-{order}", f"{seconds:.3f}", f"{seconds / floor:.3f}", f"{sim[order]:.3f}")
    row("synchronous layer-by-layer copy", f"{base['sync']:.3f}", f"{base['sync'] / floor:.3f}", "")
    row("hand double-buffered prefetch", f"{base['prefetch']:.3f}", f"{base['prefetch'] / floor:.3f}", "")
    row("PCIe floor (weights / H2D)", f"{floor:.3f}", "1.000", "")
    print(f"\nturnip vs torch output, max relative difference: {agree:.2e}; turnip nondet summary:")
    print("\n".join(runs["nondet"]["summary"].lines() + runs["notes"]))
    out["stats"] = runs["stats"]
    del base
    torch.cuda.empty_cache()
    return out


def ffn_torch(layers, tokens, hidden, width, weights) -> dict:
    """The same FFN stack in torch: weights pinned on the host, moved layer by layer (synchronously, or
    prefetched one layer ahead into a second buffer on a side stream)."""
    import torch

    host = {k: _pinned(v) for k, v in weights.items() if k.startswith("w")}
    x0 = torch.from_numpy(_materialize(weights["x"])).cuda()
    buffers = [[torch.empty(width, hidden, dtype=torch.float16, device="cuda"), torch.empty(hidden, width, dtype=torch.float16, device="cuda")] for _ in range(2)]

    def layer(x, w1, w2):  # the ffn workload: weights in HF layout [out, in]
        return torch.nn.functional.gelu(x @ w1.T, approximate="tanh") @ w2.T

    def sync():
        x = x0
        for i in range(layers):
            buffers[0][0].copy_(host[f"w1.{i}"], non_blocking=True)
            buffers[0][1].copy_(host[f"w2.{i}"], non_blocking=True)
            x = layer(x, *buffers[0])
        return x

    side = torch.cuda.Stream()
    ready = [torch.cuda.Event() for _ in range(2)]
    free = [torch.cuda.Event() for _ in range(2)]

    def prefetch():
        x = x0
        main = torch.cuda.current_stream()

        def load(i):
            with torch.cuda.stream(side):
                side.wait_event(free[i % 2])
                buffers[i % 2][0].copy_(host[f"w1.{i}"], non_blocking=True)
                buffers[i % 2][1].copy_(host[f"w2.{i}"], non_blocking=True)
                ready[i % 2].record(side)

        for event in free:
            event.record(main)
        load(0)
        for i in range(layers):
            if i + 1 < layers:
                load(i + 1)
            main.wait_event(ready[i % 2])
            x = layer(x, *buffers[i % 2])
            free[i % 2].record(main)
        return x

    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t_prefetch = cuda_time(prefetch, repeats=3)
    peak = torch.cuda.max_memory_allocated() - before
    t_sync = cuda_time(sync, repeats=3)
    output = prefetch().float().cpu().numpy()
    return {"sync": t_sync, "prefetch": t_prefetch, "peak": peak, "output": output}


def _materialize(value):
    return value.materialize() if isinstance(value, Tiled) else value


def _pinned(value):
    import torch

    tensor = torch.empty(value.shape, dtype=torch.float16, pin_memory=True)
    value.write_into(tensor.numpy()) if isinstance(value, Tiled) else tensor.numpy().__setitem__(..., value)
    return tensor


def sim(quick: bool) -> dict:
    """The sim backend's prediction beside the measured run, on the graphs of bench_runtime.py that fit one GPU."""
    from frontend.workloads import matmul

    blocked = matmul.build(matmul.MatmulConfig(m=16384, k=16384, n=16384, block=4096, gpus=1)).taskgraph()
    cases = [("ffn 16x8192x32768 fp16", ffn_graph(16, 2048, 8192, 32768), b) for b in ((8, 4) if quick else (24, 8, 4, 2))]
    cases += [("blocked matmul 16384 fp32, 4x4 tiles", blocked, b) for b in (2, 1)]
    out = []
    print("\n### The sim model against the GPU (same memgraph; 2 compute streams)\n")
    row("graph", "budget GiB", "order", "measured ms", "sim ms", "sim / measured")
    row("---", "---", "---", "---", "---", "---")
    for label, graph, gib in cases:
        memgraph = compile_taskgraph(graph, arena_budget(graph, gib * GIB, "cuda"))
        inputs = _weights(graph)
        runs = loops(memgraph, CudaBackend(), orders=("nondet", "fixed"), repeats=2, inputs=inputs)
        for order in ("nondet", "fixed"):
            predicted = execute(memgraph, backend="sim", order=order).summary.makespan
            measured = runs[order]["makespan"]
            out.append({"graph": label, "budget": gib, "order": order, "measured": measured, "sim": predicted})
            row(label, gib, order, f"{measured * 1e3:.1f}", f"{predicted * 1e3:.1f}", f"{predicted / measured:.2f}")
    return {"rows": out}


PEER_N: int | None = None
"""The blocked matmul's edge for the `peer` section (--peer-n); None: 16384 with --quick, else 49152."""


def random_matrix(n: int, seed: int, threads: int | None = None) -> np.ndarray:
    """An n x n float32 standard-normal matrix, its row bands drawn in parallel (numpy's generators release
    the GIL while they fill), so 2 x 9 GiB of inputs take seconds, not minutes."""
    from concurrent.futures import ThreadPoolExecutor

    threads = threads or os.cpu_count() or 1
    out = np.empty((n, n), dtype=np.float32)
    bands = np.array_split(np.arange(n), threads)
    seeds = np.random.SeedSequence(seed).spawn(threads)

    def fill(i: int) -> None:
        if len(bands[i]):
            np.random.default_rng(seeds[i]).standard_normal(out=out[bands[i][0] : bands[i][-1] + 1], dtype=np.float32)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, range(threads)))
    return out


def rows_error(a: np.ndarray, b: np.ndarray, c: np.ndarray, rows: np.ndarray, columns: int = 4096) -> float:
    """max |c[rows] - (a @ b)[rows]| / max |(a @ b)[rows]|, the reference in float64, b taken a band of
    columns at a time (a float64 copy of a 9 GiB b would be 18 GiB)."""
    left = a[rows].astype(np.float64)
    worst, scale = 0.0, 0.0
    for start in range(0, b.shape[1], columns):
        want = left @ b[:, start : start + columns].astype(np.float64)
        worst = max(worst, float(np.max(np.abs(c[rows, start : start + columns] - want))))
        scale = max(scale, float(np.max(np.abs(want))))
    return worst / scale


def peer(quick: bool) -> dict:
    """The seed's blocked matmul over 2 GPUs (partial products moved by peer copies), against numpy on
    sampled rows, with the achieved peer bandwidth beside the link's ceiling measured here."""
    import torch

    if torch.cuda.device_count() < 2:
        print("\n(peer: needs 2 GPUs)")
        return {"skipped": "one GPU"}
    src = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(GIB, dtype=torch.uint8, device="cuda:1")
    one_way = GIB / cuda_time(lambda: dst.copy_(src, non_blocking=True))
    back_src, back_dst = torch.empty(GIB, dtype=torch.uint8, device="cuda:1"), torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
    side = torch.cuda.Stream(device="cuda:1")

    def both():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            back_dst.copy_(back_src, non_blocking=True)
        dst.copy_(src, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    two_way = 2 * GIB / cuda_time(both)
    del src, dst, back_src, back_dst
    torch.cuda.empty_cache()
    out = {"peer_ceiling": one_way, "peer_both_ways": two_way}
    print(f"\npeer copy ceiling in this run: {one_way / 1e9:.0f} GB/s one way, {two_way / 1e9:.0f} GB/s both ways")
    out.update(peer_matmul(PEER_N or (16384 if quick else 49152), one_way))
    return out


def peer_matmul(n: int, ceiling: float, budgets_gib=(16, 6), repeats: int = 2, backend: str = "cuda") -> dict:
    """The blocked matmul n^3 fp32 over 2 GPUs on the cuda backend, each budget in both orders; the
    error on 64 sampled rows against float64, the peer rate against `ceiling` (bytes per second).
    `backend="cpu"` runs the same steps on the cpu backend (the tests: the CUDA simulator has one GPU)."""
    from frontend.workloads import matmul

    config = matmul.MatmulConfig(m=n, k=n, n=n, block=n // 4, gpus=2, dtype="float32")
    program = matmul.build(config)
    graph = program.taskgraph()
    began = time.perf_counter()
    a, b = random_matrix(n, 0), random_matrix(n, 1)
    inputs = program.feed({"A": a, "B": b})
    drawn = time.perf_counter() - began
    rng = np.random.default_rng(0)
    out = {"n": n, "inputs_s": drawn}
    print(f"\n### Blocked matmul {n}^3 fp32 over 2 GPUs (4x4 tiles, the seed's placement; inputs drawn in {drawn:.1f} s)\n")
    row("budget GiB", "order", "seconds", "sim s", "TFLOP/s", "moved GiB", "peer GB/s while copying", "fraction of ceiling",
        "offloaded / reloaded GiB", "busy per GPU", "max rel. error (64 rows)")
    row(*["---"] * 11)
    for gib in budgets_gib:
        memgraph = compile_taskgraph(graph, arena_budget(graph, int(gib * GIB), backend))
        runs = loops(memgraph, make_backend(backend), orders=("nondet", "fixed"), repeats=repeats, inputs=inputs)
        c = program.gather(program.outputs["C"], runs.pop("outputs"))
        error = rows_error(a, b, c, rng.choice(n, min(64, n), replace=False))
        del c
        for order in ("nondet", "fixed"):
            summary = runs[order]["summary"]
            seconds = runs[order]["makespan"] or 1e-9
            predicted = sim_makespan(memgraph, order=order)
            out[f"{gib}-{order}"] = {"seconds": seconds, "moved": summary.bytes_moved, "peer_rate": summary.peer_bandwidth,
                                      "offloaded": summary.bytes_offloaded, "reloaded": summary.bytes_reloaded,
                                      "busy": summary.busy, "error": error, "sim": predicted}
            row(gib, order, f"{seconds:.3f}", f"{predicted:.3f}", f"{2 * n**3 / seconds / 1e12:.0f}", f"{summary.bytes_moved / GIB:.1f}",
                f"{summary.peer_bandwidth / 1e9:.0f}", f"{summary.peer_bandwidth / ceiling:.2f}",
                f"{summary.bytes_offloaded / GIB:.1f} / {summary.bytes_reloaded / GIB:.1f}", ", ".join(f"{b:.0%}" for b in summary.busy), f"{error:.1e}")
    return out


SECTIONS = ("ceilings", "notifiers", "lookahead", "dispatch", "kernels", "merge", "triton", "attention", "contention", "copies", "ffn", "sim", "peer")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", default=list(SECTIONS))
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a first smoke run")
    parser.add_argument("--peer-n", type=int, help="the peer section's matmul edge (default 49152, 16384 with --quick)")
    args = parser.parse_args(argv)
    global PEER_N
    PEER_N = args.peer_n
    import torch

    RESULTS["machine"] = torch.cuda.get_device_name(0)
    RESULTS["date"] = time.strftime("%Y-%m-%d")
    ceiling = None
    for section in (["ceilings"] if "ceilings" not in args.sections else []) + list(args.sections):
        began = time.perf_counter()
        try:
            if section == "ceilings":
                ceiling = ceilings(args.quick)
                RESULTS["ceilings"] = ceiling
            elif section == "kernels":
                RESULTS[section] = kernels(args.quick, ceiling["hbm"])
            elif section in ("copies", "ffn"):
                RESULTS[section] = globals()[section](args.quick, ceiling)
            elif section == "attention":
                RESULTS[section] = attention_bench(args.quick)
            elif section == "triton":
                RESULTS[section] = triton_sweep(args.quick)
            else:
                RESULTS[section] = globals()[section](args.quick)
        except Exception:
            RESULTS[section] = {"error": traceback.format_exc()}
            print(f"\n{section} FAILED:\n{traceback.format_exc()}", flush=True)
        print(f"({section}: {time.perf_counter() - began:.1f} s)", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

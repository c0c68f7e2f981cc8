"""The cuda backend's kernels on a GPU: memory-bound kernels against the HBM copy rate, the attention
providers against torch's best SDPA, the attention merge alone, and the triton provider's tile sweep.

Sections of bench/bench_cuda.py: kernels, attention, merge, triton.
"""

from __future__ import annotations

import math
import os
import statistics

from cuda_common import cuda_time, loops, row  # first: puts the repository on sys.path

from passes.pipeline import compile_taskgraph
from runtime.backends.cuda import CudaBackend
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph


def kernels(quick: bool, hbm: float) -> dict:
    """Each memory-bound kernel on [8192, 16384] tensors, in float16 and in bfloat16 (issue 25: bf16 at the
    same share of HBM bandwidth as fp16): entries `add`, ... (fp16) and `add bf16`, ... (with `vs fp16`,
    the bf16 rate over the fp16 one)."""
    rows, cols = 8192, 16384  # 256 MiB of fp16
    traffic = {"add": 3, "gelu": 2, "rmsnorm": 2, "softmax": 2, "rope": 2, "swiglu": 3}
    out = {}
    for dtype, suffix in (("float16", ""), ("bfloat16", " bf16")):
        g = TaskGraph(devices=1)
        x = g.input((rows, cols), dtype, device=0, id="x")
        y = g.input((rows, cols), dtype, device=0, id="y")
        w = g.input((cols,), dtype, device=0, id="w")
        c = g.input((rows, 128), dtype, device=0, id="cos")
        s = g.input((rows, 128), dtype, device=0, id="sin")
        made = {"add": g.add(x, y, device=0, id="add"), "gelu": g.gelu(x, device=0, id="gelu"), "rmsnorm": g.rmsnorm(x, w, device=0, id="rmsnorm"),
                "softmax": g.softmax(x, device=0, id="softmax"), "rope": g.rope(x, c, s, device=0, id="rope"), "swiglu": g.swiglu(x, y, device=0, id="swiglu")}
        g.output(*made.values())
        memgraph = compile_taskgraph(g, 12 * rows * cols * 2)
        run = loops(memgraph, CudaBackend(), repeats=3, streams=1)["nondet"]  # one stream: kernels one at a time
        by_task = {}
        for done in run["recorder"].completions:
            node = memgraph.nodes[done.vertex]
            by_task[node.task] = done.end - done.start
        print(f"\n### Memory-bound kernels, {dtype} [{rows}, {cols}] (HBM copy rate in the same run: {hbm / 1e9:.0f} GB/s)\n")
        row("kernel", "us", "GB/s (read+write)", "fraction of HBM copy rate", "vs fp16")
        row("---", "---", "---", "---", "---")
        for name, factor in traffic.items():
            seconds = by_task[name]
            rate = factor * rows * cols * 2 / seconds
            entry = out[name + suffix] = {"seconds": seconds, "rate": rate, "fraction": rate / hbm}
            if suffix:
                entry["vs fp16"] = rate / out[name]["rate"]
            row(name, f"{seconds * 1e6:.0f}", f"{rate / 1e9:.0f}", f"{rate / hbm:.2f}", f"{entry.get('vs fp16', 1.0):.2f}")
    return out


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

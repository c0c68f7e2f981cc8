"""The host side of the cuda backend on a GPU: the machine's ceilings, the copy engines, the host link
under compute, and the cost of the host loop (completion notifiers, queueing ahead, dispatch).

Sections of bench/bench_cuda.py: ceilings, copies, contention, notifiers, lookahead, dispatch.
"""

from __future__ import annotations

import statistics

from cuda_common import GIB, cuda_time, loops, row  # first: puts the repository on sys.path

from passes.pipeline import compile_taskgraph
from runtime.backends.cuda import CudaBackend
import notifiers  # noqa: F401  (registers the alternative notifiers this study compares)
from runtime.backends.cuda.completion import DEFAULT_NOTIFIER, NOTIFIERS
from runtime.summary import union_length
from tools.synthetic import chain_memgraph, random_memgraph
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.taskgraph import TaskGraph


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

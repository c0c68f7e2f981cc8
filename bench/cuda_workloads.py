"""Whole workloads on the cuda backend: the transfer-bound FFN against torch and the PCIe floor, the sim's
prediction beside measured runs, and the seed's blocked matmul over two GPUs (peer copies).

Sections of bench/bench_cuda.py: ffn, sim, peer. `peer_matmul` also runs on the cpu backend, for the tests.
"""

from __future__ import annotations

import os
import time

import numpy as np
from cuda_common import GIB, cuda_time, graph_inputs, loops, materialize, pinned, row  # first: puts the repository on sys.path

from passes.pipeline import compile_taskgraph
from runtime import arena_budget, execute, sim_makespan
from runtime.backends import make_backend
from runtime.backends.cuda import CudaBackend


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
    weights = graph_inputs(graph)
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

    host = {k: pinned(v) for k, v in weights.items() if k.startswith("w")}
    x0 = torch.from_numpy(materialize(weights["x"])).cuda()
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
        inputs = graph_inputs(graph)
        runs = loops(memgraph, CudaBackend(), orders=("nondet", "fixed"), repeats=2, inputs=inputs)
        for order in ("nondet", "fixed"):
            predicted = execute(memgraph, backend="sim", order=order).summary.makespan
            measured = runs[order]["makespan"]
            out.append({"graph": label, "budget": gib, "order": order, "measured": measured, "sim": predicted})
            row(label, gib, order, f"{measured * 1e3:.1f}", f"{predicted * 1e3:.1f}", f"{predicted / measured:.2f}")
    return {"rows": out}


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


def peer(quick: bool, n: int | None = None) -> dict:
    """The seed's blocked matmul n^3 over 2 GPUs (partial products moved by peer copies), against numpy on
    sampled rows, with the achieved peer bandwidth beside the link's ceiling measured here; n defaults
    to 49152, 16384 with `quick`."""
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
    out.update(peer_matmul(n or (16384 if quick else 49152), one_way))
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

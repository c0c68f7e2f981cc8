"""Runtime benchmarks: executor overhead per vertex, and sim predictions of nondet against fixed.

    .venv/bin/python bench/bench_runtime.py overhead   # cpu backend, empty kernels, ~10k vertices
    .venv/bin/python bench/bench_runtime.py sim        # FFN stack and blocked matmul across budgets

Prints markdown tables (the ones in docs/benchmarks.md, "Executor overhead per vertex" and "sim: nondet against fixed").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from runtime import execute  # noqa: E402
from runtime.backends.cpu import CpuBackend  # noqa: E402
from runtime.backends.sim import SimBackend  # noqa: E402
from tools.random_graphs import random_taskgraph  # noqa: E402
from frontend.workloads import ffn as ffn_workload  # noqa: E402
from frontend.workloads import matmul as matmul_workload  # noqa: E402

GIB = 1 << 30


def overhead(repeats: int = 3) -> None:
    """Dispatch rate of the event loop with kernels that do nothing (CpuBackend(noop=True)).

    "loop" times the event loop alone (RunSummary.wall_time); "with set-up" adds building the ExecGraph,
    the arenas and views, the threads, and the summary.
    """
    from runtime_plans import naive_memgraph

    memgraph = naive_memgraph(random_taskgraph(0, tasks=8000, devices=2, sizes=(8,), window=16))
    print(f"memgraph: {len(memgraph)} vertices, 2 GPUs\n")
    print("| backend | order | streams | loop vertices/s | us/vertex | with set-up vertices/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, order, streams in [("cpu noop", "nondet", 2), ("cpu noop", "fixed", 2), ("cpu noop", "random", 2),
                                 ("cpu noop", "nondet", 1), ("sim", "nondet", 2)]:
        loop, total = [], []
        for _ in range(repeats):
            backend = CpuBackend(noop=True) if name == "cpu noop" else SimBackend()
            began = time.perf_counter()
            result = execute(memgraph, backend=backend, order=order, streams=streams, verify=False)  # set-up, not the proof
            total.append(len(memgraph) / (time.perf_counter() - began))
            loop.append(len(memgraph) / result.summary.wall_time)
        rate = statistics.median(loop)
        print(f"| {name} | {order} | {streams} | {rate:,.0f} | {1e6 / rate:.1f} | {statistics.median(total):,.0f} |")


def _sim_row(label: str, taskgraph, budget: int, seeds: int, jitter: float) -> None:
    from passes.pipeline import compile_taskgraph
    from turnip_ir.errors import BudgetError

    try:
        memgraph = compile_taskgraph(taskgraph, budget)
    except BudgetError:
        print(f"| {label} | {budget / GIB:.1f} | does not fit | | | | |")
        return
    spans = {}
    for order in ("fixed", "nondet"):
        steady = execute(memgraph, backend=SimBackend(), order=order).summary.makespan
        jittered = [execute(memgraph, backend=SimBackend(jitter=jitter, seed=s), order=order).summary.makespan for s in range(seeds)]
        spans[order] = (steady, statistics.mean(jittered))
    moved = memgraph.count("offload") + memgraph.count("reload")
    (f0, fj), (n0, nj) = spans["fixed"], spans["nondet"]
    print(f"| {label} | {budget / GIB:.1f} | {moved} | {f0 * 1e3:.1f} / {n0 * 1e3:.1f} | {f0 / n0:.3f} "
          f"| {fj * 1e3:.1f} / {nj * 1e3:.1f} | {fj / nj:.3f} |")


def _ffn(gpus: int):
    """16 layers of 8192 x 32768 in bf16, 2048 tokens in one block; over 2 GPUs as a 2-stage pipeline."""
    config = ffn_workload.FfnConfig(16, 2048, 8192, 32768, block=2048, gpus=gpus, dtype="bfloat16", placement="layers")
    return ffn_workload.build(config).taskgraph()


def sim(seeds: int = 5, jitter: float = 0.3) -> None:
    """Predicted makespans (H200 cost model) of fixed and nondet, without and with jitter on every duration."""
    print(f"jitter {jitter} (every duration x U(1-j, 1+j)), mean over {seeds} seeds\n")
    print("| graph | budget GiB | offloads+reloads | fixed / nondet ms | ratio | jittered fixed / nondet ms | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ffn1 = _ffn(gpus=1)
    for budget in (24, 8, 4, 2):
        _sim_row("ffn 16x8192x32768 bf16, 1 GPU", ffn1, budget * GIB, seeds, jitter)
    ffn2 = _ffn(gpus=2)
    for budget in (12, 4, 2):
        _sim_row("same, 2 GPUs", ffn2, budget * GIB, seeds, jitter)
    matmul = matmul_workload.build(matmul_workload.MatmulConfig(32768, 32768, 32768, block=8192, gpus=3)).taskgraph()
    for budget in (8, 2, 1):
        _sim_row("blocked matmul 32768 fp32, 4x4 tiles, 3 GPUs", matmul, budget * GIB, seeds, jitter)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["overhead", "sim", "all"], nargs="?", default="all")
    args = parser.parse_args()
    if args.which in ("overhead", "all"):
        overhead()
        print()
    if args.which in ("sim", "all"):
        sim()

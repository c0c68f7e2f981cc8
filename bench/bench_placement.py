"""Placement ablation: what choosing the loosest free region buys, in memory edges and predicted makespan.

Run: .venv/bin/python bench/bench_placement.py
For each graph and budget, compile with `placement=loosest` (the default: among free regions that fit,
take the one freed longest ago) and `placement=first-fit` (the lowest offset), then count the memory
edges the memgraph keeps and predict the makespan on the sim backend (H200 cost model, 2 streams per
GPU), with nominal durations and with every duration scaled by U(0.7, 1.3) (mean of seeds 0-2).
Prints a markdown table for docs/benchmarks.md ("Placement ablation").
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.compile_stats import CompileStats
from runtime import execute
from tools.random_graphs import random_taskgraph
from frontend.workloads import ffn as ffn_workload
from frontend.workloads import matmul as matmul_workload

GIB = 1 << 30
SEEDS = 3


def makespan_ms(memgraph, order: str, jitter: float) -> float:
    seeds = range(SEEDS) if jitter else range(1)
    spans = [execute(memgraph, backend="sim", order=order, seed=s, jitter=jitter).summary.makespan for s in seeds]
    return 1000 * sum(spans) / len(spans)


def row(label: str, graph, budget: int) -> list[str]:
    rows = []
    for placement in ("loosest", "first-fit"):
        stats = CompileStats()
        memgraph = compile_taskgraph(graph, budget, stats=stats, placement=placement)
        cells = [f"{makespan_ms(memgraph, order, jitter):.2f}" for order in ("nondet", "fixed") for jitter in (0.0, 0.3)]
        moved = stats.bytes_offloaded + stats.bytes_reloaded
        rows.append(f"| {label} | {placement} | {stats.memory_edges} | {moved / GIB:.2f} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    print("| graph, budget | placement | memory edges kept | offload+reload GiB | nondet ms | nondet ms, jitter 0.3 | fixed ms | fixed ms, jitter 0.3 |")
    print("|" + " --- |" * 8)
    ffn = ffn_workload.build(ffn_workload.FfnConfig(16, 2048, 8192, 32768, block=2048, dtype="bfloat16")).taskgraph()
    matmul = matmul_workload.build(matmul_workload.MatmulConfig(32768, 32768, 32768, block=8192, gpus=3)).taskgraph()
    rand = random_taskgraph(7, tasks=3000, devices=2, sizes=(1024, 2048, 4096), window=30)
    cases = [
        ("ffn 16x8192x32768 bf16, 8 GiB", ffn, 8 * GIB),
        ("ffn 16x8192x32768 bf16, 2 GiB", ffn, 2 * GIB),
        ("blocked matmul 32768 fp32 4x4, 3 GPUs, 2 GiB", matmul, 2 * GIB),
        ("random 3000 tasks, 2 GPUs, 2x minimum", rand, 2 * minimum_budget(rand)),
    ]
    for label, graph, budget in cases:
        for line in row(label, graph, budget):
            print(line, flush=True)


if __name__ == "__main__":
    main()

"""Plan hashes: one line per compile (a hash of its memgraph JSON, its memory and redundant edges and its
stats), so that a compiler change that must not change any plan can be checked by diffing the output
of the tree before and after it.

Run: PYTHONPATH=. .venv/bin/python bench/investigations/plan_hashes.py [--llama] [--big] > hashes.txt

Compiles 6 random taskgraphs (400 tasks; tiles and mixed shapes) under 3 schedules x 2 placements x
3 budgets (1, 2 and 4 times the minimum) x 4 input modes (gpu, host, recur, gpu with remat); with
`--llama` LLaMA-7B at 8k and 32k tokens at 2 GiB with gpu and host inputs; with `--big` the 100k-task
graph of bench/bench_compile.py and LLaMA-7B at 128k tokens (the compile-speed targets).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tools/ is not installed

from frontend.workloads.llama import build_llama, load_config
from passes.compile_stats import CompileStats
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from tools.random_graphs import random_taskgraph
from turnip_ir.errors import BudgetError

INPUT_MODES = (("gpu", False), ("host", False), ("recur", False), ("gpu", True))


def plan_hash(graph, budget: int, **options) -> str:
    """The hash of one compile, or the budget error's text."""
    stats = CompileStats()
    try:
        memgraph = compile_taskgraph(graph, budget, stats=stats, **options)
    except BudgetError as err:
        return f"budget error: {err}"
    digest = hashlib.sha256(memgraph.dumps().encode())
    digest.update(repr([(node.id, node.mem_deps, node.redundant_deps) for node in memgraph.nodes]).encode())
    counts = (stats.ops, stats.bytes_offloaded, stats.bytes_reloaded, stats.edges_added, stats.edges_redundant,
              stats.edges_removed_minimize, stats.edges_removed_reduce, stats.peak_memory, stats.recomputes)
    digest.update(repr(counts).encode())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama", action="store_true", help="also LLaMA-7B at 8k and 32k tokens")
    parser.add_argument("--big", action="store_true", help="also the 100k-task graph and LLaMA-7B at 128k tokens")
    args = parser.parse_args()
    for seed in range(6):
        graph = random_taskgraph(seed, tasks=400, devices=2, sizes=(16, 32, 48), window=30, mixed=seed % 2 == 1)
        low = minimum_budget(graph)
        for schedule in ("given", "dfs", "memory"):
            for placement in ("loosest", "first-fit"):
                for budget in (low, 2 * low, 4 * low):
                    for inputs, remat in INPUT_MODES:
                        options = {"schedule": schedule, "placement": placement, "inputs": inputs, "remat": remat}
                        print(seed, schedule, placement, budget, inputs, remat, plan_hash(graph, budget, **options), flush=True)
    if args.llama:
        for tokens in (8192, 32768):
            graph = build_llama(load_config("7b"), tokens).graph
            for inputs in ("gpu", "host"):
                print("7b", tokens, inputs, plan_hash(graph, 2 << 30, inputs=inputs), flush=True)
    if args.big:
        graph = random_taskgraph(1, tasks=100000, devices=4, sizes=(16, 32, 48), window=50)
        print("100k", plan_hash(graph, 2 * minimum_budget(graph)), flush=True)
        print("7b 131072 gpu", plan_hash(build_llama(load_config("7b"), 131072).graph, 2 << 30), flush=True)


if __name__ == "__main__":
    main()

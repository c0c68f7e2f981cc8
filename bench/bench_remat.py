"""Rematerialization in the sim: LLaMA prefill compiled with and without the planner's `remat`.

    PYTHONPATH=. .venv/bin/python bench/bench_remat.py --config 7b --points 32768:1GiB 8192:1GiB

For each point (tokens:budget) and schedule it compiles the prefill graph (the default block, weights
starting on the GPU while they fit, as `turnip llama` compiles it for the sim backend) twice, and prints
a markdown table: sim makespan, bytes reloaded and offloaded, recomputes and their cost-model seconds,
compile seconds. Sim timing is deterministic, so one run per cell is the figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frontend.workloads import llama  # noqa: E402
from passes.compile_stats import CompileStats  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import arena_budget, sim_makespan  # noqa: E402
from turnip_cli.planning import parse_size  # noqa: E402
from turnip_ir.units import format_size  # noqa: E402


def measure(graph, budget: int, schedule: str, remat: bool) -> dict:
    stats = CompileStats()
    start = time.perf_counter()
    memgraph = compile_taskgraph(graph, arena_budget(graph, budget, "sim"), schedule, stats=stats, remat=remat)
    compile_s = time.perf_counter() - start
    return {"makespan": sim_makespan(memgraph), "reloaded": stats.bytes_reloaded, "offloaded": stats.bytes_offloaded,
            "recomputes": stats.recomputes, "recompute_s": stats.recompute_seconds, "compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b")
    parser.add_argument("--points", nargs="+", default=["32768:1GiB", "8192:1GiB"], help="TOKENS:BUDGET")
    parser.add_argument("--schedules", nargs="+", default=["given"])
    args = parser.parse_args()
    config = llama.load_config(args.config)
    print("| tokens | budget | schedule | remat | sim makespan s | reloaded | offloaded | recomputes | recompute s | compile s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for point in args.points:
        tokens, size = point.split(":")
        graph = llama.build_llama(config, int(tokens)).graph
        for schedule in args.schedules:
            for remat in (False, True):
                r = measure(graph, parse_size(size), schedule, remat)
                print(f"| {tokens} | {size} | {schedule} | {'on' if remat else 'off'} | {r['makespan']:.4f} | "
                      f"{format_size(r['reloaded'])} | {format_size(r['offloaded'])} | {r['recomputes']} | "
                      f"{r['recompute_s']:.4f} | {r['compile_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

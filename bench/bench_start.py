"""Sim makespans of the GPU benchmark points, with the host link's idle time: how soon streaming starts.

    .venv/bin/python bench/bench_start.py                          # every point, both input placements
    .venv/bin/python bench/bench_start.py --points llama-8192-2 --inputs gpu
    .venv/bin/python bench/bench_start.py --jitter 0.3 --seeds 5   # nondet against fixed under copy jitter

A point is compiled as bench/run.py compiles it for turnip (the cuda backend's arena at the budget,
the given schedule) with inputs in host memory (`host`, what bench/run.py measures against the PCIe
floor) or on the GPU while they fit (`gpu`, the default of `turnip llama` and `turnip run`), then run
on the sim backend under `--orders`. With `--jitter J` every vertex takes U(1-J, 1+J) of its time (the sim
backend's jitter), drawn per seed; figures are then medians over `--seeds` seeds.
Prints one markdown row per point, placement and order: the makespan, its ratio to the PCIe floor
(weight bytes / H2D rate, bench/report.py's floor), and the H2D engine's idle time before the first
reload, in gaps, and after the last. `--json` keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime import arena_budget, execute  # noqa: E402
from runtime.backends.sim import SimBackend  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402
from turnip_ir.files import atomic_write  # noqa: E402

GIB = 1 << 30
POINTS = ("llama-8192-2", "llama-8192-4", "llama-32768-1", "llama-32768-2", "llama-32768-4", "ffn-2048-8", "ffn-8192-8")
"""The GPU benchmark's one-GPU points (bench/gpu_bench.sh: llama8k, llama32k, severe, schedules, ffn): workload-tokens-GiB."""


def graph_of(workload: str, tokens: int, preset: str):
    """The taskgraph bench/run.py builds for `workload`, and its weight bytes (what the PCIe floor counts)."""
    if workload == "llama":
        from frontend.workloads import llama

        config = llama.load_config(preset)
        graph = llama.build_llama(config, tokens).graph
        weights = sum(node.nbytes for node in graph.nodes.values() if node.op == "input" and "layers." in node.id)
        return graph, weights
    from frontend.workloads import ffn

    program = ffn.build(ffn.FfnConfig(layers=16, tokens=tokens, hidden=8192, ffn=32768, block=min(tokens, 2048), dtype="float16"))
    graph = program.taskgraph()
    weights = sum(node.nbytes for node in graph.nodes.values() if node.op == "input" and node.id.startswith("w"))
    return graph, weights


def measure(memgraph, order: str, jitter: float, seeds: int) -> dict:
    runs = []
    for seed in range(seeds if jitter > 0 else 1):
        backend = SimBackend(jitter=jitter, seed=seed) if jitter > 0 else "sim"
        summary = execute(memgraph, backend=backend, order=order, verify=False).summary
        idle = summary.h2d_idle[0]
        runs.append({"makespan": summary.makespan, "before": idle.before, "gaps": idle.gaps, "gap_count": idle.gap_count, "after": idle.after,
                     "reloaded": summary.bytes_reloaded})
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]} | {"makespans": [run["makespan"] for run in runs]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", nargs="+", default=list(POINTS), help="workload-tokens-GiB, e.g. llama-8192-2 ffn-8192-8")
    parser.add_argument("--inputs", nargs="+", default=["host", "gpu"], choices=("host", "gpu"))
    parser.add_argument("--orders", nargs="+", default=["nondet", "fixed"], choices=("nondet", "fixed", "random"))
    parser.add_argument("--jitter", type=float, default=0.0, help="relative spread of every copy's time")
    parser.add_argument("--seeds", type=int, default=5, help="jitter draws per point (medians)")
    parser.add_argument("--config", default="7b", help="llama preset (tiny: a smoke test)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from passes.pipeline import compile_taskgraph

    h2d = CostModel().h2d_bw
    rows = []
    print("| point | inputs | order | sim ms | x PCIe floor | H2D idle before ms | gaps ms (count) | after ms | reloaded GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for point in args.points:
        workload, tokens, gib = point.split("-")
        graph, weights = graph_of(workload, int(tokens), args.config)
        floor = weights / h2d
        for where in args.inputs:
            began = time.perf_counter()
            memgraph = compile_taskgraph(graph, arena_budget(graph, int(float(gib) * GIB), "cuda"), inputs=where)
            compiled = time.perf_counter() - began
            for order in args.orders:
                m = measure(memgraph, order, args.jitter, args.seeds)
                rows.append({"point": point, "inputs": where, "order": order, "floor": floor, "compile_s": compiled, "jitter": args.jitter, **m})
                print(f"| {point} | {where} | {order} | {m['makespan'] * 1e3:.2f} | {m['makespan'] / floor:.3f} | {m['before'] * 1e3:.2f} | "
                      f"{m['gaps'] * 1e3:.2f} ({m['gap_count']:g}) | {m['after'] * 1e3:.2f} | {m['reloaded'] / GIB:.2f} |", flush=True)
    if args.json:
        atomic_write(args.json, json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

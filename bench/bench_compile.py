"""Compiler speed: seconds per stage of `compile_taskgraph`, `turnip-opt` end to end, and the one-off
compile of the numba kernels.

Run: .venv/bin/python bench/bench_compile.py [--sizes 20000 100000] [--repeat 3]
Prints markdown tables for docs/benchmarks.md ("Compile time"; the reading in docs/benchmarks-log.md, "## Compiler"). Each figure is the median of
`--repeat` runs, with the spread (min-max) beside it: the development machine is shared, so the
spread is the noise. Plan quality (traffic, makespan, edges) is bench/bench_plans.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.compile_stats import CompileStats
from tools.random_graphs import random_taskgraph

STAGES = ("place", "simulate", "memory-deps", "minimize", "reduce", "verify")


def _graph(tasks: int):
    graph = random_taskgraph(1, tasks=tasks, devices=4, sizes=(16, 32, 48), window=50)
    return graph, 2 * minimum_budget(graph)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def compile_time(tasks: int, repeat: int) -> str:
    graph, budget = _graph(tasks)
    runs = []
    for _ in range(repeat):
        stats = CompileStats()
        start = time.perf_counter()
        memgraph = compile_taskgraph(graph, budget, stats=stats)
        runs.append((time.perf_counter() - start, stats))
    total, stats = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    stages = " | ".join(f"{stats.seconds[s]:.2f}" for s in STAGES)
    return f"| {tasks} | {len(graph)} | {len(memgraph)} | {budget} | {stages} | {_spread([r[0] for r in runs])} |"


def cli_time(tasks: int, repeat: int) -> str:
    """Wall time of `turnip-opt g.json -p 'turnip-memgraph{budget=B}' --emit json -o m.json`, start-up included."""
    graph, budget = _graph(tasks)
    with tempfile.TemporaryDirectory() as folder:
        src, out = Path(folder) / "g.json", Path(folder) / "m.json"
        src.write_text(graph.dumps())
        command = [str(Path(sys.executable).parent / "turnip-opt"), str(src), "-p", f"turnip-memgraph{{budget={budget}}}"]
        spans = []
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run([*command, "--emit", "json", "-o", str(out)], check=True)
            spans.append(time.perf_counter() - start)
        return f"| {tasks} | {len(graph)} | {budget} | {_spread(spans)} | {out.stat().st_size / 1e6:.1f} |"


def kernel_compile_time() -> str:
    """A 200-task compile in a fresh process, with numba's cache empty and then warm."""
    code = (
        "import time; t = time.perf_counter();"
        "from tools.random_graphs import random_taskgraph; from passes.pipeline import compile_taskgraph;"
        "g = random_taskgraph(0, tasks=200, devices=2); compile_taskgraph(g, 1 << 20);"
        "print(time.perf_counter() - t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        cold, warm = (float(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout) for _ in range(2))
    return f"| 200 tasks, imports included | {cold:.1f} | {warm:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[20000, 100000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| tasks | taskgraph nodes | memgraph nodes | budget | " + " | ".join(STAGES) + " | total s, median (min-max) |")
    print("|" + " --- |" * (5 + len(STAGES)))
    for tasks in args.sizes:
        print(compile_time(tasks, args.repeat), flush=True)
    print()
    print("| tasks | taskgraph nodes | budget | turnip-opt wall s, median (min-max) | memgraph JSON MB |")
    print("| --- | --- | --- | --- | --- |")
    for tasks in args.sizes:
        print(cli_time(tasks, args.repeat), flush=True)
    print()
    print("| run | numba cache empty s | cache warm s |")
    print("| --- | --- | --- |")
    print(kernel_compile_time(), flush=True)


if __name__ == "__main__":
    main()

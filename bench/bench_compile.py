"""Compiler speed: seconds per stage of `compile_taskgraph`, `turnip-opt` end to end, and the one-off
compile of the numba kernels; with `--targets`, the three compile-speed targets of issue 26 alone.

Run: .venv/bin/python bench/bench_compile.py [--sizes 20000 100000] [--repeat 3] [--targets]
Prints markdown tables for docs/benchmarks.md ("Compile time"; the reading in docs/benchmarks-log.md, "## Compiler"); `--targets` prints the figures of
docs/passes.md ("Compile speed"): a 100k-task random taskgraph to a verified memgraph (target 10 s),
LLaMA-7B at 128k tokens built and compiled at 2 GiB (target 5 s, the build apart) and its JSON read
(target 1 s). Each figure is the median of `--repeat` runs, with the spread (min-max) beside it, in
wall seconds and in this process's CPU seconds: the development machine is shared, so the spread is
the noise and CPU seconds are the steadier figure. Plan quality is bench/bench_plans.py.
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
from turnip_ir.units import format_size

STAGES = ("place", "simulate", "memory-deps", "minimize", "reduce", "verify")


def _graph(tasks: int):
    graph = random_taskgraph(1, tasks=tasks, devices=4, sizes=(16, 32, 48), window=50)
    return graph, 2 * minimum_budget(graph)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def compile_time(tasks: int, repeat: int) -> str:
    """A row of the stages table: the median run's seconds per stage, then wall and CPU seconds in all."""
    graph, budget = _graph(tasks)
    runs = []
    for _ in range(repeat):
        stats = CompileStats()
        start, cpu = time.perf_counter(), time.process_time()
        memgraph = compile_taskgraph(graph, budget, stats=stats)
        runs.append((time.perf_counter() - start, time.process_time() - cpu, stats))
    _, _, stats = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    stages = " | ".join(f"{stats.seconds[s]:.2f}" for s in STAGES)
    return (f"| {tasks} | {len(graph)} | {len(memgraph)} | {budget} | {memgraph.storage_bytes} | {stages} | "
            f"{_spread([r[0] for r in runs])} | {_spread([r[1] for r in runs])} |")


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


def _timed(work, repeat: int) -> tuple[str, str, object]:
    """`work()` run `repeat` times: wall and CPU seconds as median (min-max), and the last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return _spread(walls), _spread(cpus), result


def _stage_figures(graph, budget: int, repeat: int) -> tuple[str, str, str, str]:
    """Wall, CPU seconds of `compile_taskgraph`, the median run's seconds per stage, and the CPU storage
    the plan pins (`storage_bytes`: the host plan's quality)."""
    runs: list[CompileStats] = []

    def compile_once():
        runs.append(CompileStats())
        return compile_taskgraph(graph, budget, stats=runs[-1])

    wall, cpu, memgraph = _timed(compile_once, repeat)
    stages = ", ".join(f"{s} {statistics.median(r.seconds[s] for r in runs):.2f}" for s in STAGES)
    return wall, cpu, stages, format_size(memgraph.storage_bytes)


def targets(repeat: int) -> None:
    """The three figures of issue 26: seconds wall and CPU, median (min-max), with the target."""
    from frontend.workloads.llama import build_llama, load_config
    from turnip_ir.io import load_graph

    print("| what | target s | wall s | CPU s | stages (median wall s) | CPU storage |")
    print("| --- | --- | --- | --- | --- | --- |")
    graph, budget = _graph(100000)
    print(f"| 100k-task random taskgraph ({len(graph)} nodes), compile at {budget} B | 10 | "
          + " | ".join(_stage_figures(graph, budget, repeat)) + " |", flush=True)
    wall, cpu, built = _timed(lambda: build_llama(load_config("7b"), 131072), repeat)
    print(f"| LLaMA-7B 128k: build_llama ({len(built.graph)} tasks), not compile time | - | {wall} | {cpu} | | |", flush=True)
    print("| LLaMA-7B 128k: compile at 2 GiB | 5 | " + " | ".join(_stage_figures(built.graph, 2 << 30, repeat)) + " |", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "llama.json"
        path.write_text(built.graph.dumps())
        wall, cpu, _ = _timed(lambda: load_graph(path), repeat)
        print(f"| LLaMA-7B 128k: JSON read (load_graph, {path.stat().st_size / 1e6:.1f} MB) | 1 | {wall} | {cpu} | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[20000, 100000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", action="store_true", help="only the three compile-speed targets (docs/passes.md)")
    args = parser.parse_args()
    if args.targets:
        targets(args.repeat)
        return
    print("| tasks | taskgraph nodes | memgraph nodes | budget | storage B | " + " | ".join(STAGES)
          + " | total s, median (min-max) | CPU s, median (min-max) |")
    print("|" + " --- |" * (7 + len(STAGES)))
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

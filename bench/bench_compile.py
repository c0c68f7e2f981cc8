"""Compiler benchmarks: compile time per stage, offload traffic per planner order vs a Belady bound, edge counts.

Run: .venv/bin/python bench/bench_compile.py [--sizes 20000 100000]
Prints markdown tables for docs/benchmarks.md ("## Compiler").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from passes.allocator import aligned
from passes.compact import TaskView
from passes.insert_offload import minimum_budget
from passes.orders import execution_order
from passes.pipeline import compile_taskgraph
from passes.stats import CompileStats
from turnip_ir.memgraph import MemGraph
from turnip_ir.random_graphs import random_taskgraph
from turnip_ir.workloads import ffn as ffn_workload
from turnip_ir.workloads import matmul as matmul_workload

STAGES = ("place", "simulate", "memory-deps", "minimize", "reduce", "verify")


def compile_time(tasks: int) -> str:
    graph = random_taskgraph(1, tasks=tasks, devices=4, sizes=(16, 32, 48), window=50)
    budget = 2 * minimum_budget(graph)
    stats = CompileStats()
    start = time.perf_counter()
    memgraph = compile_taskgraph(graph, budget, stats=stats)
    total = time.perf_counter() - start
    stages = " | ".join(f"{stats.seconds[s]:.2f}" for s in STAGES)
    return f"| {tasks} | {len(graph)} | {len(memgraph)} | {budget} | {stages} | {total:.2f} |"


def cli_time(tasks: int) -> str:
    """Wall time of `turnip-opt g.json -p 'turnip-memgraph{budget=B}' --emit json -o m.json`, start-up included."""
    graph = random_taskgraph(1, tasks=tasks, devices=4, sizes=(16, 32, 48), window=50)
    budget = 2 * minimum_budget(graph)
    with tempfile.TemporaryDirectory() as folder:
        src, out = Path(folder) / "g.json", Path(folder) / "m.json"
        src.write_text(graph.dumps())
        command = [str(Path(sys.executable).parent / "turnip-opt"), str(src), "-p", f"turnip-memgraph{{budget={budget}}}"]
        start = time.perf_counter()
        subprocess.run([*command, "--emit", "json", "-o", str(out)], check=True)
        return f"| {tasks} | {len(graph)} | {budget} | {time.perf_counter() - start:.2f} | {out.stat().st_size / 1e6:.1f} |"


def belady_reloads(graph, order: str, budget: int) -> int:
    """Fewest reloads (bytes) of uniform tensors in `order`: Belady's farthest-next-use cache per GPU.

    Cold loads of inputs are free, as are tensors written by the task itself; a miss is a tensor that
    was on the GPU before and is needed again after being evicted.
    """
    view = TaskView.build(graph)
    steps = execution_order(view, order)
    uses: dict[int, list[int]] = {}
    for step, i in enumerate(steps):
        for o in set(view.inputs[i]):
            uses.setdefault(o, []).append(step)
    slots = budget // aligned(max(view.nbytes))
    cache: list[set[int]] = [set() for _ in range(graph.devices)]
    seen: set[int] = set()
    misses = 0

    def next_use(t: int, step: int) -> int:
        return next((s for s in uses.get(t, []) if s > step), 1 << 60)

    def insert(t: int, step: int, pinned: set[int]) -> None:
        held = cache[view.devices[t]]
        while len(held) >= slots:
            held.remove(max((x for x in held if x not in pinned), key=lambda x: next_use(x, step)))
        held.add(t)

    for step, i in enumerate(steps):
        pinned = set(view.inputs[i])
        for o in pinned:
            if o not in cache[view.devices[o]]:
                misses += o in seen
                insert(o, step, pinned)
            seen.add(o)
        insert(i, step, pinned | {i})
        seen.add(i)
        for o in pinned:
            if next_use(o, step) == 1 << 60 and o not in view.outputs:
                cache[view.devices[o]].discard(o)
    return misses * max(view.nbytes)


def warm_reload_bytes(memgraph: MemGraph) -> int:
    """Reload bytes minus the first reload of each input that starts in storage (a cold load)."""
    by_id = memgraph.by_id()
    cold: set[int] = set()
    total = 0
    for node in memgraph.nodes:
        if node.op != "reload":
            continue
        src = by_id[node.inputs[0]]
        if src.op == "input" and src.id not in cold:
            cold.add(src.id)
            continue
        total += node.loc[1]
    return total


def traffic_rows(name: str, graph, slot_counts) -> list[str]:
    rows = []
    slot = aligned(max(n.nbytes for n in graph.nodes.values()))
    for slots in slot_counts:
        budget = slots * slot
        for order in ("given", "dfs", "memory"):
            stats = CompileStats()
            memgraph = compile_taskgraph(graph, budget, order=order, stats=stats)
            bound = belady_reloads(graph, order, budget)
            rows.append(
                f"| {name} | {slots} | {order} | {stats.bytes_offloaded} | {stats.bytes_reloaded} "
                f"| {warm_reload_bytes(memgraph)} | {bound} | {stats.edges_added} | {stats.edges_redundant} "
                f"| {stats.edges_removed_minimize} | {stats.edges_removed_reduce} | {stats.memory_edges} |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[20000, 100000])
    args = parser.parse_args()
    print("| tasks | taskgraph nodes | memgraph nodes | budget | " + " | ".join(STAGES) + " | total s |")
    print("|" + " --- |" * (5 + len(STAGES)))
    for tasks in args.sizes:
        print(compile_time(tasks), flush=True)
    print()
    print("| tasks | taskgraph nodes | budget | turnip-opt wall s | memgraph JSON MB |")
    print("| --- | --- | --- | --- | --- |")
    for tasks in args.sizes:
        print(cli_time(tasks), flush=True)
    print()
    print("| graph | slots | order | offload B | reload B | warm reload B | Belady warm reload B | edges added | redundant | removed (minimize) | removed (reduce) | kept |")
    print("|" + " --- |" * 12)
    ffn = ffn_workload.build(ffn_workload.FfnConfig(layers=8, tokens=64, hidden=64, ffn=64, block=64)).taskgraph()
    matmul = matmul_workload.build(matmul_workload.MatmulConfig(m=256, k=256, n=256, block=64, gpus=2)).taskgraph()
    for row in traffic_rows("ffn 8 layers", ffn, (4, 6, 10)) + traffic_rows("blocked matmul 4x4", matmul, (3, 5, 8)):
        print(row, flush=True)


if __name__ == "__main__":
    main()

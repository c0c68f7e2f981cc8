"""Plan-quality benchmarks: offload traffic against Belady, sim makespan against a bound, memory edges.

    .venv/bin/python bench/bench_plans.py traffic    # offload/reload bytes per schedule vs a Belady simulation
    .venv/bin/python bench/bench_plans.py makespan   # sim makespan vs max(compute, transfer) per GPU
    .venv/bin/python bench/bench_plans.py llama      # the same for LLaMA 7b prefill at 8k, 32k and 128k tokens
    .venv/bin/python bench/bench_plans.py edges      # memory edges kept vs every-reader edges without minimization

Prints markdown tables for docs/benchmarks.md ("Plan quality"; the reading in docs/benchmarks-log.md, "## Compiler"). The Belady simulation and the edge
baseline below share no code with the planner (passes/): they read the taskgraph and the memgraph only.
"""

from __future__ import annotations

import argparse

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed

from passes.compact import TaskView
from passes.insert_offload import insert_offload, minimum_budget
from passes.schedules import SCHEDULES, scheduled_tasks
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from passes.compile_stats import CompileStats
from runtime import execute
from turnip_ir.cost import CostModel
from turnip_ir.errors import BudgetError
from seed_graphs import blocked_matmul, ffn_stack  # noqa: E402
from tools.random_graphs import random_taskgraph

GIB = 1 << 30
UNIT = 256
"""The planner's alignment while the budget allows it; the Belady simulation counts sizes in the same units."""
END = 1 << 60


def _units(nbytes: int) -> int:
    return max(1, -(-nbytes // UNIT))


class Belady:
    """Farthest-next-use eviction per GPU over a byte capacity (no fragmentation), counting bytes moved.

    The same rules as the planner's model: inputs start on their GPU in first-use order while they fit,
    and one evicted before its first read costs nothing (it could have started in storage); a tensor is
    offloaded when evicted without a storage copy while still needed or an output; a load is a reload.
    For tiles of one size this is Belady's algorithm, optimal in reloads for the schedule; for mixed sizes
    it is a reference that ignores fragmentation, not a bound.
    """

    def __init__(self, graph, schedule: str, budget: int) -> None:
        self.view = TaskView.build(graph)
        self.steps = scheduled_tasks(self.view, schedule)
        self.uses: dict[int, list[int]] = {}
        for step, i in enumerate(self.steps):
            for o in dict.fromkeys(self.view.inputs[i]):
                self.uses.setdefault(o, []).append(step)
        self.outputs = set(self.view.outputs)
        self.capacity = budget // UNIT
        self.held: list[dict[int, int]] = [{} for _ in range(graph.devices)]
        self.stored: set[int] = set()
        self.unread: set[int] = set()
        self.reloaded = self.offloaded = 0

    def run(self) -> tuple[int, int]:
        """(reload bytes, offload bytes)."""
        view = self.view
        inputs = [i for i, op in enumerate(view.ops) if op == "input"]
        for i in sorted(inputs, key=lambda i: self.uses.get(i, [END])[0]):
            held = self.held[view.devices[i]]
            if (i in self.uses or i in self.outputs) and sum(held.values()) + _units(view.nbytes[i]) <= self.capacity:
                held[i] = _units(view.nbytes[i])
                self.unread.add(i)
            else:
                self.stored.add(i)
        for step, i in enumerate(self.steps):
            self._step(step, i)
        return self.reloaded, self.offloaded

    def _step(self, step: int, i: int) -> None:
        view = self.view
        operands = list(dict.fromkeys(view.inputs[i]))
        pinned = set(operands) | {i}
        for o in operands:
            held = self.held[view.devices[o]]
            if o not in held:
                self._make_room(view.devices[o], _units(view.nbytes[o]), step, pinned)
                held[o] = _units(view.nbytes[o])
                self.reloaded += view.nbytes[o]
        self._make_room(view.devices[i], _units(view.nbytes[i]), step, pinned)
        self.held[view.devices[i]][i] = _units(view.nbytes[i])
        for t in operands + [i]:
            self.unread.discard(t)
            if self._next_use(t, step) == END and t not in self.outputs:
                self.held[view.devices[t]].pop(t, None)

    def _next_use(self, t: int, step: int) -> int:
        return next((s for s in self.uses.get(t, []) if s > step), END)

    def _make_room(self, device: int, units: int, step: int, pinned: set[int]) -> None:
        held = self.held[device]
        while sum(held.values()) + units > self.capacity:
            victim = max((t for t in held if t not in pinned), key=lambda t: (self._next_use(t, step), -t))
            del held[victim]
            if victim in self.unread:
                self.unread.discard(victim)
                self.stored.add(victim)
            elif victim not in self.stored:
                if self._next_use(victim, step) < END or victim in self.outputs:
                    self.offloaded += self.view.nbytes[victim]
                self.stored.add(victim)


def wasted_reload_bytes(memgraph) -> int:
    """Bytes reloaded twice before one kernel or move: a tensor brought in again by the same step."""
    wasted = 0
    seen: set[str] = set()
    for node in memgraph.nodes:
        if node.op == "reload":
            if node.task in seen:
                wasted += node.loc[1]
            seen.add(node.task)
        elif node.op in ("kernel", "move"):
            seen.clear()
    return wasted


def traffic_rows(name: str, graph, budgets) -> list[str]:
    rows = []
    for label, budget in budgets:
        for schedule in SCHEDULES:
            stats = CompileStats()
            memgraph = compile_taskgraph(graph, budget, schedule=schedule, stats=stats)
            reload_ref, offload_ref = Belady(place_devices(graph), schedule, budget).run()
            rows.append(
                f"| {name} | {label} | {schedule} | {stats.bytes_offloaded} | {stats.bytes_reloaded} | {wasted_reload_bytes(memgraph)} "
                f"| {offload_ref} | {reload_ref} | {stats.bytes_reloaded / max(reload_ref, 1):.2f} |"
            )
    return rows


def traffic() -> None:
    print("| graph | budget | schedule | offload B | reload B | reloaded twice in a step B | Belady offload B | Belady reload B | reload / Belady |")
    print("|" + " --- |" * 9)
    slot = 64 * 64 * 4
    ffn = ffn_stack(layers=8, tokens=64, hidden=64, ffn=64, devices=1)
    matmul = blocked_matmul(n=256, blocks=4, devices=2)
    cases = [
        ("ffn 8 layers", ffn, [(f"{s} slots", s * slot) for s in (4, 6, 10)]),
        ("blocked matmul 4x4, 2 GPUs", matmul, [(f"{s} slots", s * slot) for s in (3, 5, 8)]),
    ]
    for seed in (3, 4):
        rand = random_taskgraph(seed, tasks=400, devices=2, sizes=(16, 32, 48), window=30)
        low = minimum_budget(rand)
        cases.append((f"random {seed}, 400 tasks, mixed sizes", rand, [(f"{f}x min", int(f * low)) for f in (1.0, 1.5, 3.0)]))
    for name, graph, budgets in cases:
        for row in traffic_rows(name, graph, budgets):
            print(row, flush=True)


def resource_bound(memgraph, cost: CostModel) -> float:
    """max over GPUs of its kernels' time and each of its links' transfer time, in seconds.

    No schedule beats it: kernels on one GPU share it, H2D and D2H share the host link (at most
    `duplex_bw` together), moves into a GPU share its peer engine.
    """
    nodes = memgraph.nodes
    by_id = {node.id: node for node in nodes}
    busy = []
    for d in range(memgraph.devices):
        mine = [n for n in nodes if n.device == d]
        compute = sum(cost.duration(n, [by_id[i] for i in n.inputs]) for n in mine if n.op == "kernel")
        h2d = sum(n.nbytes for n in mine if n.op == "reload")
        d2h = sum(n.nbytes for n in mine if n.op == "offload")
        peer = sum(n.nbytes for n in mine if n.op == "move")
        busy.append(max(compute, h2d / cost.h2d_bw, d2h / cost.d2h_bw, (h2d + d2h) / cost.duplex_bw, peer / cost.peer_bw))
    return max(busy)


def critical_path(memgraph, cost: CostModel) -> float:
    """The longest chain of data and memory edges, each vertex at its solo duration: this plan's floor."""
    nodes = memgraph.nodes
    by_id = {node.id: node for node in nodes}
    finish: dict[int, float] = {}
    for node in nodes:
        own = 0.0 if node.op == "input" else cost.duration(node, [by_id[i] for i in node.inputs])
        finish[node.id] = own + max((finish[d] for d in node.deps()), default=0.0)
    return max(finish.values())


def makespan_rows(label: str, graph, budgets) -> list[str]:
    cost = CostModel()
    rows = []
    for budget in budgets:
        try:
            memgraph = compile_taskgraph(graph, budget)
        except BudgetError:
            rows.append(f"| {label} | {budget / GIB:.0f} | does not fit | | | | | |")
            continue
        bound, chain = resource_bound(memgraph, cost), critical_path(memgraph, cost)
        spans = [execute(memgraph, backend="sim", order=order).summary.makespan for order in ("fixed", "nondet")]
        moved = sum(n.nbytes for n in memgraph.nodes if n.op in ("offload", "reload"))
        rows.append(
            f"| {label} | {budget / GIB:.0f} | {moved / GIB:.2f} | {bound * 1e3:.1f} | {chain * 1e3:.1f} "
            f"| {spans[0] * 1e3:.1f} / {spans[1] * 1e3:.1f} | {spans[0] / bound:.3f} | {spans[1] / bound:.3f} |"
        )
    return rows


def makespan() -> None:
    print("| graph | budget GiB | offload+reload GiB | bound ms | critical path ms | fixed / nondet ms | fixed / bound | nondet / bound |")
    print("|" + " --- |" * 8)
    ffn1 = ffn_stack(layers=16, tokens=2048, hidden=8192, ffn=32768, devices=1, dtype="bfloat16")
    ffn2 = ffn_stack(layers=16, tokens=2048, hidden=8192, ffn=32768, devices=2, dtype="bfloat16")
    matmul = blocked_matmul(n=32768, blocks=4, devices=3, dtype="float32")
    cases = [
        ("ffn 16x8192x32768 bf16, 1 GPU", ffn1, (24, 8, 4, 2)),
        ("same, 2 GPUs", ffn2, (12, 4, 2)),
        ("blocked matmul 32768 fp32, 4x4 tiles, 3 GPUs", matmul, (8, 2, 1)),
    ]
    for label, graph, budgets in cases:
        for row in makespan_rows(label, graph, [b * GIB for b in budgets]):
            print(row, flush=True)


LLAMA_CASES = ((8192, 1, (16, 4, 2)), (32768, 1, (16, 4, 2)), (32768, 2, (4,)), (131072, 1, (16, 4)))
"""(tokens, GPUs, budgets in GiB): 7b in fp16, blocks of 4096 tokens, the `sequence` placement."""


def llama_makespan() -> None:
    from frontend.workloads import llama

    print("| graph | budget GiB | offload+reload GiB | bound ms | critical path ms | fixed / nondet ms | fixed / bound | nondet / bound |")
    print("|" + " --- |" * 8)
    for tokens, gpus, budgets in LLAMA_CASES:
        built = llama.build_llama(llama.load_config("7b"), tokens, gpus=gpus)
        label = f"llama 7b {tokens // 1024}k fp16, {gpus} GPU{'s' if gpus > 1 else ''}"
        for row in makespan_rows(label, built.graph, [b * GIB for b in budgets]):
            print(row, flush=True)


def every_reader_edges(memgraph) -> int:
    """Edges of the seed's rule without minimization: each write waits for the last writer of every
    byte it overwrites and for every reader of that writer (brute force over live segments)."""
    readers: dict[int, set[int]] = {}
    for node in memgraph.nodes:
        for i in node.inputs:
            readers.setdefault(i, set()).add(node.id)
    live: dict[tuple, list[tuple[int, int, int]]] = {}
    edges = 0
    for node in memgraph.nodes:
        if node.loc is not None and node.device is not None:
            space, start, end = ("gpu", node.device), node.loc[0], node.loc[0] + node.loc[1]
        elif node.storage is not None:
            space, start, end = ("storage",), node.storage[0], node.storage[0] + node.storage[1]
        else:
            continue
        segments = live.setdefault(space, [])
        sources: set[int] = set()
        for s, e, writer in segments:
            if s < end and start < e:
                sources |= {writer} | readers.get(writer, set())
        edges += len(sources - {node.id})
        kept = [(s, e, w) for s, e, w in segments if e <= start or s >= end]
        kept += [(s, start, w) for s, e, w in segments if s < start < e] + [(end, e, w) for s, e, w in segments if s < end < e]
        live[space] = kept + [(start, end, node.id)] if start < end else kept
    return edges


def edges() -> None:
    print("| graph | budget | every-reader edges (no minimization) | memory edges kept | kept / every-reader |")
    print("| --- | --- | --- | --- | --- |")
    slot = 64 * 64 * 4
    rand = random_taskgraph(7, tasks=3000, devices=2, sizes=(16, 32, 48), window=30)
    cases = [
        ("ffn 8 layers", ffn_stack(layers=8, tokens=64, hidden=64, ffn=64, devices=1), "6 slots", 6 * slot),
        ("blocked matmul 4x4, 2 GPUs", blocked_matmul(n=256, blocks=4, devices=2), "5 slots", 5 * slot),
        ("random 3000 tasks, 2 GPUs", rand, "1.2x min", int(1.2 * minimum_budget(rand))),
        ("random 3000 tasks, 2 GPUs", rand, "3x min", 3 * minimum_budget(rand)),
    ]
    for name, graph, label, budget in cases:
        baseline = every_reader_edges(insert_offload(place_devices(graph), budget))
        stats = CompileStats()
        compile_taskgraph(graph, budget, stats=stats)
        print(f"| {name} | {label} | {baseline} | {stats.memory_edges} | {stats.memory_edges / baseline:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["traffic", "makespan", "llama", "edges", "all"], nargs="?", default="all")
    args = parser.parse_args()
    if args.which in ("traffic", "all"):
        traffic()
        print()
    if args.which in ("makespan", "all"):
        makespan()
        print()
    if args.which in ("llama", "all"):
        llama_makespan()
        print()
    if args.which in ("edges", "all"):
        edges()


if __name__ == "__main__":
    main()

"""How much any dispatch order could gain over `fixed` on one plan, with the bursts known in advance
(issue 26: "nondet at least 1.15x faster than fixed under interference").

bench/bench_interference.py measures nondet against fixed and bounds every order from below by
max(compute, path, link). That bound leaves room at 32k / 1 GiB (1.27-1.32x on the H200), so it cannot
say whether some order would reach 1.15x there. This script looks for one on the sim, whose cost model
is within 5% of every measured llama point on a quiet link (docs/runtime.md, "The cost model"): an
oracle that knows the bursts' schedule searches over list-scheduling orders and keeps the fastest it
finds.

Every order here is a key per vertex: a free lane of a resource class starts its ready vertex with the
least key, as nondet does with its own keys. The candidates:
- `fixed` and `nondet` (runtime/policies.py), and `random` over `--random` seeds;
- `plan`: the memgraph's position as the key (fixed's order without its wait for the head);
- `critical`: the critical path as the key of copies too, not only of kernels;
- `climb`: a hill climb from the best of plan, nondet and critical, `--steps` mutations with the same bursts: each moves
  `--moves` random copies (reloads and offloads) earlier or later in the plan by up to `--reach`
  vertices and keeps the change if the run ends sooner. The climb tunes the order to the one burst
  schedule it is scored on, which no run-time policy can know: it overstates what a policy could gain.

What it finds is a lower bound on the best order's gain, not a proof that no order gains more; with
the bound of bench_interference.py it brackets the answer.

    .venv/bin/python bench/investigations/order_headroom.py --points 32768@1GiB --layer-order halves
    .venv/bin/python bench/investigations/order_headroom.py --points 8192@2GiB --steps 300 --json out/headroom.json
    .venv/bin/python bench/investigations/order_headroom.py --quiet ...   # no bursts: the headroom on a quiet link
    .venv/bin/python bench/investigations/order_headroom.py --gpus 2 --placement sequence --points 32768@1GiB   # bursts on GPU 0's link
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_interference import built_llama, burst_seed, bursts_until, point_of  # noqa: E402
from frontend.workloads.llama.graph import LAYER_ORDERS, PLACEMENTS  # noqa: E402
from runtime.executor import Executor  # noqa: E402
from runtime.graph import build_exec_graph  # noqa: E402
from runtime.policies import NondetPolicy, Policy, make_policy  # noqa: E402
from turnip_ir.files import atomic_write  # noqa: E402


class KeyPolicy(Policy):
    """The ready vertex with the least key, per resource class (ties: the earliest in the memgraph)."""

    def __init__(self, graph, key):
        super().__init__(graph)
        self.key = key
        self.heaps = [[] for _ in graph.lanes_of]

    def ready(self, vertex: int) -> None:
        heapq.heappush(self.heaps[self.graph.resource[vertex]], (self.key[vertex], vertex))

    def pick(self, resource: int):
        heap = self.heaps[resource]
        return heapq.heappop(heap)[1] if heap else None


def makespan(graph, policy, windows, share: float) -> float:
    from runtime.backends.sim import SimBackend
    from runtime.callbacks import Recorder

    backend = SimBackend(interference=windows, share=share)
    backend.prepare(graph, {})
    recorder = Recorder()
    Executor(graph, backend, policy, [recorder]).run()
    backend.close()
    return max(c.end for c in recorder.completions)


def nondet_keys(graph) -> list[float]:
    """The keys NondetPolicy orders each resource's ready vertices by (kernels by critical path, copies by
    their first dependent's position), read from the policy itself: every vertex made ready once."""
    policy = NondetPolicy(graph)
    for vertex, resource in enumerate(graph.resource):
        if resource >= 0:
            policy.ready(vertex)
    keys = [0.0] * len(graph)
    for heap in policy.heaps:
        for key, vertex in heap:
            keys[vertex] = float(key)
    return keys


def headroom(graph, windows, share: float, seeds: int, steps: int, moves: int, reach: int, rng: random.Random) -> dict:
    """Each candidate's makespan under `windows`, and the climb's."""
    spans = {name: makespan(graph, make_policy(name, graph), windows, share) for name in ("fixed", "nondet")}
    spans["random"] = min(makespan(graph, make_policy("random", graph, seed), windows, share) for seed in range(seeds)) if seeds else None
    nondet = nondet_keys(graph)
    probe = NondetPolicy(graph)
    copies = [v for v, r in enumerate(graph.resource) if r >= 0 and probe.copies[r]]
    plan = [float(i) for i in range(len(graph))]
    critical = [-p for p in graph.priority]
    spans["plan"] = makespan(graph, KeyPolicy(graph, plan), windows, share)
    spans["critical"] = makespan(graph, KeyPolicy(graph, critical), windows, share)
    starts = [(spans["plan"], plan, 1.0), (spans["nondet"], nondet, 1.0),
              (spans["critical"], critical, (max(critical) - min(critical)) / max(1, len(graph)))]  # `reach` vertices in the key's units
    best, key, scale = min(starts, key=lambda start: start[0])
    kept = 0
    for _ in range(steps):
        trial = list(key)
        for vertex in rng.sample(copies, min(moves, len(copies))):
            trial[vertex] += rng.uniform(-reach, reach) * scale
        span = makespan(graph, KeyPolicy(graph, trial), windows, share)
        if span < best:
            key, best, kept = trial, span, kept + 1
    spans["climb"] = best
    spans["climb_kept"] = kept
    return spans


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", nargs="+", default=["8192@2GiB", "32768@1GiB"], help="TOKENS@BUDGET")
    parser.add_argument("--config", default="7b")
    parser.add_argument("--block", type=int)
    parser.add_argument("--layer-order", default=LAYER_ORDERS[0], choices=LAYER_ORDERS)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--placement", default=PLACEMENTS[0], choices=PLACEMENTS)
    parser.add_argument("--interfere-on", type=int, nargs="+", default=[0], metavar="GPU")
    parser.add_argument("--bursts", type=int, default=2, help="burst schedules per point (seeds 0..N-1, as bench_interference draws them)")
    parser.add_argument("--burst-ms", type=float, nargs=2, default=[2.0, 20.0])
    parser.add_argument("--gap-ms", type=float, nargs=2, default=[2.0, 40.0])
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--quiet", action="store_true", help="no bursts")
    parser.add_argument("--random", type=int, default=10, help="random-order seeds")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--moves", type=int, default=8)
    parser.add_argument("--reach", type=int, default=40)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    import run

    report = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "rows": []}
    print("| point | bursts | fixed s | nondet s | random (best) | plan | critical | climb (kept) | fixed / best |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for text in args.points:
        tokens, budget = point_of(text)
        built = built_llama(args.config, tokens, args.block, args.layer_order, gpus=args.gpus, placement=args.placement)
        memgraph, *_ = run.compile_turnip(built.graph, budget, built.activation_ids)
        graph = build_exec_graph(memgraph, 2)
        quiet = makespan(graph, make_policy("fixed", graph), [], args.share)
        for seed in range(1 if args.quiet else args.bursts):
            horizon = 4 * quiet / args.share
            windows = {} if args.quiet else {gpu: bursts_until(burst_seed(seed, gpu), args.burst_ms, args.gap_ms, horizon)
                                             for gpu in args.interfere_on}
            spans = headroom(graph, windows, args.share, args.random, args.steps, args.moves, args.reach, random.Random(seed))
            best = min(v for k, v in spans.items() if k != "climb_kept" and v is not None)
            row = {"point": text, "bursts": None if args.quiet else seed, **spans, "fixed_over_best": spans["fixed"] / best}
            report["rows"].append(row)
            rand = "" if spans["random"] is None else f"{spans['random']:.4f}"
            print(f"| {text} | {'none' if args.quiet else seed} | {spans['fixed']:.4f} | {spans['nondet']:.4f} | {rand} | {spans['plan']:.4f} | "
                  f"{spans['critical']:.4f} | {spans['climb']:.4f} ({spans['climb_kept']}) | {row['fixed_over_best']:.3f} |", flush=True)
            if args.json:
                atomic_write(args.json, json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

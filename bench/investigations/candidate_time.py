"""How long does one plan-search candidate take, alone and beside others? (issue 45: on the H100 host a 32k
/ 1 GiB candidate took 1.2-1.9 s inside a 16-process search, against about 0.5 s alone on the 2-core VM.)

    python3 bench/investigations/candidate_time.py --tokens 32768 --memory 1GiB --processes 1 4 8 16

Times one candidate's parts in this process (build, bound, compile, the plan's bound, the sim, each the
median of `--repeats`), then the whole evaluation (`turnip.search.evaluate`, no deadline) in N forked
processes at once for each N of `--processes`: if the parallel times grow with N on a host with N cores,
the candidates contend for something the cores share (memory bandwidth, caches); if one alone is as slow,
the cores are. Prints one line per part and per N.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from frontend.workloads import llama  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import sim_makespan  # noqa: E402
from turnip.bounds import makespan_bound, plan_bound  # noqa: E402
from turnip.candidates import Candidate, LlamaPrefill, PlanTarget  # noqa: E402
from turnip.search import evaluate  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402
from turnip_ir.units import parse_size  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--memory", default="1GiB")
    parser.add_argument("--candidate", default="halves,4096,1,given", help="layer order, block, query group, schedule")
    parser.add_argument("--attention", default="", help="price attention as this provider (torch-cudnn: the cuda search's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="*", default=[1, 2])
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    order, block, group, schedule = args.candidate.split(",")
    candidate = Candidate(order, int(block), int(group), schedule)
    prefill = LlamaPrefill(llama.load_config(args.config), args.tokens)
    target = PlanTarget(parse_size(args.memory), "sim")
    cost = CostModel().for_attention(args.attention) if args.attention else CostModel()
    parts: dict[str, list[float]] = {}

    def timed(name, work):
        began = time.perf_counter()
        result = work()
        parts.setdefault(name, []).append(time.perf_counter() - began)
        return result

    for _ in range(args.repeats):
        built = timed("build", lambda: prefill.build(candidate))
        arena = target.arena_of(built.graph)
        timed("bound", lambda: makespan_bound(built.graph, arena, cost))
        memgraph = timed("compile", lambda: compile_taskgraph(built.graph, arena, candidate.schedule, verify=False))
        timed("plan bound", lambda: plan_bound(memgraph, cost))
        timed("sim", lambda: sim_makespan(memgraph, target.streams, cost=cost))
        timed("evaluate", lambda: evaluate(prefill, target, candidate, lambda: math.inf, cost=cost))
    print(f"{candidate.describe()}, {args.tokens} tokens at {args.memory}; {os.cpu_count()} CPUs")
    for name, seconds in parts.items():
        print(f"  alone: {name:10s} {statistics.median(seconds):.3f} s")
    for n in args.processes:
        print(f"  {n:2d} at once: evaluate {_parallel(n, prefill, target, candidate, cost)}")
    return 0


def _evaluate_once(prefill, target, candidate, cost, out) -> None:
    began = time.perf_counter()
    evaluate(prefill, target, candidate, lambda: math.inf, cost=cost)
    out.send(time.perf_counter() - began)


def _parallel(n: int, prefill, target, candidate, cost) -> str:
    context = multiprocessing.get_context("fork")
    pipes, children = [], []
    for _ in range(n):
        mine, theirs = context.Pipe(duplex=False)
        child = context.Process(target=_evaluate_once, args=(prefill, target, candidate, cost, theirs))
        child.start()
        pipes.append(mine)
        children.append(child)
    seconds = sorted(pipe.recv() for pipe in pipes)
    for child in children:
        child.join()
    return f"median {statistics.median(seconds):.3f} s, slowest {seconds[-1]:.3f} s"


if __name__ == "__main__":
    sys.exit(main())

"""IR benchmark: build, convert, verify, print and parse (text), and dump and load (JSON) a large taskgraph.

Usage: `.venv/bin/python bench/bench_ir.py [--ops 10000 100000] [--seed 0]`. Prints a markdown table, one
row per size, seconds per stage. Graphs come from `random_taskgraph` (inputs, kernels, moves over 4 GPUs),
so the op count is a little above the requested number of tasks.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed

from xdsl.parser import Parser

from turnip_ir.convert import taskgraph_from_ir, taskgraph_to_ir
from turnip_ir.io import check_module, context, module_text, parse_json
from tools.random_graphs import random_taskgraph

STAGES = ("build", "JSON dump", "JSON load", "to IR", "verify", "print", "parse", "from IR")


def _timed(results: dict, stage: str, fn):
    gc.collect()  # start each stage without garbage left by the one before
    start = time.perf_counter()
    value = fn()
    results[stage] = time.perf_counter() - start
    return value


def measure(tasks: int, seed: int) -> tuple[int, dict]:
    results: dict[str, float] = {}
    graph = _timed(results, "build", lambda: random_taskgraph(seed, tasks=tasks, devices=4, sizes=(64, 128), window=32))
    # JSON first, while no IR is alive: the garbage collector's full passes grow with every live object.
    dumped = _timed(results, "JSON dump", lambda: json.dumps(graph.to_json()))
    loaded = _timed(results, "JSON load", lambda: parse_json(dumped))
    assert loaded.to_json() == graph.to_json(), "the JSON round trip lost something"
    del loaded
    module = _timed(results, "to IR", lambda: taskgraph_to_ir(graph))
    _timed(results, "verify", lambda: check_module(module))
    text = _timed(results, "print", lambda: module_text(module))
    del module
    parsed = _timed(results, "parse", lambda: Parser(context(), text).parse_module())
    back = _timed(results, "from IR", lambda: taskgraph_from_ir(parsed))
    assert back.to_json() == graph.to_json(), "the text round trip lost something"
    results["text MB"] = len(text) / 1e6
    results["JSON MB"] = len(dumped) / 1e6
    return len(graph), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, nargs="+", default=[10_000, 100_000], help="tasks per graph")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, {platform.processor() or 'cpu'}\n")
    print("| ops | " + " | ".join(f"{s} (s)" for s in STAGES) + " | parse ms/op | text MB | JSON MB |")
    print("|" + " --- |" * (len(STAGES) + 4))
    for tasks in args.ops:
        ops, results = measure(tasks, args.seed)
        cells = [f"{results[s]:.2f}" for s in STAGES]
        per_op = 1000 * results["parse"] / ops
        print(f"| {ops} | " + " | ".join(cells) + f" | {per_op:.2f} | {results['text MB']:.1f} | {results['JSON MB']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

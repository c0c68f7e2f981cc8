"""Size of the llama 7b prefill taskgraph and how long building and compiling it take.

    .venv/bin/python bench/bench_llama.py                      # T = 8k, 32k, 128k; budgets 4 and 16 GiB
    .venv/bin/python bench/bench_llama.py --tokens 8192 --budgets 2 --gpus 2 --placement heads
    .venv/bin/python bench/bench_llama.py --tokens 32768 --budgets 4 --gpus 2 --placement sequence layers heads

For each T: kernel tasks (attention tasks among them), total FLOPs (the kernel table's counts), the bytes
of the inputs (weights, embedded tokens, RoPE tables), of every kernel's output and of the moves between
GPUs (with --gpus > 1), the build time, and
per budget the compile time (`compile_taskgraph`, the default pipeline) with the offload and reload
traffic it planned. With several placements, one row per placement and T. One run each; the machine's
other load shows in the times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from passes.pipeline import compile_taskgraph  # noqa: E402
from turnip_ir.kernels import KERNELS  # noqa: E402
from frontend.workloads import llama  # noqa: E402

GIB = 1 << 30


def sizes(graph) -> tuple[int, int, float, int, int, int]:
    """Kernel tasks, attention tasks, FLOPs, input bytes, kernel output bytes and bytes moved between GPUs."""
    kernels = attention = flops = inputs = outputs = moved = 0
    for node in graph.nodes.values():
        if node.op == "input":
            inputs += node.nbytes
        elif node.op == "move":
            moved += node.nbytes
        else:
            kernels += 1
            attention += node.op == "attention"
            shapes = [graph[i].shape for i in node.inputs]
            flops += KERNELS[node.op].flops(shapes, node.shape, node.attrs)
            outputs += node.nbytes
    return kernels, attention, flops, inputs, outputs, moved


def row(tokens: int, budgets: list[int], gpus: int, placement: str, named: bool) -> str:
    began = time.perf_counter()
    built = llama.build_llama(llama.load_config("7b"), tokens, gpus=gpus, placement=placement)
    build = time.perf_counter() - began
    kernels, attention, flops, inputs, outputs, moved = sizes(built.graph)
    cells = [placement] if named else []
    cells += [f"{tokens // 1024}k", f"{-(-tokens // built.block)}", f"{kernels:,}", f"{attention:,}", f"{flops / 1e12:.1f}",
             f"{inputs / 1e9:.1f}", f"{outputs / 1e9:.1f}", f"{moved / 1e9:.1f}", f"{build:.2f}"]
    for budget in budgets:
        began = time.perf_counter()
        memgraph = compile_taskgraph(built.graph, budget * GIB)
        spent = time.perf_counter() - began
        moved = [sum(n.nbytes for n in memgraph.nodes if n.op == op) / 1e9 for op in ("offload", "reload")]
        cells.append(f"{spent:.1f} s ({moved[0]:.1f} / {moved[1]:.1f})")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 16], help="GiB per GPU")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--placement", nargs="+", default=["sequence"], choices=llama.PLACEMENTS)
    args = parser.parse_args()
    named = len(args.placement) > 1
    compiled = " | ".join(f"compile at {b} GiB (GB off / reloaded)" for b in args.budgets)
    print(f"| {'placement | ' if named else ''}T | blocks | kernel tasks | attention tasks | TFLOP | input GB | kernel output GB "
          f"| GB moved between GPUs | build s | {compiled} |")
    print("| " + " | ".join(["---"] * (9 + named + len(args.budgets))) + " |")
    for placement in args.placement:
        for tokens in args.tokens:
            print(row(tokens, args.budgets, args.gpus, placement, named), flush=True)


if __name__ == "__main__":
    main()

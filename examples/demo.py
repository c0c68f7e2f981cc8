"""The main job behind `make demo`: compile the seed's blocked matmul under a budget that forces offload, run it, draw it.

Steps, each printed as it happens:
1. load examples/blocked_matmul.json (a 256x256 matmul in 2x2 blocks over 3 GPUs, with GPU-to-GPU moves
   and a sum per output block) and pick a per-GPU budget of 1.5x the smallest that can work, well
   below what keeping everything resident takes, so partial products are offloaded and reloaded;
2. compile it with the `turnip-memgraph` pipeline and print the compile statistics;
3. execute it on the best available backend (cpu here; the cuda backend is the next milestone) with the
   nondeterministic policy, and check the outputs against a float64 numpy reference;
4. predict, with the `sim` backend's H200 cost model, a run too big for this machine: a 16-layer
   8192x32768 bf16 FFN stack (17 GB of weights) on one GPU with an 8 GiB budget, nondet against fixed;
5. write out/demo_memgraph.svg (or .dot when graphviz's `dot` is missing) and out/demo_trace.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.stats import CompileStats
from runtime import execute
from runtime.inputs import input_specs, make_inputs
from runtime.reference import evaluate
from turnip_ir.dot import have_dot, render
from turnip_ir.io import load_taskgraph
from turnip_ir.models import ffn_stack

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    graph = load_taskgraph(ROOT / "examples" / "blocked_matmul.json")
    resident = sum(node.nbytes for node in graph.nodes.values())
    budget = int(1.5 * minimum_budget(graph)) // 256 * 256
    print(f"taskgraph: {len(graph)} tasks on {graph.devices} GPUs, {resident} bytes in all; budget {budget} bytes per GPU")

    stats = CompileStats()
    memgraph = compile_taskgraph(graph, budget, stats=stats)
    print(stats.table())
    offloads, reloads = memgraph.count("offload"), memgraph.count("reload")
    assert offloads > 0, "the demo budget should force offloads"

    inputs = make_inputs(input_specs(memgraph), None, seed=0)
    result = execute(memgraph, backend="cpu", order="nondet", inputs=inputs)
    result.recorder.write_trace(str(OUT / "demo_trace.json"))
    print("\n".join(result.summary.lines()))
    expected = evaluate(graph, inputs)
    worst = max(float(np.max(np.abs(result.outputs[k] - expected[k])) / np.max(np.abs(expected[k]))) for k in expected)
    print(f"outputs vs the float64 reference: max relative error {worst:.1e} over {len(expected)} output(s)")

    big = compile_taskgraph(ffn_stack(16, 2048, 8192, 32768, devices=1, dtype="bfloat16"), 8 << 30)
    spans = {order: execute(big, backend="sim", order=order, seed=0, jitter=0.3).summary.makespan for order in ("nondet", "fixed")}
    print(
        f"sim, H200 cost model, FFN 16x8192x32768 bf16 at 8 GiB ({big.count('reload')} reloads, 30% jitter): "
        f"fixed {spans['fixed'] * 1e3:.1f} ms, nondet {spans['nondet'] * 1e3:.1f} ms ({spans['fixed'] / spans['nondet']:.2f}x)"
    )

    picture = OUT / ("demo_memgraph.svg" if have_dot() else "demo_memgraph.dot")
    render(memgraph, str(picture))
    print(f"{offloads} offloads, {reloads} reloads; picture: {picture.relative_to(ROOT)}; trace: out/demo_trace.json")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())

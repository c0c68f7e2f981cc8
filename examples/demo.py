"""The main job behind `make demo`: a tiny LLaMA prefill compiled under a budget that forces offload, run, checked, drawn.

Steps, each printed as it happens:
1. build the `tiny` LLaMA (2 layers, hidden 64, 4 heads, GQA off) prefill of 128 tokens in 4 blocks of 32,
   with random weights and token ids from seed 0: RMSNorm, q/k/v, RoPE, blocked causal attention
   chains, o projection, SwiGLU FFN, residuals and the final norm, as one taskgraph;
2. compile it with the `turnip-memgraph` pipeline at a per-GPU budget of 1.5x the smallest that can
   work, far below what keeping everything resident takes, and print the compile statistics and what
   was offloaded and why (turnip_ir/explain.py, as `turnip explain` prints it);
3. run it on the best available backend with the nondeterministic policy and compare the hidden
   states with a float64 numpy LLaMA written from Hugging Face's `LlamaModel`;
4. predict, with the `sim` backend's H200 cost model, the 7B prefill of 8192 tokens at 4 GiB;
5. write out/demo_memgraph.svg (or .dot when graphviz's `dot` is missing) and out/demo_trace.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.compile_stats import CompileStats
from runtime import execute
from turnip_ir.dot import have_dot, render
from turnip_ir.explain import explain_offloads
from frontend.workloads import llama

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    config = llama.load_config("tiny")
    built = llama.build_llama(config, tokens=128)
    weights, ids = llama.RandomWeights(config, seed=0), llama.random_ids(config, 128, seed=0)
    resident = sum(node.nbytes for node in built.graph.nodes.values())
    budget = int(1.5 * minimum_budget(built.graph)) // 256 * 256
    print(f"tiny LLaMA prefill: {len(built.graph)} tasks, {resident} bytes if all resident; budget {budget} bytes")

    stats = CompileStats()
    memgraph = compile_taskgraph(built.graph, budget, stats=stats)
    print(stats.table())
    offloads, reloads = memgraph.count("offload"), memgraph.count("reload")
    assert offloads > 0, "the demo budget should force offloads"
    report = explain_offloads(memgraph)  # what was offloaded and why (`turnip explain` prints the same)
    print("\n".join(report.summary_lines(top=3)))
    print("\n".join(report.line(r) for r in [r for r in report.reloads if r.offload is not None][:2]))

    # auto: the cuda backend on a GPU machine (the budget above is its arena; its workspace comes on top)
    result = execute(memgraph, backend="auto", order="nondet", inputs=built.feed(weights, ids))
    result.recorder.write_trace(str(OUT / "demo_trace.json"))
    print("\n".join(result.summary.lines()))
    expected = llama.float64_forward(config, weights, ids)
    worst = float(np.max(np.abs(built.gather(result.outputs) - expected)) / np.max(np.abs(expected)))
    print(f"hidden states vs the float64 reference LLaMA: max relative error {worst:.1e}")

    big = llama.build_llama(llama.load_config("7b"), tokens=8192)
    planned = compile_taskgraph(big.graph, 4 << 30)
    spans = {order: execute(planned, backend="sim", order=order).summary.makespan for order in ("nondet", "fixed")}
    print(f"sim, H200 cost model, LLaMA 7b prefill of 8192 tokens at 4 GiB ({len(big.graph)} tasks, "
          f"{planned.count('reload')} reloads): nondet {spans['nondet']:.3f} s, fixed {spans['fixed']:.3f} s")

    picture = OUT / ("demo_memgraph.svg" if have_dot() else "demo_memgraph.dot")
    render(memgraph, str(picture))
    print(f"{offloads} offloads, {reloads} reloads; picture: {picture.relative_to(ROOT)}; trace: out/demo_trace.json")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())

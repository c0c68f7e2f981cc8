"""The cost model's kernel times against a traced llama run's, kernel class by kernel class (issue 26: the sim
within 5% of every point).

The plan is compiled again on the CPU as bench/run.py compiled it (link_gaps.py's way: the same build,
arena and `--inputs`), so each trace event's `node` names its memgraph vertex, and `CostModel().kernel_time`
prices it as the sim does. Kernels are grouped by class: einsum by its operand shapes' kind, attention as
full blocks, causal (diagonal) blocks and final blocks (which also merge the partial), the rest by kernel
name. A kernel that ran while another compute kernel ran shares the GPU, so its duration says little of
its rate: each class counts its kernels that ran alone (`alone`), and all of them (`all`). A trace of the
fixed order (bench/run.py --traces writes `-fixed`) runs most kernels alone.

    python3 bench/investigations/kernel_rates.py TRACE-fixed.json --tokens 32768 --layer-order halves --arena-mib 7936

Prints per class: how many kernels (alone / all), measured and modelled milliseconds of the alone ones,
their ratio, and the same for all; then the compute span (the union of kernel times) against the sum of
the model's times.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fit_cost import add_trace_arguments, traced_plan  # noqa: E402
from runtime.summary import union_length  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402


def kernel_class(node, inputs) -> str:
    """A kernel's class: attention by block kind, einsum by its operands' shapes, else its kernel name."""
    if node.kernel == "attention":
        if node.attrs.get("causal", False):
            return "attention causal" + (" final" if node.attrs.get("final", True) else "")
        return "attention full" + (" final" if node.attrs.get("final", True) else "")
    if node.kernel == "einsum":
        return "einsum " + " x ".join("x".join(map(str, i.shape)) for i in inputs)
    return node.kernel


def alone_flags(events: list[dict]) -> list[bool]:
    """For each compute event (sorted by start), whether no other compute event on its GPU overlapped it."""
    flags = [True] * len(events)
    by_gpu = collections.defaultdict(list)
    for index, event in enumerate(events):
        by_gpu[event["pid"]].append(index)
    for indices in by_gpu.values():
        indices.sort(key=lambda i: events[i]["ts"])
        reach, holder = float("-inf"), -1  # the latest end so far, and whose
        for i in indices:
            start, end = events[i]["ts"], events[i]["ts"] + events[i]["dur"]
            if start < reach:
                flags[i] = False
                flags[holder] = False
            if end > reach:
                reach, holder = end, i
    return flags


def kernel_rates(events: list[dict], nodes, cost: CostModel) -> dict[str, dict[str, float]]:
    """Per class: count and measured / modelled microseconds, of the kernels that ran alone and of all."""
    kernels = [e for e in events if e["cat"] == "kernel"]
    flags = alone_flags(kernels)
    table: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for event, alone in zip(kernels, flags):
        node = nodes[event["args"]["node"]]
        inputs = [nodes[i] for i in node.inputs]
        row = table[kernel_class(node, inputs)]
        model = cost.kernel_time(node, inputs) * 1e6
        for part in ("all", "alone") if alone else ("all",):
            row[f"{part}_n"] += 1
            row[f"{part}_us"] += event["dur"]
            row[f"{part}_model_us"] += model
    return {name: dict(row) for name, row in table.items()}


def implied_rates(events: list[dict], nodes, cost: CostModel) -> dict[str, tuple[int, float]]:
    """What the kernels that ran alone imply, with `cost.launch` taken off each: the FLOP/s of full and of
    causal fp16 attention blocks (causal at half a block's FLOPs, as the model counts them), and each
    memory-bound kernel's bytes per second as a share of `cost.hbm_bw`; name -> (kernels, figure)."""
    from turnip_ir.kernels import KERNELS

    kernels = [e for e in events if e["cat"] == "kernel"]
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])  # kernels, work, seconds
    for event, alone in zip(kernels, alone_flags(kernels)):
        node = nodes[event["args"]["node"]]
        if not alone or node.kernel in ("einsum", "matmul"):
            continue
        inputs = [nodes[i] for i in node.inputs]
        seconds = max(event["dur"] * 1e-6 - cost.launch, 1e-9)
        if node.kernel == "attention":
            name = "causal_attention_flops" if node.attrs.get("causal", False) else "attention_flops"
            work = KERNELS[node.kernel].flops([tuple(i.shape) for i in inputs], tuple(node.shape), node.attrs)
        else:
            name, work = f"memory_efficiency {node.kernel}", (node.nbytes + sum(i.nbytes for i in inputs)) / cost.hbm_bw
        row = sums[name]
        row[0] += 1
        row[1] += work
        row[2] += seconds
    return {name: (int(n), work / seconds) for name, (n, work, seconds) in sums.items()}


def span_us(events: list[dict]) -> float:
    """The union of the compute events' times, microseconds."""
    return union_length([(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_arguments(parser)
    args = parser.parse_args(argv)
    memgraph = traced_plan(args)
    events = [e for e in json.loads(Path(args.trace).read_text())["traceEvents"] if e.get("ph") == "X"]
    cost = CostModel()
    table = kernel_rates(events, memgraph.nodes, cost)
    print("| class | alone / all | alone ms | model ms | measured / model | all ms | model ms | measured / model |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, row in sorted(table.items(), key=lambda item: -item[1]["all_us"]):
        alone = row.get("alone_n", 0)
        ratio = f"{row['alone_us'] / row['alone_model_us']:.3f}" if alone else ""
        print(f"| {name} | {alone:.0f} / {row['all_n']:.0f} | {row.get('alone_us', 0) / 1e3:.2f} | {row.get('alone_model_us', 0) / 1e3:.2f} | "
              f"{ratio} | {row['all_us'] / 1e3:.2f} | {row['all_model_us'] / 1e3:.2f} | {row['all_us'] / row['all_model_us']:.3f} |")
    model = sum(row["all_model_us"] for row in table.values())
    print("\nimplied by the kernels that ran alone: " + "; ".join(f"{name} {figure:.4g} ({n} kernels)" for name, (n, figure)
                                                                    in sorted(implied_rates(events, memgraph.nodes, cost).items())))
    print(f"\ncompute span {span_us(events) / 1e3:.2f} ms; the model's kernel times summed {model / 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

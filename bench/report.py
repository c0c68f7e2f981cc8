"""Tables and plots for docs/benchmarks.md from the JSON that bench/run.py wrote on the GPU machine.

    .venv/bin/python bench/report.py docs/results/h200-llama-8k.json ... --plot docs/results/llama-time-vs-budget.png

Prints one markdown table of every run (time, ratios to the baselines and to the floor, peak memory,
bytes reloaded and their rate, agreement, what bound it) and draws time against budget per system.
The floor is max(FLOPs / GEMM peak, weight bytes / H2D rate), both ceilings measured in the run's call,
over g GPUs max(FLOPs / (g x GEMM peak), weight bytes / (g x H2D rate)): each GPU has its own host link.
With --gpus, a table of the several-GPU runs, each beside the single-GPU turnip run of its length in the
same files (speedup, busy per GPU, bytes moved, agreement with the single-GPU output).
With --where, a second table gives each turnip run's busy fractions, host time beyond the GPU span, bytes
reloaded against the plan's, what bound it, and the sim's prediction beside it.
Files without runs (the kernel and dispatch results in docs/results/) are skipped, so a glob may take them.
tools/bench_docs.py renders the current tables of docs/benchmarks.md with `load` and `table`.
A file named after its placement with a suffix (h200x2-llama-sequence-spread.json) labels its rows with
the suffix too ("sequence spread"), to tell calls of one placement apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

GIB = 1 << 30
MEASURED = {  # printed by bench/run.py's set-up line, for results written before it stored them
    ("llama", 8192): (123.7e12, 12.06 * GIB), ("llama", 32768): (706.0e12, 12.06 * GIB), ("llama", 131072): (6201.8e12, 12.06 * GIB),
    ("ffn", 2048): (35.2e12, 16.0 * GIB), ("ffn", 8192): (140.8e12, 16.0 * GIB),
}


def floor_seconds(flops: float, weight_bytes: float, ceilings: dict, gpus: int = 1) -> float:
    """The physical floor of a run (bench/run.py records it, this report divides by it): every weight
    crosses a host link once and every FLOP runs at the GEMM peak, each GPU with its own of both."""
    return max(flops / (gpus * ceilings["gemm"]), weight_bytes / (gpus * ceilings["h2d"]))


def load(paths):
    runs = []
    for path in paths:
        doc = json.load(open(path))
        if not isinstance(doc.get("runs"), list):
            continue  # not bench/run.py's (bench_coldstart.py keeps its runs by name)
        known = doc.get("workloads", {})
        words = doc.get("command", "").split()
        placement = words[words.index("--placement") + 1] if "--placement" in words else "sequence"
        stem = Path(path).stem
        if f"-{placement}-" in stem:
            placement += " " + stem.split(f"-{placement}-", 1)[1].replace("-", " ")
        for run in doc["runs"]:
            run["placement"] = placement if run.get("gpus", 1) > 1 else ""
            provider = run.get("attention", "auto")
            run["label"] = run["system"] if provider in ("auto", "torch-cudnn") else f"{run['system']} ({provider} attention)"
            if run["system"].startswith("turnip"):
                run.setdefault("notifier", "hostfunc")  # runs before bench/run.py recorded it used the in-stream host function
            if run.get("agreement") == 0.0 and run["system"] == "turnip-nondet":
                run.pop("agreement")  # it was its own reference (no torch system in that run)
            flops, weights = MEASURED.get((run["workload"], run["tokens"]), (0, 0))
            if str(run["tokens"]) in known:
                flops, weights = known[str(run["tokens"])]["flops"], known[str(run["tokens"])]["weight_bytes"]
            run["floor"] = floor_seconds(flops, weights, doc["ceilings"], run.get("gpus", 1))
            run["source"] = path
            runs.append(run)
    return [r for r in runs if r["system"] != "floor"]


def table(runs) -> str:
    by_key = defaultdict(dict)
    for r in runs:
        by_key[(r["workload"], r["tokens"])][(r["system"], r["budget"])] = r
    lines = ["| workload | T | budget GiB | GPUs | system | notifier | seconds | x floor | vs torch-prefetch | vs hf-offload | peak GiB | reloaded GiB | H2D GB/s | agrees | bound by |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: (r["workload"], r["tokens"], r.get("gpus", 1), r["placement"], r["budget"] or 0, r["label"], r.get("notifier", ""))):
        group = by_key[(r["workload"], r["tokens"])]
        seconds = r.get("seconds")
        prefetch = [g["seconds"] for (s, b), g in group.items() if s == "torch-prefetch" and g.get("seconds")]
        hf = [g["seconds"] for (s, b), g in group.items() if s == "hf-offload" and g.get("seconds")]
        cell = lambda x, f: f.format(x) if isinstance(x, (int, float)) and x is not False else ""  # noqa: E731
        lines.append("| " + " | ".join([
            r["workload"], str(r["tokens"]), cell(r["budget"], "{:g}") or "none", f"{r.get('gpus', 1)} {r['placement']}".strip(), r["label"], r.get("notifier", ""),
            cell(seconds, "{:.3f}") or r.get("error", "")[:40], cell(seconds and seconds / r["floor"], "{:.2f}"),
            cell(seconds and prefetch and seconds / min(prefetch), "{:.2f}"), cell(seconds and hf and r["system"] != "hf-offload" and min(hf) / seconds, "{:.1f}x faster"),
            cell(r.get("peak") and r["peak"] / GIB, "{:.2f}"), cell(r.get("reloaded") and r["reloaded"] / GIB, "{:.2f}"),
            cell(r.get("h2d_rate") and r["h2d_rate"] / 1e9, "{:.1f}"), cell(r.get("agreement"), "{:.0e}"), r.get("bound", "").split(" (")[0],
        ]) + " |")
    return "\n".join(lines)


def plot(runs, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = sorted({r["tokens"] for r in runs if r["workload"] == "llama" and r.get("gpus", 1) == 1})
    figure, axes = plt.subplots(1, len(tokens), figsize=(5 * len(tokens), 4))
    for ax, t in zip(figure.axes, tokens):
        for system, marker in (("turnip-nondet", "o-"), ("turnip-fixed", "s--"), ("torch-prefetch", "^-"), ("hf-offload", "x-")):
            by_budget = defaultdict(list)  # several calls may have run one point: their median
            for r in runs:
                if r["workload"] == "llama" and r["tokens"] == t and r["label"] == system and r.get("seconds") and r["budget"] and r.get("gpus", 1) == 1:
                    by_budget[r["budget"]].append(r["seconds"])
            points = sorted((budget, statistics.median(times)) for budget, times in by_budget.items())
            if points:
                ax.plot(*zip(*points), marker, label=system)
        resident = [r["seconds"] for r in runs if r["tokens"] == t and r["system"] == "torch-resident" and r.get("seconds")]
        if resident:
            ax.axhline(resident[0], color="grey", linestyle=":", label="torch-resident (no cap)")
        floors = [r["floor"] for r in runs if r["tokens"] == t and r["workload"] == "llama"]
        ax.axhline(max(floors), color="black", linewidth=0.8, label="floor")
        ax.set_title(f"llama 7b prefill, T = {t}")
        ax.set_xlabel("GPU memory budget (GiB)")
        ax.set_ylabel("seconds")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def where(runs) -> str:
    """Per turnip run: what bound it (bench/run.py's `bound_by` line: busy fractions and the loop's wall
    time against the GPU span), bytes reloaded against the plan's, and the sim's prediction beside it."""
    lines = ["| workload | T | budget GiB | system | notifier | seconds | sim s | sim / measured | compute / H2D / D2H busy | host beyond GPU span s | reloaded / planned GiB | offloaded GiB | bound by |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: (r["workload"], r["tokens"], r.get("gpus", 1), r["budget"] or 0, r["label"], r.get("notifier", ""), r.get("seconds") or 0)):
        if not r["system"].startswith("turnip") or not r.get("seconds"):
            continue
        bound = r.get("bound", "")
        if "engine_busy" in r:  # bench/run.py stores the fractions; older JSON has them only in its `bound` line
            busy = " / ".join(f"{r['engine_busy'][kind]:.0%}" for kind in ("compute", "h2d", "d2h"))
        else:
            busy = bound.split("(", 1)[1].split(" busy")[0].replace("compute ", "").replace(", H2D ", " / ").replace(", D2H ", " / ") if "(" in bound else ""
        lines.append("| " + " | ".join([
            r["workload"], str(r["tokens"]), f"{r['budget']:g}", r["label"], r.get("notifier", ""), f"{r['seconds']:.3f}", f"{r['sim']:.3f}" if r.get("sim") else "",
            f"{r['sim'] / r['seconds']:.2f}" if r.get("sim") else "", busy, f"{max(0.0, r.get('wall', 0) - r['seconds']):.3f}",
            f"{r.get('reloaded', 0) / GIB:.2f} / {r.get('planned_reload', 0) / GIB:.2f}", f"{r.get('offloaded', 0) / GIB:.2f}", bound.split(" (")[0],
        ]) + " |")
    return "\n".join(lines)


def gpus_table(runs) -> str:
    """The several-GPU turnip runs beside the single-GPU turnip run of the same length, budget and order
    among `runs` (one call's files, so both ran on the same machine): seconds, the sim's prediction,
    speedup, busy per GPU, bytes moved between GPUs and reloaded from the host, and agreement with the
    single-GPU turnip output (`agreement_saved`, bench/run.py --compare-outputs) and with torch-resident."""
    one = {(r["workload"], r["tokens"], r["budget"], r["system"]): r for r in runs
           if r["system"].startswith("turnip") and r.get("gpus", 1) == 1 and r.get("seconds")}
    lines = ["| T | GPUs | placement | order | seconds | sim s | measured / sim | 1 GPU s | speedup | busy per GPU | moved between GPUs GiB | reloaded from host GiB | vs 1-GPU turnip | vs torch-resident |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: (r["workload"], r["tokens"], r.get("gpus", 1), r["placement"], r["budget"] or 0, r["system"])):
        if not r["system"].startswith("turnip") or not r.get("seconds"):
            continue
        base = one.get((r["workload"], r["tokens"], r["budget"], r["system"]))
        single = r.get("gpus", 1) == 1
        lines.append("| " + " | ".join([
            str(r["tokens"]), str(r.get("gpus", 1)), r["placement"] or "-", r["system"].removeprefix("turnip-"), f"{r['seconds']:.3f}",
            f"{r['sim']:.3f}" if r.get("sim") else "", f"{r['seconds'] / r['sim']:.2f}" if r.get("sim") else "",
            f"{base['seconds']:.3f}" if base else "", f"{base['seconds'] / r['seconds']:.2f}" if base and not single else "",
            ", ".join(f"{b:.0%}" for b in r.get("busy") or []), f"{r.get('moved', 0) / GIB:.1f}", f"{r.get('reloaded', 0) / GIB:.1f}",
            f"{r['agreement_saved']:.1e}" if "agreement_saved" in r else "", f"{r['agreement']:.1e}" if "agreement" in r else "",
        ]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+")
    parser.add_argument("--plot")
    parser.add_argument("--where", action="store_true", help="also the where-the-time-goes table of the turnip runs, with the sim beside each")
    parser.add_argument("--gpus", action="store_true", help="also the several-GPU table: each turnip run against the 1-GPU run of its length in the same files")
    args = parser.parse_args()
    runs = load(args.results)
    print(table(runs))
    if args.where:
        print()
        print(where(runs))
    if args.gpus:
        print()
        print(gpus_table(runs))
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()

"""How much of the cost model's kernel work a traced llama run did per second of GPU busy time, split by
how many kernels ran at once: the check behind `CostModel.overlap_efficiency`.

The plan is compiled again on the CPU exactly as bench/run.py compiled it (same build, arena and `--inputs`), so each trace event's `node` names its memgraph vertex and the model's time for it. Each
kernel is taken to progress evenly over its span; that is not so inside an interval (a kernel launched
beside another waits for SMs within its span), so only the totals are meaningful: the model-seconds of
work over the busy seconds, in all and per count of kernels at once.

    python3 bench/investigations/overlap_trace.py TRACE.json --tokens 32768 --layer-order halves --arena-mib 7997 --inputs host
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.fit_cost import add_trace_arguments, traced_plan  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402


def work_rates(events, nodes, cost: CostModel) -> dict[int, tuple[float, float]]:
    """Kernels at once -> (busy seconds, model-seconds of work done in them)."""
    spans = []
    for event in events:
        node = nodes[event["args"]["node"]]
        work = cost.kernel_time(node, [nodes[i] for i in node.inputs]) * 1e6
        spans.append((event["ts"], event["ts"] + event["dur"], work / max(event["dur"], 1e-9)))
    starts, ends = collections.defaultdict(list), collections.defaultdict(list)
    for i, (start, end, _) in enumerate(spans):
        starts[start].append(i)
        ends[end].append(i)
    totals: dict[int, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    active: set[int] = set()
    previous = None
    for t in sorted(set(starts) | set(ends)):
        if previous is not None and active:
            totals[len(active)][0] += (t - previous) * 1e-6
            totals[len(active)][1] += (t - previous) * 1e-6 * sum(spans[i][2] for i in active)
        active -= set(ends[t])
        active |= set(starts[t])
        previous = t
    return {k: (busy, work) for k, (busy, work) in sorted(totals.items())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_arguments(parser)
    args = parser.parse_args(argv)
    memgraph = traced_plan(args)
    events = [e for e in json.loads(Path(args.trace).read_text())["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    totals = work_rates(events, memgraph.nodes, CostModel())
    busy = sum(b for b, _ in totals.values())
    for k, (seconds, work) in totals.items():
        print(f"{k} at once: {seconds * 1e3:.1f} ms busy ({seconds / busy:.0%}), {work / seconds:.3f} model-seconds of work per second")
    print(f"in all: {busy * 1e3:.1f} ms busy, {sum(w for _, w in totals.values()) / busy:.3f} model-seconds of work per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why the host link idles in a traced llama run: each gap on a GPU's H2D lane, charged to what held the
next copy back (issue 26, "start streaming at once").

The plan is compiled again on the CPU as bench/run.py compiled it (the same build, arena and `--inputs`),
so each trace event's `node` names its memgraph vertex and so its dependencies. For the copy after a
gap (from the end of the copy before, or the run's first event, to its start), the later of two times
held it back where either falls inside the gap:
- `dependencies`: the last of its dependencies (the kernels whose room it takes) ended inside the gap,
  after the loop submitted the copy (the loop queues a copy ahead of dependencies it has submitted);
- `host`: the loop submitted it inside the gap, after its dependencies ended;
- `device`: both were before the previous copy ended, and it still started late (the copy engine's
  own time between copies).
The trace's `submitted` times are the loop's (host) clock and its `ts` the device's, which start within
microseconds of each other on the cuda backend; gaps under `--least-us` are left out.

    python3 bench/investigations/link_gaps.py TRACE.json --tokens 8192 --arena-mib 1792 --inputs weights
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


def link_gaps(events: list[dict], nodes, least_us: float = 5.0) -> tuple[dict[str, float], list[dict]]:
    """(microseconds of H2D gaps by cause, one row per gap) for the `X` events of a trace."""
    ends = {e["args"]["node"]: e["ts"] + e["dur"] for e in events}
    copies = sorted((e for e in events if e["cat"] == "reload"), key=lambda e: (e["pid"], e["ts"]))
    totals: dict[str, float] = collections.defaultdict(float)
    rows = []
    previous: dict[int, float] = {}
    began = min((e["ts"] for e in events), default=0.0)  # the run's start (the clock's origin is earlier)
    for event in copies:
        node = nodes[event["args"]["node"]]
        before = previous.get(event["pid"], began)
        gap = event["ts"] - before
        previous[event["pid"]] = event["ts"] + event["dur"]
        if gap < least_us:
            continue
        ready = max((ends.get(d, began) for d in (*node.inputs, *node.mem_deps)), default=began)
        submitted = event["args"].get("submitted", event["ts"])
        if max(ready, submitted) <= before:
            cause = "device"
        else:  # the later of the two held it back (the loop may submit a copy before its dependencies end)
            cause = "dependencies" if ready >= submitted else "host"
        totals[cause] += gap
        rows.append({"task": node.task, "gap_us": gap, "cause": cause, "ready_after_us": ready - before,
                     "submitted_after_us": submitted - before})
    return dict(totals), rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_arguments(parser)
    parser.add_argument("--least-us", type=float, default=5.0, help="gaps shorter than this are left out")
    parser.add_argument("--rows", type=int, default=10, help="print the longest gaps")
    args = parser.parse_args(argv)
    memgraph = traced_plan(args)
    events = [e for e in json.loads(Path(args.trace).read_text())["traceEvents"] if e.get("ph") == "X"]
    totals, rows = link_gaps(events, memgraph.nodes, args.least_us)
    print(f"{len(rows)} gaps of at least {args.least_us:g} us, {sum(totals.values()) / 1e3:.3f} ms: "
          + ", ".join(f"{cause} {us / 1e3:.3f} ms" for cause, us in sorted(totals.items())))
    for row in sorted(rows, key=lambda r: -r["gap_us"])[: args.rows]:
        print(f"  {row['task']}: {row['gap_us']:.0f} us ({row['cause']}; dependencies done {row['ready_after_us']:+.0f} us, "
              f"submitted {row['submitted_after_us']:+.0f} us after the copy before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

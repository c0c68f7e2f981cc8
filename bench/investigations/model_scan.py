"""How many of bench/fit_cost.py's points the sim puts within 5% of their measured makespan, for cost models
that differ from today's defaults in the fields named on the command line (issue 26). The points are
compiled once, then simulated under each model; the points outside 5% are listed.

    .venv/bin/python bench/investigations/model_scan.py overlap_efficiency=1.0,1.015,1.03
    .venv/bin/python bench/investigations/model_scan.py attention_flops=488e12,500e12 overlap_efficiency=1.0

Each field takes a comma-separated list; every combination is a model (about a minute each on 2 cores,
after about two minutes of compiling).
"""

import itertools
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from turnip_ir.cost import CostModel  # noqa: E402


def compiled_points():
    """bench/fit_cost.py's points and a Simulator with every point's memgraph compiled (printing how long)."""
    import fit_cost

    points = fit_cost.measured_points(sorted(fit_cost.RESULTS.glob("*.json")))
    simulate = fit_cost.Simulator()
    began = time.perf_counter()
    for point in points:
        simulate.memgraph(point)
    print(f"{len(points)} points compiled in {time.perf_counter() - began:.0f} s", flush=True)
    return points, simulate


def report(label: str, points, errors: list[float]) -> None:
    """One model's line: within 5% at how many points, the worst, the mean per order; then the points outside."""
    mean = {order: sum(e for e, p in zip(errors, points) if p.order == order) / max(1, sum(p.order == order for p in points))
            for order in ("nondet", "fixed")}
    print(f"{label}: within 5% at {sum(abs(e) <= 0.05 for e in errors)} of {len(points)}, worst {max(map(abs, errors)):.1%}, "
          f"mean nondet {mean['nondet']:+.1%}, mean fixed {mean['fixed']:+.1%}", flush=True)
    print("  over 5%: " + "; ".join(f"{p.label} {e:+.1%}" for p, e in zip(points, errors) if abs(e) > 0.05), flush=True)


def main(argv=None) -> int:
    grid = {}
    for item in argv if argv is not None else sys.argv[1:]:
        name, _, values = item.partition("=")
        grid[name] = [float(v) for v in values.split(",")]
    points, simulate = compiled_points()
    for combination in itertools.product(*grid.values()):
        changes = dict(zip(grid, combination))
        cost = replace(CostModel(), **changes)
        report(", ".join(f"{k}={v:g}" for k, v in changes.items()) or "the defaults", points,
               [simulate(p, cost) / p.measured - 1 for p in points])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fit the sim's cost model to the H200: measured rates first, then the few figures only makespans show.

    .venv/bin/python bench/fit_cost.py                  # the fit, and the table of every point before and after
    .venv/bin/python bench/fit_cost.py --no-fit         # the table for the current defaults, fitting nothing

"Before" is the model of 2026-12-01 (`PREVIOUS`) on the sim as it was then, a plain event loop; "after"
is the fitted model (or the defaults, with --no-fit) on today's sim, which queues ahead and charges the
host (runtime/backends/sim.py).
    .venv/bin/python bench/fit_cost.py --json out.json  # every figure, for the log

Points. Every turnip run of bench/run.py in docs/results/ on one GPU with the current runtime (the
`hostfunc-side` notifier, torch-cudnn attention, the default copy depth) is a point: workload, dtype,
tokens, budget, order and schedule. A point measured in several calls counts once, at the median of
its calls. Runs of the earlier runtime (the in-stream notifier, before the merge rework) are tabled
apart, with the new model's prediction, and not fitted: their time includes costs the code no longer has.
So are runs on a disturbed link (`disturbed_link`): their copies moved at least 10% slower than the H2D
ceiling measured in the same call while the copy engine was busy 90% of the run or more. The sim's link
runs at the ceiling, and another tenant's traffic is not the model's to predict; of 172 runs one qualifies
(the fixed order of 8k / 4 GiB on 2026-12-03d: 48.1 GB/s against 55.4, 99% busy; its nondet run in the
same process moved 54.9). So are runs with unsteady repeats (`unsteady_repeats`): the repeats of their one
plan spread by more than 7%, which on a quiet machine none did (five runs of two noisy machines qualify).
Each point's memgraph is compiled here as bench/run.py compiled it (at the arena its summary names, to
the MiB: the cuda reserve beside it has changed over time; weights in host memory, the same schedule)
and simulated with the same order and two streams.

Physical figures, from measured rates (not from makespans):
  h2d_bw, d2h_bw, duplex_bw  bench_cuda.py ceilings (pinned 1 GiB copies, one way and both ways)
  hbm_bw                     bench_cuda.py ceilings (device copy, bytes read + written)
  half_flops                 the FFN trace (trace-ffn-8192-8gib-h200.json): FLOPs of its GEMMs over the
                             time some compute stream ran one
  host_per_vertex            bench_cuda.py notifiers: the loop's seconds per vertex in the 100,000-vertex
                             stress test (nondet, hostfunc-side)
  notify_latency             the same section: a chain of tiny kernels, one at a time, less the loop's time
                             per vertex and the launch gap
  attention_flops, causal_attention_flops, triton_*, memory_efficiency
                             the kernels that ran alone in fixed-order traces of 7b at 8k, 32k and 128k
                             (bench/investigations/kernel_rates.py; 2026-12-03, seventh session)
Free parameters, fitted to the makespans (the worst relative error over the points, minimised by a
pattern search in log space): `launch` (a kernel's fixed cost, held at or above the 3 us gap the
lookahead section measured between kernels queued ahead), `host_per_attention` (the loop's extra time
per attention link, launched through torch: it shows only where links are short, as in 2048-token
blocks) and `overlap_efficiency` (what kernels running at once on two streams gain or lose against
each other; the fit holds it at most 1). `attention_flops` was fitted too until the traces gave it; the
defaults' `overlap_efficiency` (1.0) was chosen from four values by bench/investigations/model_scan.py,
not by this search, which takes hours on 2 cores. The points carry llama's block, layer order, query
group and where the inputs started (`--inputs`: every input in host memory, or only the weights) as
bench/run.py recorded them; runs whose weights started on the GPU (`--inputs gpu`) and disturbed runs
are left out; each point is simulated at its runs' compute-lane depth
(`queue_depth`: 2 before the seventh session of 2026-12-03, 3 since) and with the rope kernel of its
runs (`rope`: element by element before that session's last call, by quads since).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnip_ir.cost import CostModel  # noqa: E402

GIB = 1 << 30
RESULTS = ROOT / "docs" / "results"
PREVIOUS = CostModel(h2d_bw=55.3e9, d2h_bw=55.3e9, duplex_bw=93.4e9, peer_bw=360e9, hbm_bw=4187e9, fp32_flops=50.5e12,
                     half_flops=750e12, attention_flops=460e12, fp64_flops=0.8e12, launch=10e-6,
                     host_per_vertex=0.0, notify_latency=0.0)
"""The defaults before this fit (2026-12-01), which the sim ran as a plain event loop (`plain_loop`)."""
ELEMENT_ROPE_SHARE = 0.31
"""The share of HBM bandwidth rope reached element by element on llama's blocks (the fixed traces of the
seventh session of 2026-12-03; kernel_rates.py), before it ran by quads."""
FREE = ("launch", "host_per_attention", "overlap_efficiency")
"""The cost model's fields fitted to makespans; the others come from measured rates (`physical_rates`)."""


# ----- the measured points --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One benchmark point: what bench/run.py compiled and ran, and its measured makespan (median of calls)."""

    workload: str
    dtype: str
    tokens: int
    budget: float
    order: str
    schedule: str
    measured: float
    calls: tuple[float, ...]
    sources: tuple[str, ...]
    block: int | None = None
    """llama's build as bench/run.py recorded it (`workloads` of the file; None: the frontend's default,
    4096 recorded as None too, so a point does not split by whether its file recorded the block)."""
    layer_order: str = "blocks"
    query_group: int = 1
    arena: int | None = None
    """Bytes per GPU the measured runs planned tensors in (their summary's `per GPU arena`, to the MiB):
    the reserve beside the arena changed over time, so the sim plans each point at the arena it ran with;
    None: the arena bench/run.py would give it today."""
    inputs: str = "host"
    """Where the plan started its inputs (bench/run.py's --inputs): `host`, or `weights` (the activations
    on the GPU)."""
    queue_depth: int = 2
    """The compute lanes' depth the runs had (bench/run.py's `queue_depth`; runs before it was recorded were
    2 deep), which the sim runs the point at."""
    rope: str = "elements"
    """How the runs' rope kernel read its operands (bench/run.py's `rope`; runs before it was recorded read
    element by element): the sim prices an `elements` point's rope at ELEMENT_ROPE_SHARE of HBM."""

    @property
    def label(self) -> str:
        dtype = "" if self.dtype == "float16" else f" {self.dtype}"
        schedule = "" if self.schedule == "given" else f", schedule {self.schedule}"
        build = "" if self.block is None else f", block {self.block}"
        build += "" if self.layer_order == "blocks" else f", {self.layer_order}"
        build += "" if self.query_group == 1 else f", query group {self.query_group}"
        build += "" if self.arena is None else f", arena {self.arena / 2**20:.0f} MiB"
        build += "" if self.inputs == "host" else f", {self.inputs} from the host"
        build += "" if self.queue_depth == 2 else f", lanes {self.queue_depth} deep"
        build += "" if self.rope == "elements" else f", rope by {self.rope}"
        return f"{self.workload}{dtype} {self.tokens // 1024}k {self.budget:g} GiB {self.order}{schedule}{build}"


def current_runtime(run: dict) -> bool:
    """A run of today's runtime, disturbed or not: the side-stream notifier, cuDNN attention, the default
    copy depth, one GPU (its compute depth is part of its point)."""
    return (run.get("notifier") == "hostfunc-side" and run.get("attention", "auto") in ("auto", "torch-cudnn")
            and run.get("copy_depth", 4) == 4 and run.get("gpus", 1) == 1 and run.get("inputs", "host") in ("host", "weights"))


def current(run: dict) -> bool:
    """A run of today's runtime that was not disturbed (`disturbed`): a point."""
    return current_runtime(run) and not disturbed(run)


DISTURBED_RATE = 0.90
"""A run whose copies moved below this share of its call's H2D ceiling ..."""
DISTURBED_BUSY = 0.90
"""... while its H2D engine was busy at least this share of the run is on a disturbed link."""


def disturbed_link(run: dict) -> bool:
    """Whether another tenant (or a throttled link) slowed this run's copies: they moved at under
    DISTURBED_RATE of the H2D ceiling measured in the same call with the copy engine busy DISTURBED_BUSY or
    more (an engine that idles moves its copies at the ceiling or says nothing)."""
    ceiling, rate = run.get("h2d_ceiling"), run.get("h2d_rate")
    busy = (run.get("engine_busy") or {}).get("h2d", 0.0)
    return bool(ceiling and rate) and busy >= DISTURBED_BUSY and rate < DISTURBED_RATE * ceiling


UNSTEADY_SPREAD = 0.07
"""A run whose repeats of its one plan spread by more than this (slowest over fastest, less 1) has unsteady
repeats: of 88 runs of 3-5 repeats in docs/results the median spread was 1.2%, the 60 before the eighth
session of 2026-12-03 none over 5.6%; the five over 7% (8.7-16.2%) are 8k / 2 GiB runs of that session on
two noisy machines, where the GEMM and H2D ceilings measured between runs moved by 4% and 8%."""


def unsteady_repeats(run: dict) -> bool:
    """Whether the run's own repeats of one plan spread beyond UNSTEADY_SPREAD: something the sim does not
    model (the machine's other tenants, its clocks) moved its time."""
    times = run.get("makespans") or []
    return len(times) >= 3 and max(times) > (1 + UNSTEADY_SPREAD) * min(times)


def disturbed(run: dict) -> bool:
    """On a disturbed link (`disturbed_link`) or with unsteady repeats (`unsteady_repeats`)."""
    return disturbed_link(run) or unsteady_repeats(run)


def on_disturbed_machine(run: dict) -> bool:
    """A run of today's runtime that was disturbed (`disturbed`): tabled apart, not fitted."""
    return current_runtime(run) and disturbed(run)


def earlier_runtime(run: dict) -> bool:
    """A run of the second sitting of 2026-12-01 (h200-2026-12-01b-*), on one GPU with cuDNN attention:
    the kernels and the attention merge of today (earlier sittings had slower ones), the in-stream notifier."""
    return (not current_runtime(run) and "2026-12-01b-" in run["file"] and run.get("gpus", 1) == 1
            and run.get("attention", "auto") in ("auto", "torch-cudnn") and run.get("copy_depth", 4) == 4)


def measured_points(paths, keep=current) -> list[Point]:
    """The turnip runs of bench/run.py in `paths` that `keep` accepts, one Point per benchmark point."""
    calls: dict[tuple, list[tuple[float, str]]] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        ceiling = (doc.get("ceilings") or {}).get("h2d") if isinstance(doc, dict) else None  # the call's H2D ceiling
        for run in doc.get("runs", []) if isinstance(doc, dict) else []:
            if not isinstance(run, dict) or not run.get("system", "").startswith("turnip-") or not isinstance(run.get("seconds"), float):
                continue
            if not keep(dict(run, file=Path(path).name, h2d_ceiling=ceiling)):
                continue
            workload, _, dtype = run["workload"].partition("-")
            built = doc.get("workloads", {}).get(str(run["tokens"]), {})
            block = built.get("block") if workload == "llama" else None
            build = (None if block == 4096 else block, built.get("layer_order", "blocks"), built.get("query_group", 1), run_arena(run),
                     run.get("inputs", "host"), run.get("queue_depth", 2), run.get("rope", "elements"))
            key = (workload, dtype or "float16", run["tokens"], run["budget"], run["system"].removeprefix("turnip-"), run.get("schedule", "given"))
            calls.setdefault(key + build, []).append((run["seconds"], Path(path).name))
    points = []
    for key, found in sorted(calls.items(), key=lambda item: tuple(str(k) for k in item[0])):
        seconds = tuple(s for s, _ in found)
        points.append(Point(*key[:6], statistics.median(seconds), seconds, tuple(sorted({p for _, p in found})), *key[6:]))
    return points


ARENA_LINE = re.compile(r"per GPU arena ([\d.]+) (GiB|MiB|KiB)")


def run_arena(run: dict) -> int | None:
    """The arena a run's summary names, to the MiB (None where it names none)."""
    for line in run.get("lines", []):
        found = ARENA_LINE.search(line)
        if found:
            scale = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10}[found.group(2)]
            return round(float(found.group(1)) * scale / (1 << 20)) << 20
    return None


# ----- the physical figures -------------------------------------------------------------------------------
def physical_rates(results: Path = RESULTS) -> dict[str, float]:
    """The cost model's figures that measured rates give directly (module docstring), by field name."""
    ceilings = json.loads((results / "h200-2026-12-01c-notifier-latency.json").read_text())
    notifiers = ceilings["notifiers"]["hostfunc-side"]
    gap = launch_gap(results)
    top = ceilings["ceilings"]
    return {
        "h2d_bw": top["h2d"], "d2h_bw": top["d2h"], "duplex_bw": top["duplex"], "hbm_bw": top["hbm"],
        "half_flops": trace_gemm_rate(results / "trace-ffn-8192-8gib-h200.json"),
        "host_per_vertex": notifiers["nondet"],
        "notify_latency": max(0.0, notifiers["latency"] - notifiers["nondet"] - gap),
    }


def launch_gap(results: Path = RESULTS) -> float:
    """Seconds between two dependent GEMMs queued ahead on one stream (bench_cuda.py lookahead): the least
    a kernel can cost beside its work, and so the floor of the fitted `launch`."""
    return json.loads((results / "h200-cuda-2026-11-30.json").read_text())["lookahead"]["queued ahead (default)"]["gap"]


FFN_GEMM_FLOPS = 2 * 2048 * 8192 * 32768
"""Every GEMM of the traced FFN (bench/run.py's 16 x 8192x32768, blocks of 2048 tokens) does this many."""


def trace_gemm_rate(path: Path) -> float:
    """FLOP/s of the traced FFN's GEMMs: their FLOPs over the union of the times a GEMM ran (two streams
    share the GPU, so a kernel's own duration would halve the rate where two overlap)."""
    from runtime.summary import union_length

    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X" and e["name"].endswith(" einsum")]
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in events])
    return len(events) * FFN_GEMM_FLOPS / (busy * 1e-6)


# ----- the sim of a point ---------------------------------------------------------------------------------
class Simulator:
    """Each point's memgraph, compiled once as bench/run.py compiled it; its sim makespan under a cost model."""

    def __init__(self):
        self.memgraphs: dict[tuple, object] = {}

    def memgraph(self, point: Point):
        key = (point.workload, point.dtype, point.tokens, point.budget, point.schedule, point.block, point.layer_order, point.query_group,
               point.arena, point.inputs)
        if key not in self.memgraphs:
            self.memgraphs[key] = compile_point(point)
        return self.memgraphs[key]

    def __call__(self, point: Point, cost: CostModel) -> float:
        from runtime import execute
        from runtime.backends.sim import SimBackend

        if point.rope == "elements":  # the runtime of the run's day
            cost = replace(cost, memory_efficiency=tuple((k, ELEMENT_ROPE_SHARE if k == "rope" else v) for k, v in cost.memory_efficiency))
        backend = SimBackend(cost=cost, queue_depth=point.queue_depth)
        return execute(self.memgraph(point), backend=backend, order=point.order, cost=cost, verify=False).summary.makespan


def add_trace_arguments(parser) -> None:
    """The flags that name a traced 7b run's plan as bench/run.py built it (the investigations that read
    traces: link_gaps, kernel_rates, overlap_trace); `traced_plan` compiles it again from them."""
    parser.add_argument("trace")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--block", type=int)
    parser.add_argument("--layer-order", default="blocks")
    parser.add_argument("--query-group", type=int, default=1)
    parser.add_argument("--schedule", default="given")
    parser.add_argument("--inputs", default="weights", choices=("weights", "host"), help="bench/run.py's --inputs of the run")
    parser.add_argument("--arena-mib", type=int, required=True, help="the run's `per GPU arena` from its summary, in MiB")


def traced_plan(args):
    """The memgraph of the run `add_trace_arguments`' flags name, compiled as bench/run.py compiled it, so that
    each trace event's `node` is its vertex."""
    return compile_point(Point("llama", "float16", args.tokens, 0.0, "nondet", args.schedule, 1.0, (1.0,), (), args.block,
                               args.layer_order, args.query_group, args.arena_mib << 20, args.inputs))


def compile_point(point: Point):
    from passes.pipeline import compile_taskgraph
    from runtime.api import plan_within

    built = build_program(point.workload, point.dtype, point.tokens, point.block, point.layer_order, point.query_group)
    graph = built.graph if point.workload == "llama" else built.taskgraph()
    on_gpu = () if point.inputs == "host" else activation_ids(point.workload, built)
    compile_at = lambda arena: compile_taskgraph(graph, arena, point.schedule, inputs="host", start_on_gpu=on_gpu)  # noqa: E731
    if point.arena is not None:
        return compile_at(point.arena)
    return plan_within(graph, int(point.budget * GIB), compile_at, "cuda", attention="torch-cudnn")[0]


def build_taskgraph(workload: str, dtype: str, tokens: int, block: int | None = None, layer_order: str = "blocks",
                    query_group: int = 1):
    """bench/run.py's taskgraph of a workload, without its weights."""
    built = build_program(workload, dtype, tokens, block, layer_order, query_group)
    return built.graph if workload == "llama" else built.taskgraph()


def activation_ids(workload: str, built) -> set[str]:
    """The taskgraph ids of `build_program`'s inputs that are not weights (bench/run.py's `--inputs weights`
    starts them on the GPU)."""
    if workload == "ffn":
        from frontend.workloads import ffn

        return built.input_ids(ffn.ACTIVATIONS)
    return built.activation_ids


def build_program(workload: str, dtype: str, tokens: int, block: int | None = None, layer_order: str = "blocks",
                  query_group: int = 1):
    """bench/run.py's build of a workload: the FFN's `Program`, or llama's `LlamaGraph`."""
    if workload == "ffn":
        from frontend.workloads import ffn

        config = ffn.FfnConfig(layers=16, tokens=tokens, hidden=8192, ffn=32768, block=min(tokens, 2048), dtype=dtype)
        return ffn.build(config)
    from frontend.workloads import llama

    config = replace(llama.load_config("7b"), dtype=dtype)
    return llama.build_llama(config, tokens, block, gpus=1, placement="sequence", layer_order=layer_order,
                             query_group=query_group)


# ----- the fit --------------------------------------------------------------------------------------------
def worst_error(points, simulate, cost: CostModel) -> tuple[float, list[float]]:
    """The largest |sim / measured - 1| over `points`, and every point's sim makespan."""
    predicted = [simulate(p, cost) for p in points]
    return max(abs(s / p.measured - 1) for s, p in zip(predicted, points)), predicted


def fit(points, simulate, start: CostModel, free=FREE, step: float = 0.25, tolerance: float = 4e-3, log=None,
        floors: dict[str, float] | None = None, ceilings: dict[str, float] | None = None) -> CostModel:
    """The cost model from `start` whose `free` fields minimise the worst relative error over `points`.

    A pattern search in log space: try each field up and down by `step`, keep any move that lowers the
    worst error, halve the step when none does, stop below `tolerance`. A field never goes below its
    `floors` value (a physical lower bound) nor above its `ceilings` value. Deterministic; a field at zero
    starts from 1 us."""
    floors, ceilings = floors or {}, ceilings or {}
    values = {name: getattr(start, name) or 1e-6 for name in free}
    best, _ = worst_error(points, simulate, replace(start, **values))
    while step >= tolerance:
        moved = False
        for name in free:
            for sign in (1, -1):
                moved_to = max(values[name] * math.exp(sign * step), floors.get(name, 0.0))
                trial = dict(values, **{name: min(moved_to, ceilings.get(name, math.inf))})
                if trial == values:
                    continue
                error, _ = worst_error(points, simulate, replace(start, **trial))
                if error < best - 1e-9:
                    values, best, moved = trial, error, True
                    if log:
                        log(f"  worst {best:.4f} at " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
                    break
        if not moved:
            step /= 2
    return replace(start, **values)


# ----- the table ------------------------------------------------------------------------------------------
def table(points, before: list[float], after: list[float]) -> str:
    lines = ["| point | measured s (calls) | sim before s | error before | sim after s | error after |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p, b, a in zip(points, before, after):
        calls = "" if len(p.calls) == 1 else " (" + ", ".join(f"{c:.3f}" for c in p.calls) + ")"
        lines.append(f"| {p.label} | {p.measured:.3f}{calls} | {b:.3f} | {b / p.measured - 1:+.1%} | {a:.3f} | {a / p.measured - 1:+.1%} |")
    return "\n".join(lines)


def model_lines(cost: CostModel, old: CostModel) -> list[str]:
    return [f"  {f.name}: {getattr(old, f.name):.4g} -> {getattr(cost, f.name):.4g}" for f in fields(CostModel)
            if getattr(cost, f.name) != getattr(old, f.name)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-fit", action="store_true", help="table the points under the current defaults, fitting nothing")
    parser.add_argument("--ablate", action="store_true", help="also: the current defaults without the host's time, and as a plain loop")
    parser.add_argument("--json", help="write the points, the models and every prediction here")
    parser.add_argument("--tolerance", type=float, default=4e-3, help="the fit stops when its step (in log space) falls below this")
    args = parser.parse_args(argv)
    paths = sorted(RESULTS.glob("*.json"))
    points = measured_points(paths)
    earlier = measured_points(paths, keep=earlier_runtime)
    apart = measured_points(paths, keep=on_disturbed_machine)
    simulate = Simulator()
    before_sim = plain_loop(simulate)
    began = time.perf_counter()
    _, before = worst_error(points, before_sim, PREVIOUS)
    print(f"{len(points)} points, compiled and simulated in {time.perf_counter() - began:.0f} s", flush=True)
    cost = CostModel()
    if not args.no_fit:
        start = replace(cost, **physical_rates(), launch=launch_gap())  # launch from its floor: the first fit pushed it there
        print("physical:\n" + "\n".join(model_lines(start, PREVIOUS)), flush=True)
        cost = fit(points, simulate, start, floors={"launch": launch_gap()}, ceilings={"overlap_efficiency": 1.0}, tolerance=args.tolerance, log=lambda line: print(line, flush=True))
    print("the model against the previous one:\n" + "\n".join(model_lines(cost, PREVIOUS)), flush=True)
    worst, after = worst_error(points, simulate, cost)
    _, earlier_after = worst_error(earlier, simulate, cost) if earlier else (0, [])
    earlier_before = [before_sim(p, PREVIOUS) for p in earlier]
    print("\n" + table(points, before, after))
    print(f"\nworst error after: {worst:.1%}; before: {max(abs(b / p.measured - 1) for b, p in zip(before, points)):.1%}")
    if args.ablate:
        print("\n" + ablation(points, simulate, cost, after))
    if apart:
        print("\nOn a disturbed link or with unsteady repeats (`disturbed`; not fitted, not counted):\n")
        print(table(apart, [before_sim(p, PREVIOUS) for p in apart], worst_error(apart, simulate, cost)[1]))
    if earlier:
        print("\nEarlier runtime (the in-stream notifier, 2026-12-01b; not fitted):\n")
        print(table(earlier, earlier_before, earlier_after))
    if args.json:
        doc = {"points": [vars(p) | {"before": b, "after": a} for p, b, a in zip(points, before, after)],
               "earlier": [vars(p) | {"before": b, "after": a} for p, b, a in zip(earlier, earlier_before, earlier_after)],
               "before": vars(PREVIOUS), "after": vars(cost)}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


def ablation(points, simulate: Simulator, cost: CostModel, full: list[float]) -> str:
    """Each point's error under `cost` on the plain loop, queued ahead without the host's time, and in full."""
    gpu_only = replace(cost, host_per_vertex=0.0, notify_latency=0.0)
    plain = [plain_loop(simulate)(p, cost) for p in points]
    ahead = [simulate(p, gpu_only) for p in points]
    lines = ["| point | plain loop | queued ahead, no host time | queued ahead with host time |", "| --- | --- | --- | --- |"]
    for p, *runs in zip(points, plain, ahead, full):
        lines.append(f"| {p.label} | " + " | ".join(f"{r / p.measured - 1:+.1%}" for r in runs) + " |")
    worst = [max(abs(r / p.measured - 1) for r, p in zip(runs, points)) for runs in (plain, ahead, full)]
    return "\n".join(lines + ["| worst | " + " | ".join(f"{w:.1%}" for w in worst) + " |"])


def plain_loop(simulate: Simulator):
    """The sim before it modelled the host: no host time, no notice latency, one vertex per lane."""
    from runtime import execute
    from runtime.backends.sim import SimBackend

    def run(point: Point, cost: CostModel) -> float:
        cost = replace(cost, host_per_vertex=0.0, notify_latency=0.0)
        backend = SimBackend(cost=cost, lookahead=False)
        return execute(simulate.memgraph(point), backend=backend, order=point.order, cost=cost, verify=False).summary.makespan

    return run


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, KeyError, ValueError) as err:  # a results file missing or not as bench/run.py writes it
        sys.exit(f"fit_cost: cannot read the results in {RESULTS}: {type(err).__name__}: {err}")

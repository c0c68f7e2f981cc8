"""Nondet against fixed while another process copies over the same host link (issue 26).

    python3 bench/bench_interference.py --json out/interference.json                 # on a GPU machine
    python3 bench/bench_interference.py --backend sim --json /tmp/interference.json  # the same on the sim
    python3 bench/bench_interference.py --gpus 2 --placement sequence --points 32768@1GiB   # nvidia-h200-x2

A second process (this script with `--interferer`) copies pinned host memory to the same GPU in bursts
of random length and spacing, drawn from `--seed` (`bursts`): during a burst it queues `--chunk-mib`
copies back to back on its own stream, between bursts it sleeps. It measures its own bytes and busy
time and reports them when it stops. Meanwhile each point (`--points`, TOKENS@BUDGET) is compiled as
bench/run.py compiles the turnip systems (`run.compile_turnip`: the cuda arena, weights in host memory,
the activations on the GPU) and run by the cuda backend through `cuda_common.loops`, nondet and fixed
taking turns run by run (a warm-up of each, then `--repeats` of each), so the bursts fall on both orders
alike. Inputs are cheap tiled arrays (timing does not depend on their values).

`--backend sim` needs no GPU: the same bursts (one schedule per repeat, from the seed) become the sim
backend's `interference` windows, in which this run's copies get `--share` of the link and the other
process the rest; both orders of a repeat see the same bursts. It is the script's logic checked on a
CPU (tests/test_bench_interference.py) and the sim's prediction beside the measurement.

`--block`, `--layer-order`, `--query-group` and `--schedule` build and plan every point as bench/run.py's
flags of the same names do (the tight plans of docs/benchmarks.md: 32k at 1 GiB in `halves`), and
`--gpus N --placement P` spread llama over N GPUs as bench/run.py does (`sequence`, `layers`, `heads`).
`--interfere-on` names the GPUs whose links get an interferer (default GPU 0 only: on two GPUs, the one
that the other waits on); each GPU's process draws its own bursts (`burst_seed`).

Prints one row per point: the interferer's achieved rate (bytes over the run's span, and while it was
copying), the median makespan of each order, nondet's speed-up over fixed, and the bound: no order of
this memgraph can finish before max(compute, path, link). Compute is the busiest GPU's busy seconds;
path the memgraph's critical path (its data and memory edges), each vertex taking the least time it
took in the orders' last runs; link the bytes the plan reloads to one GPU (the most of any GPU) at the
H2D ceiling measured before the interferer starts (not less the interferer's rate: two processes'
copies together pass one copy's ceiling, so its bytes do not all come out of this run's share). Fixed
over the bound is the most any dispatch order could gain over fixed at that point. Last, nondet's median on a quiet link
(on the GPU, `--repeats` runs before the interferer starts): fixed under interference over it is the
speed-up nondet would show if the bursts cost it nothing. `--json` keeps every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from frontend.workloads.llama.graph import LAYER_ORDERS, PLACEMENTS  # noqa: E402
from turnip_cli.planning import SCHEDULE_CHOICES, parse_size  # noqa: E402
from turnip_ir.errors import BudgetError, InputError  # noqa: E402
from turnip_ir.files import atomic_write  # noqa: E402

ORDERS = ("nondet", "fixed")
MIB = 1 << 20
DEFAULT_BURST_MS = (2.0, 20.0)
DEFAULT_GAP_MS = (2.0, 40.0)


def bursts(seed: int, burst_ms: tuple[float, float], gap_ms: tuple[float, float]):
    """An endless seeded schedule of (start, end) seconds: each gap and each burst uniform in its range (ms)."""
    rng = random.Random(seed)
    clock = 0.0
    while True:
        clock += rng.uniform(*gap_ms) / 1e3
        length = rng.uniform(*burst_ms) / 1e3
        yield clock, clock + length
        clock += length


def bursts_until(seed: int, burst_ms, gap_ms, horizon: float) -> list[tuple[float, float]]:
    out = []
    for start, end in bursts(seed, burst_ms, gap_ms):
        if start >= horizon:
            return out
        out.append((start, end))


def burst_seed(seed: int, gpu: int) -> int:
    """The seed of GPU `gpu`'s interferer: GPU 0 keeps `seed` (one GPU's schedule is what it always was)."""
    return seed + 7919 * gpu


def point_of(text: str) -> tuple[int, int]:
    """'8192@2GiB' -> (8192, 2 GiB in bytes)."""
    tokens, _, budget = text.partition("@")
    if not tokens.isdigit() or not budget:
        raise InputError(f"point '{text}': expected TOKENS@BUDGET, e.g. 8192@2GiB")
    return int(tokens), parse_size(budget)


def built_llama(preset: str, tokens: int, block: int | None = None, layer_order: str = "blocks", query_group: int = 1,
                gpus: int = 1, placement: str = "sequence"):
    from frontend.workloads import llama

    return llama.build_llama(llama.load_config(preset), tokens, block, gpus=gpus, placement=placement, layer_order=layer_order,
                             query_group=query_group)


def reloaded_per_gpu(memgraph) -> list[int]:
    """The bytes the plan reloads to each GPU: each GPU has its own host link."""
    out = [0] * memgraph.devices
    for node in memgraph.nodes:
        if node.op == "reload":
            out[node.device] += node.nbytes
    return out


def bound(compute: float, path: float, reloaded: int, link: float, interferer: float) -> dict:
    """The least makespan any order could reach, the longest of: the busiest GPU's busy seconds; the
    memgraph's critical path; the bytes reloaded to one GPU (`reloaded`, the most of any) at the link's
    ceiling. Not less the interferer's rate: on the H200 two processes' copies together pass one copy's
    ceiling (2026-12-03: 50 + 10.5 GB/s against 55.4), so the interferer's bytes do not take their rate's
    worth of link from this run. `interferer` is kept in the figures."""
    link_s = reloaded / link
    return {"compute_s": compute, "path_s": path, "link_s": link_s, "seconds": max(compute, path, link_s), "link": link,
            "reloaded": reloaded, "interferer": interferer}


def run_figures(runs) -> dict:
    """What the bound reads of the orders' runs (each a (RunSummary, Recorder) pair): the busiest GPU's
    busy seconds (the summary's busy fraction of its makespan, the least over the runs) and the critical
    path, each vertex taking the least time it took in any of the runs (the same work in any order; a
    run's own bursts only lengthen its copies)."""
    graph = runs[0][1].graph
    least = [float("inf")] * len(graph)
    for _, recorder in runs:
        for c in recorder.completions:
            least[c.vertex] = min(least[c.vertex], c.end - c.start)
    longest = [0.0] * len(graph)
    for i in range(len(graph) - 1, -1, -1):
        own = least[i] if least[i] != float("inf") else 0.0  # inputs never run
        longest[i] = own + max((longest[d] for d in graph.dependents[i]), default=0.0)
    gpus = len(runs[0][0].busy)
    compute = max(min(summary.busy[gpu] * summary.makespan for summary, _ in runs) for gpu in range(gpus))
    return {"compute_s": compute, "path_s": max(longest, default=0.0)}


# ----- the sim -------------------------------------------------------------------------------------------
def sim_point(memgraph, args) -> dict:
    from runtime import execute
    from runtime.backends.sim import SimBackend
    from turnip_ir.cost import CostModel

    spans = {order: [] for order in ORDERS}
    rates, results = [], []
    link = CostModel().h2d_bw
    calm = {order: execute(memgraph, backend="sim", order=order, verify=False).summary.makespan for order in ORDERS}
    horizon = 2 * max(calm.values()) / args.share  # bursts slow the copies at most to `share` of their rate
    for repeat in range(args.repeats):
        windows = {gpu: bursts_until(burst_seed(args.seed * 1000 + repeat, gpu), args.burst_ms, args.gap_ms, horizon)
                   for gpu in args.interfere_on}
        for order in ORDERS:
            backend = SimBackend(interference=windows, share=args.share)
            results.append(execute(memgraph, backend=backend, order=order, verify=False))
            spans[order].append(results[-1].summary.makespan)
        span = max(spans[order][-1] for order in ORDERS)
        for bursts_of_gpu in windows.values():  # one interferer per GPU, as on the GPUs
            busy = sum(max(0.0, min(end, span) - start) for start, end in bursts_of_gpu if start < span)
            rates.append({"bytes": busy * link * (1 - args.share), "seconds": span, "busy_seconds": busy})
    return {"makespans": spans, "quiet": [calm["nondet"]], "interferer": rates, "link": link, "reloaded": max(reloaded_per_gpu(memgraph)),
            **run_figures([(result.summary, result.recorder) for result in results])}


# ----- the GPU -------------------------------------------------------------------------------------------
class Interferers:
    """One interfering process per GPU in `gpus` (this script with `--interferer`), each with its own
    bursts (`burst_seed`), as a context manager: `start()` inside it (when the runs are about to begin)
    returns once every process is ready to copy; leaving it stops them, and `figures` holds each one's
    bytes, busy seconds and seconds, or InputError names a GPU whose process left none. Leaving on an
    error stops whatever started and raises that error."""

    def __init__(self, gpus, seed: int, burst_ms, gap_ms, chunk_mib: int = 16, scratch: str = "/tmp"):
        stamp = time.time_ns()
        self.stats = {gpu: Path(scratch) / f"interferer-{stamp}-gpu{gpu}.json" for gpu in gpus}
        self.stop_file = Path(scratch) / f"interferer-{stamp}.stop"
        self.options = ["--chunk-mib", str(chunk_mib), "--burst-ms", *map(str, burst_ms), "--gap-ms", *map(str, gap_ms)]
        self.seed = seed
        self.children: list[subprocess.Popen] = []
        self.figures: list[dict] = []

    def __enter__(self) -> Interferers:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.figures = self._stop()
            return
        with contextlib.suppress(InputError):  # the error that ended the block is the one to report
            self._stop()

    def start(self) -> None:
        for gpu, path in self.stats.items():
            command = [sys.executable, __file__, "--interferer", "--device", str(gpu), "--seed", str(burst_seed(self.seed, gpu)),
                       "--stats", str(path), "--stop", str(self.stop_file), *self.options]
            self.children.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        for gpu, child in zip(self.stats, self.children):
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise InputError(f"the interfering process on GPU {gpu} did not start (it said {line.strip()!r}, exit {child.poll()})")

    def _stop(self) -> list[dict]:
        self.stop_file.touch()
        for child in self.children:
            child.wait(timeout=60)
        self.stop_file.unlink()
        figures = []
        for (gpu, path), child in zip(self.stats.items(), self.children):
            if not path.exists():
                raise InputError(f"the interfering process on GPU {gpu} left no figures (exit {child.returncode})")
            figures.append(json.loads(path.read_text()))
            path.unlink()
        return figures


def gpu_point(memgraph, args, attention: str = "auto") -> dict:
    """`attention`: the provider the plan's arena was sized for (`run.compile_turnip`'s choice)."""
    from cuda_common import h2d_ceiling, loops
    from runtime.backends.cuda import CudaBackend

    link = h2d_ceiling()
    with Interferers(args.interfere_on, args.seed, args.burst_ms, args.gap_ms, args.chunk_mib, args.scratch) as interferers:
        # they start once the plan is loaded: their figures cover the runs only
        runs = loops(memgraph, CudaBackend(attention_provider=attention), orders=ORDERS, repeats=args.repeats, alternate=True,
                     on_prepared=interferers.start, quiet=args.repeats)
    return {"makespans": {order: runs[order]["makespans"] for order in ORDERS}, "quiet": runs["quiet"], "interferer": interferers.figures,
            "link": link, "reloaded": max(reloaded_per_gpu(memgraph)),
            **run_figures([(runs[order]["summary"], runs[order]["recorder"]) for order in ORDERS])}


def interfere(args) -> int:
    """A second process: pinned H2D copies to GPU `--device` in seeded bursts until the stop file appears."""
    import torch

    chunk = args.chunk_mib * MIB
    torch.cuda.set_device(args.device)
    host = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(chunk, dtype=torch.uint8, device=f"cuda:{args.device}")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        device.copy_(host, non_blocking=True)
    stream.synchronize()
    print("ready", flush=True)
    stop = Path(args.stop)
    copied, busy = 0, 0.0
    origin = time.perf_counter()
    for start, end in bursts(args.seed, tuple(args.burst_ms), tuple(args.gap_ms)):
        while time.perf_counter() - origin < start and not stop.exists():
            time.sleep(min(1e-3, max(0.0, start - (time.perf_counter() - origin))))
        if stop.exists():
            break
        began = time.perf_counter()
        while time.perf_counter() - origin < end:
            with torch.cuda.stream(stream):
                device.copy_(host, non_blocking=True)
            stream.synchronize()
            copied += chunk
        busy += time.perf_counter() - began
    atomic_write(args.stats, json.dumps({"bytes": copied, "busy_seconds": busy, "seconds": time.perf_counter() - origin}))
    return 0


# ----- the table -----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", nargs="+", default=["8192@2GiB", "32768@1GiB"], help="TOKENS@BUDGET per GPU")
    parser.add_argument("--config", default="7b", help="llama preset (tiny: a smoke test)")
    parser.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each order per point (after one warm-up each on cuda)")
    parser.add_argument("--seed", type=int, default=0, help="the bursts' schedule")
    parser.add_argument("--burst-ms", type=float, nargs=2, default=list(DEFAULT_BURST_MS), metavar=("LO", "HI"), help="burst length, uniform (ms)")
    parser.add_argument("--gap-ms", type=float, nargs=2, default=list(DEFAULT_GAP_MS), metavar=("LO", "HI"), help="gap between bursts, uniform (ms)")
    parser.add_argument("--chunk-mib", type=int, default=16, help="the interferer's copy size")
    parser.add_argument("--share", type=float, default=0.5, help="sim: this run's share of the link during a burst")
    parser.add_argument("--scratch", default="/tmp", help="where the interferer writes its figures")
    parser.add_argument("--block", type=int, help="llama's tokens per block (default: the frontend's)")
    parser.add_argument("--layer-order", default=LAYER_ORDERS[0], choices=LAYER_ORDERS, help="llama's task order inside a layer")
    parser.add_argument("--query-group", type=int, default=1, help="llama's query group (token blocks run together)")
    parser.add_argument("--schedule", default="given", choices=SCHEDULE_CHOICES, help="the compiler's simulated schedule")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs llama is spread over (bench/run.py's --gpus)")
    parser.add_argument("--placement", default=PLACEMENTS[0], choices=PLACEMENTS, help="llama's placement over --gpus")
    parser.add_argument("--interfere-on", type=int, nargs="+", default=[0], metavar="GPU", help="the GPUs whose host links get an interferer")
    parser.add_argument("--json")
    parser.add_argument("--interferer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    parser.add_argument("--stop", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interferer:
        return interfere(args)
    try:
        points = [point_of(text) for text in args.points]
        if args.repeats < 1 or not all(0 <= lo <= hi for lo, hi in (args.burst_ms, args.gap_ms)) or args.gap_ms[1] <= 0:
            raise InputError("--repeats must be at least 1, and --burst-ms and --gap-ms ranges LO <= HI with some gap")
        if not 0 < args.share <= 1 or args.chunk_mib < 1:
            raise InputError("--share is this run's part of the link in (0, 1], --chunk-mib at least 1")
        if args.gpus < 1 or not all(0 <= gpu < args.gpus for gpu in args.interfere_on) or len(set(args.interfere_on)) < len(args.interfere_on):
            raise InputError(f"--interfere-on names distinct GPUs of the {args.gpus} of --gpus (0 to {args.gpus - 1}), got {args.interfere_on}")
    except InputError as err:
        print(f"bench_interference: error: {err}", file=sys.stderr)
        return 1
    import run
    from run import compile_turnip

    run.SCHEDULE = args.schedule

    report = {"command": " ".join(sys.argv), "backend": args.backend, "date": time.strftime("%Y-%m-%d"), "burst_ms": args.burst_ms,
              "gap_ms": args.gap_ms, "seed": args.seed, "gpus": args.gpus, "placement": args.placement, "interfere_on": args.interfere_on,
              "build": {"block": args.block, "layer_order": args.layer_order, "query_group": args.query_group, "schedule": args.schedule},
              "points": []}
    print("| point | interference GB/s (while copying) | nondet median s | fixed median s | fixed / nondet | bound s (compute, path, link) | fixed / bound | quiet nondet s | fixed / quiet nondet |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (tokens, budget), text in zip(points, args.points):
        try:
            built = built_llama(args.config, tokens, args.block, args.layer_order, args.query_group, args.gpus, args.placement)
            memgraph, _, _, attention = compile_turnip(built.graph, budget, built.activation_ids)
        except BudgetError as err:
            report["points"].append({"point": text, "error": f"does not fit: {err}"})
            print(f"| {text} | does not fit: {err} | | | | | | | |", flush=True)
            continue
        except InputError as err:  # a llama that cannot be built so (heads over GPUs that do not divide them)
            print(f"bench_interference: error: {err}", file=sys.stderr)
            return 1
        try:
            measured = sim_point(memgraph, args) if args.backend == "sim" else gpu_point(memgraph, args, attention.provider)
        except InputError as err:
            report["points"].append({"point": text, "error": str(err)})
            print(f"| {text} | {err} | | | | | | | |", flush=True)
            continue
        medians = {order: statistics.median(measured["makespans"][order]) for order in ORDERS}
        moved = sum(r["bytes"] for r in measured["interferer"])
        rate = moved / sum(r["seconds"] for r in measured["interferer"])
        burst_rate = moved / max(1e-12, sum(r["busy_seconds"] for r in measured["interferer"]))
        least = bound(measured.pop("compute_s"), measured.pop("path_s"), measured.pop("reloaded"), measured.pop("link"), rate)
        row = {"point": text, "tokens": tokens, "budget": budget, "medians": medians, "ratio": medians["fixed"] / medians["nondet"],
               "interference_rate": rate, "interference_burst_rate": burst_rate, "bound": least,
               "fixed_over_bound": medians["fixed"] / least["seconds"], "quiet_nondet": statistics.median(measured["quiet"]),
               **measured}
        row["fixed_over_quiet"] = medians["fixed"] / row["quiet_nondet"]
        report["points"].append(row)
        print(f"| {text} | {rate / 1e9:.1f} ({burst_rate / 1e9:.1f}) | {medians['nondet']:.4f} | {medians['fixed']:.4f} | {row['ratio']:.3f} | "
              f"{least['seconds']:.4f} ({least['compute_s']:.4f}, {least['path_s']:.4f}, {least['link_s']:.4f}) | {row['fixed_over_bound']:.3f} | "
              f"{row['quiet_nondet']:.4f} | {row['fixed_over_quiet']:.3f} |", flush=True)
        if args.json:
            atomic_write(args.json, json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the cuda benchmarks (bench/bench_cuda.py's sections) share: timing, prepared runs, cheap inputs.

`loops` prepares a memgraph on a backend once and runs the event loop several times per order, so a
section times the loop and the device, not the set-up. Importing this module puts the repository root on
sys.path, so the section modules import it first.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.callbacks import Recorder  # noqa: E402
from runtime.executor import Executor  # noqa: E402
from runtime.graph import build_exec_graph  # noqa: E402
from runtime.inputs import Tiled, input_specs  # noqa: E402
from runtime.policies import make_policy  # noqa: E402
from runtime.summary import summarize  # noqa: E402
from turnip_ir.memgraph import MemGraph  # noqa: E402

GIB = 1 << 30


def row(*cells) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def cuda_time(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of `fn()` on torch's current stream, timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def h2d_ceiling() -> float:
    """Pinned host-to-GPU bytes/s of a 1 GiB copy (cuda_time's median): the link's ceiling that
    bench/run.py's floor and bench_interference.py's bound divide by."""
    import torch

    host = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    rate = GIB / cuda_time(lambda: dev.copy_(host, non_blocking=True))
    del host, dev
    torch.cuda.empty_cache()
    return rate


def loops(memgraph: MemGraph, backend, orders=("nondet",), repeats: int = 3, inputs=None, streams: int = 2, alternate: bool = False,
          on_prepared=None, quiet: int = 0) -> dict:
    """Prepare once, run the loop `repeats` times per order (inputs are read-only, so reruns are valid).

    With `alternate`, the orders take turns run by run (a warm-up of each, then nondet, fixed, nondet, ...),
    so a disturbance that changes over time (another process's copies) falls on every order alike;
    `on_prepared()` is called once the backend is prepared, before the first run (to start one); with
    `quiet`, that many runs of the first order (after a warm-up) come before it, their makespans in
    out["quiet"]. Returns per order the median loop wall time, device makespan, every makespan and the last
    run's summary."""
    graph = build_exec_graph(memgraph, streams)
    specs = input_specs(memgraph)
    arrays = inputs or {task: cheap_input(shape, dtype) for task, (shape, dtype) in specs.items()}
    backend.prepare(graph, arrays)
    runs = [(order, repeat) for repeat in range(repeats + 1) for order in orders] if alternate else \
        [(order, repeat) for order in orders for repeat in range(repeats + 1)]
    before = [(orders[0], repeat) for repeat in range(quiet + 1)] if quiet else []
    walls, spans, last = {o: [] for o in orders}, {o: [] for o in orders}, {}
    out = {"quiet": []}

    def one(k: int, order: str, repeat: int):
        if k:
            backend.place_inputs(arrays)  # the last run may have reused inputs' memory
        recorder = Recorder()
        began = time.perf_counter()
        Executor(graph, backend, make_policy(order, graph, repeat), [recorder]).run()
        wall = time.perf_counter() - began
        return summarize(graph, recorder.completions, "cuda", order, wall), recorder, wall

    try:
        for k, (order, repeat) in enumerate(before):
            summary = one(k, order, repeat)[0]
            if repeat:  # the first run is the warm-up
                out["quiet"].append(summary.makespan)
        if on_prepared is not None:
            on_prepared()
        for k, (order, repeat) in enumerate(runs, start=len(before)):
            summary, recorder, wall = one(k, order, repeat)
            last[order] = (summary, recorder)
            if repeat:  # the first run is the warm-up
                walls[order].append(wall)
                spans[order].append(summary.makespan)
        for order in orders:
            out[order] = {"wall": statistics.median(walls[order]), "makespan": statistics.median(spans[order]), "makespans": spans[order],
                          "summary": last[order][0], "recorder": last[order][1]}
        out["outputs"] = backend.read_outputs()
    finally:
        backend.close()
    out["stats"] = dict(getattr(backend, "stats", {}))
    out["notes"] = backend.notes()
    return out


def cheap_input(shape, dtype, scale: float = 0.1):
    """A cheap non-zero input: a small random block repeated (never zeros: they time faster than data)."""
    rng = np.random.default_rng(0)
    if not shape or shape[0] == 0:
        return rng.standard_normal(shape).astype(dtype)
    rows = next(r for r in (64, 32, 16, 8, 4, 2, 1) if shape[0] % r == 0)
    block = (rng.standard_normal((rows, *shape[1:])) * scale).astype(dtype)
    return Tiled(block, tuple(shape))


def graph_inputs(graph):
    """Inputs for a graph: activations ~N(0, 1), 2-D weights ~N(0, 1/fan_in) so deep stacks stay finite in fp16."""
    return {task: cheap_input(node.shape, node.dtype, 1.0 if task == "x" or len(node.shape) < 2 else node.shape[1] ** -0.5)
            for task, node in graph.nodes.items() if node.op == "input"}


def materialize(value):
    return value.materialize() if isinstance(value, Tiled) else value


def pinned(value):
    import torch

    tensor = torch.empty(value.shape, dtype=torch.float16, pin_memory=True)
    value.write_into(tensor.numpy()) if isinstance(value, Tiled) else tensor.numpy().__setitem__(..., value)
    return tensor

"""`turnip run`: compile a taskgraph at a budget (or take a compiled memgraph) and execute it.

Thin: it parses flags, calls `turnip_ir.io.load_graph`, `passes.pipeline.compile_taskgraph` and
`runtime.execute`, prints the run summary, and writes the outputs and trace files only after success.
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import numpy as np

from runtime import arena_budget, execute
from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, make_backend, resolve_backend
from runtime.callbacks import ProgressBar
from runtime.inputs import load_npz
from runtime.policies import ORDERS
from turnip_cli.interrupt import check as check_interrupt, stop_on_interrupt
from turnip_cli.planning import add_schedule_argument, compile_with
from turnip_ir.errors import InputError
from turnip_ir.io import load_graph, write_atomic
from turnip_ir.memgraph import MemGraph

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'4GiB' -> 4294967296; plain integers are bytes; KiB/MiB/GiB and KB/MB/GB suffixes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise InputError(f"memory size '{text}' must be bytes or a number with KiB, MiB, GiB, KB, MB or GB")
    return int(float(match.group(1)) * _UNITS[unit])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="taskgraph (.json/.mlir) or compiled memgraph")
    parser.add_argument("--memory", help="per-GPU budget, e.g. 4GiB (required for a taskgraph)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu")
    parser.add_argument("--order", default="nondet", choices=ORDERS)
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help="the cuda backend's attention provider")
    parser.add_argument("--seed", type=int, default=0, help="seeds --order random, missing inputs and jitter")
    parser.add_argument("--inputs", help=".npz of input tensors keyed by taskgraph input id")
    parser.add_argument("--outputs", help="write the outputs to this .npz, keyed by taskgraph id")
    parser.add_argument("--trace", help="write a Chrome/Perfetto trace (open at ui.perfetto.dev)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="cpu: max random delay per vertex in seconds; sim: relative spread of durations")
    parser.add_argument("--streams", type=int, default=2, help="compute streams per GPU")
    parser.add_argument("--no-verify", action="store_true", help="run a given memgraph without proving it race-free first")
    add_schedule_argument(parser)


def run(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs --backend cpu")
    if args.jitter < 0:
        raise InputError(f"--jitter must be 0 or more, got {args.jitter}")
    for path in (args.outputs, args.trace):
        _check_writable(path)  # before a long run, not after it
    backend_object = make_backend(backend, args.jitter, args.seed, attention_provider=args.attention)  # before compiling: a missing GPU fails fast
    memgraph, compiled = _memgraph(args.file, args.memory, backend, args.streams, args.attention, args.schedule)
    inputs = load_npz(args.inputs) if args.inputs else None
    result = execute(
        memgraph,
        backend=backend_object,
        order=args.order,
        seed=args.seed,
        inputs=inputs,
        jitter=args.jitter,
        streams=args.streams,
        callbacks=[ProgressBar(), stop_on_interrupt()],
        verify=not (compiled or args.no_verify),  # the compiler verifies its own plans
    )
    check_interrupt()  # a Ctrl-C that landed where it was swallowed still writes nothing
    if args.outputs:
        _save_outputs(args.outputs, result.outputs)
    if args.trace:
        result.recorder.write_trace(args.trace)
    print("\n".join(result.summary.lines()))
    return 0


def _check_writable(path: str | None) -> None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise InputError(f"cannot write {path}: its folder does not exist")


def _save_outputs(path: str, outputs: dict[str, np.ndarray]) -> None:
    """Write the .npz atomically, so a failure leaves no partial outputs file."""
    data = io.BytesIO()
    np.savez(data, **outputs)
    write_atomic(path, data.getvalue())


def _memgraph(path: str, memory: str | None, backend: str, streams: int, attention: str = "auto", schedule: str = "given") -> tuple[MemGraph, bool]:
    """The memgraph to run, and whether it was compiled here (and so verified) from a taskgraph.

    The budget is everything a run may take per GPU: the cuda backend's workspace comes out of it first."""
    graph = load_graph(path)
    budget = parse_size(memory) if memory is not None else None
    if isinstance(graph, MemGraph):
        if budget is not None and graph.budget > arena_budget(graph, budget, backend, streams, attention):
            raise InputError(f"{path}: the memgraph was planned for {graph.budget} bytes per GPU, more than --memory {budget} allows the {backend} backend's arena")
        return graph, False
    if budget is None:
        raise InputError(f"{path}: a taskgraph needs --memory to be compiled")
    return compile_with(graph, arena_budget(graph, budget, backend, streams, attention), schedule, streams), True

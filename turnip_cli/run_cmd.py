"""`turnip run`: compile a taskgraph at a budget (or take a compiled memgraph) and execute it.

Thin: it parses flags, calls `turnip_ir.io.load_graph`, `passes.pipeline.compile_taskgraph` and
`runtime.execute`, prints the run summary, and writes the outputs and trace files only after success.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
import numpy as np

from runtime import execute
from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, make_backend, resolve_backend
from runtime.callbacks import ProgressBar, Recorder
from runtime.inputs import load_npz
from runtime.policies import ORDERS
from turnip_cli.interrupt import check as check_interrupt, stop_on_interrupt
from turnip_cli.planning import ATTENTION_HELP, add_remat_argument, add_schedule_argument, check_seed, load_plan
from turnip_cli.progress import Progress, add_progress_argument
from turnip_ir.errors import InputError
from turnip_ir.files import Contents, check_outputs, write_all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="taskgraph (.json/.mlir) or compiled memgraph")
    parser.add_argument("--memory", help="per-GPU budget, e.g. 4GiB (required for a taskgraph)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu")
    parser.add_argument("--order", default="nondet", choices=ORDERS)
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help=ATTENTION_HELP)
    parser.add_argument("--seed", type=int, default=0, help="seeds --order random, missing inputs and jitter")
    parser.add_argument("--inputs", help=".npz of input tensors keyed by taskgraph input id")
    parser.add_argument("--outputs", help="write the outputs to this .npz, keyed by taskgraph id")
    parser.add_argument("--trace", help="write a Chrome/Perfetto trace (open at ui.perfetto.dev)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="cpu: max random delay per vertex in seconds; sim: relative spread of durations")
    parser.add_argument("--streams", type=int, default=2, help="compute streams per GPU")
    parser.add_argument("--no-verify", action="store_true", help="run a given memgraph without proving it race-free first")
    add_schedule_argument(parser)
    add_remat_argument(parser)
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs --backend cpu")
    if not (math.isfinite(args.jitter) and args.jitter >= 0):
        raise InputError(f"--jitter must be a finite number, 0 or more, got {args.jitter}")
    check_seed(args.seed)
    check_outputs({"--outputs": args.outputs, "--trace": args.trace}, {"FILE": args.file, "--inputs": args.inputs})  # before a long run
    backend_object = make_backend(backend, args.jitter, args.seed, attention_provider=args.attention)  # before compiling: a missing GPU fails fast
    progress = Progress.for_args(args)
    with progress.phase(f"reading {args.file}" + (" and compiling" if args.memory else "")):
        memgraph, compiled, provider = load_plan(args.file, args.memory, backend, args.streams, args.attention, args.schedule, args.remat)
    if provider and backend == "cuda":  # the provider the plan's workspace was sized for (auto's choice)
        backend_object.choose_attention(provider)
    inputs = None
    if args.inputs:
        with progress.phase(f"reading {args.inputs}"):
            inputs = load_npz(args.inputs)
    with progress.phase("verifying and preparing" if not (compiled or args.no_verify) else "preparing"):
        result = _execute(args, memgraph, backend_object, inputs, compiled, progress)
    check_interrupt()  # a Ctrl-C that landed where it was swallowed still writes nothing
    written = write_all(run_files(args.outputs, lambda: result.outputs, args.trace, result.recorder))
    print("\n".join(result.summary.lines()))
    for path in written:
        print(f"wrote {path}")
    return 0


def run_files(outputs: str | None, arrays: Callable[[], dict[str, np.ndarray]], trace: str | None,
              recorder: Recorder) -> list[tuple[str, Contents]]:
    """What a run writes, as (path, contents) for `write_all`: the `arrays()` as an .npz, and the trace.
    Both are written together and only after the run succeeded, or neither is."""
    files: list[tuple[str, Contents]] = []
    if outputs:
        files.append((outputs, lambda handle: np.savez(handle, **arrays())))
    if trace:
        files.append((trace, recorder.trace_json()))
    return files


def _execute(args: argparse.Namespace, memgraph, backend_object, inputs, compiled: bool, progress: Progress):
    """The run, with the bar; the current phase (verifying, preparing) ends when the executor starts."""
    return execute(
        memgraph,
        backend=backend_object,
        order=args.order,
        seed=args.seed,
        inputs=inputs,
        jitter=args.jitter,
        streams=args.streams,
        callbacks=[progress.until_run_starts(), ProgressBar(progress.delay, progress.enabled), stop_on_interrupt()],
        verify=not (compiled or args.no_verify),  # the compiler verifies its own plans
    )


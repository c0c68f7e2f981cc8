"""`turnip explain FILE`: what a plan offloads and reloads, and why (turnip_ir/explain.py).

FILE is a memgraph, or a taskgraph compiled at `--memory` exactly as `turnip run` would compile it for the
same `--backend`, `--streams`, `--schedule` and `--remat`, so the plan explained is the plan that runs. It prints a
summary per GPU, then one line per reload in plan order: the tensor, the use it came back for, and either
"starts in host memory" or the eviction (the node that took its place, how many kernels later it was
needed again, and the offload that saved it or "host memory already held it").
"""

from __future__ import annotations

import argparse
import json

from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, resolve_backend
from turnip_cli.planning import add_remat_argument, add_schedule_argument, check_positive_options, load_plan
from turnip_ir.errors import InputError
from turnip_ir.explain import explain_offloads
from turnip_ir.files import atomic_write, check_outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="memgraph (.json/.mlir), or a taskgraph with --memory")
    parser.add_argument("--memory", help="per-GPU budget to compile a taskgraph at, e.g. 4GiB")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="whose arena the budget is planned for (as turnip run)")
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help="the cuda backend's attention provider (its workspace)")
    parser.add_argument("--streams", type=int, default=2, help="compute streams per GPU (the cuda workspace)")
    add_schedule_argument(parser)
    add_remat_argument(parser)
    parser.add_argument("--tensor", help="only reloads of tensors matching this glob, e.g. 'l0.*'")
    parser.add_argument("--gpu", type=int, help="only this GPU's summary and reloads")
    parser.add_argument("--limit", type=int, default=30, help="reload lines to print (0: all); the summary covers every reload")
    parser.add_argument("--json", help="write every reload and its cause to this .json file")


def run(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise InputError(f"--limit must be 0 or more, got {args.limit}")
    check_positive_options(args, "streams")
    check_outputs({"--json": args.json}, {"FILE": args.file})
    memgraph, _, _ = load_plan(args.file, args.memory, resolve_backend(args.backend), args.streams, args.attention, args.schedule,
                             args.remat)
    if args.gpu is not None and not 0 <= args.gpu < memgraph.devices:
        raise InputError(f"--gpu {args.gpu}: the plan has GPUs 0 to {memgraph.devices - 1}")
    report = explain_offloads(memgraph)
    chosen = report.select(args.tensor, args.gpu)
    if args.tensor is not None and not chosen:
        raise InputError(f"--tensor '{args.tensor}': no reload of a tensor matching it" + (f" on GPU {args.gpu}" if args.gpu is not None else ""))
    if args.json:
        atomic_write(args.json, json.dumps(report.to_json(), indent=1) + "\n")
    print("\n".join(report.summary_lines(device=args.gpu)))
    shown = chosen if args.limit == 0 else chosen[: args.limit]
    for reload in shown:
        print(report.line(reload))
    if len(shown) < len(chosen):
        more = len(chosen) - len(shown)
        print(f"... {more} more reload{'s' if more > 1 else ''} (--limit 0 prints every one)")
    if args.json:
        print(f"wrote {args.json}")
    return 0

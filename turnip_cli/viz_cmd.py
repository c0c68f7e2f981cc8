"""`turnip viz FILE -o picture`: draw a taskgraph or memgraph (.json or .mlir) with graphviz, or a run's
trace (`turnip run --trace`) as a timeline.

For graphs the output format follows the suffix (.svg, .png, .pdf, or .dot for DOT text); rendering
needs the graphviz `dot` binary, and without it the command says how to install it and exits 1. A
picture of more than 2,000 nodes needs `--limit N` (the first N nodes in file order), or write DOT text;
`dot` is killed after `--timeout` seconds or on Ctrl-C. For a trace it is a Gantt chart, one row per lane per GPU (.svg, or .png with matplotlib).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from turnip_ir.dot import DOT_TIMEOUT, MAX_DRAWN, render
from turnip_ir.errors import InputError
from turnip_ir.files import check_outputs
from turnip_ir.io import is_trace, load_graph

MAX_TIMEOUT = 86400.0
"""`--timeout` at most a day: graphviz's wait takes a finite number of seconds (nan and inf crashed it)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a taskgraph or memgraph (.json or .mlir), or a trace (.json from turnip run --trace)")
    parser.add_argument("-o", "--output", help="picture to write (.svg, .png, .pdf, .dot; a trace: .svg or .png); "
                        "default: the input's name with .svg, in the current folder (g.json -> ./g.svg)")
    parser.add_argument("--limit", type=int, metavar="N", help=f"draw only the first N nodes (in file order) and the edges "
                        f"among them; needed for a picture of more than {MAX_DRAWN} nodes")
    parser.add_argument("--timeout", type=float, default=DOT_TIMEOUT, metavar="SECONDS",
                        help=f"stop graphviz after this long (default {DOT_TIMEOUT:g})")



def run(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT):
        raise InputError(f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}, got {args.timeout:g}")
    output = args.output or Path(args.file).with_suffix(".svg").name
    check_outputs({"-o": output}, {"FILE": args.file})
    if is_trace(args.file):
        from runtime.timeline import write_timeline

        print(f"wrote {write_timeline(args.file, output)} (timeline)")
        return 0
    if Path(args.file).suffix.lower() not in (".json", ".mlir", ".ir", ""):
        raise InputError(f"{args.file}: turnip viz reads a taskgraph or memgraph (.json or .mlir) or a trace "
                         f"(.json from turnip run --trace), not a '{Path(args.file).suffix}' file")
    graph = load_graph(args.file)
    path = render(graph, output, args.limit, args.timeout)
    drawn = len(graph) if args.limit is None else min(args.limit, len(graph))
    print(f"wrote {path} ({drawn} nodes)" if drawn == len(graph) else f"wrote {path} (the first {drawn} of {len(graph)} nodes)")
    return 0

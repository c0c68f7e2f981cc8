"""`turnip viz FILE -o picture`: draw a taskgraph or memgraph (.json or .mlir) with graphviz, or a run's
trace (`turnip run --trace`) as a timeline.

For graphs the output format follows the suffix (.svg, .png, .pdf, or .dot for DOT text); rendering
needs the graphviz `dot` binary, and without it the command says how to install it and exits 1. For a
trace it is a Gantt chart, one row per lane per GPU (.svg, or .png with matplotlib).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from turnip_ir.dot import render
from turnip_ir.errors import InputError
from turnip_ir.files import check_outputs
from turnip_ir.io import is_trace, load_graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a taskgraph or memgraph (.json or .mlir), or a trace (.json from turnip run --trace)")
    parser.add_argument("-o", "--output", help="picture to write (.svg, .png, .pdf, .dot; a trace: .svg or .png); "
                        "default: the input's name with .svg, in the current folder (g.json -> ./g.svg)")


def run(args: argparse.Namespace) -> int:
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
    path = render(graph, output)
    print(f"wrote {path} ({len(graph)} nodes)")
    return 0

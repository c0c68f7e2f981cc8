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
from turnip_ir.io import load_graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a taskgraph or memgraph (.json or .mlir), or a trace (.json from turnip run --trace)")
    parser.add_argument("-o", "--output", default="graph.svg", help="picture to write (.svg, .png, .pdf, .dot; a trace: .svg or .png)")


def _is_trace(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return b'"traceEvents"' in head


def run(args: argparse.Namespace) -> int:
    if _is_trace(args.file):
        from runtime.timeline import write_timeline

        print(f"wrote {write_timeline(args.file, args.output)} (timeline)")
        return 0
    if Path(args.file).suffix.lower() not in (".json", ".mlir", ".ir", ""):
        raise InputError(f"{args.file}: turnip viz reads a taskgraph or memgraph (.json or .mlir) or a trace "
                         f"(.json from turnip run --trace), not a '{Path(args.file).suffix}' file")
    graph = load_graph(args.file)
    path = render(graph, args.output)
    print(f"wrote {path} ({len(graph)} nodes)")
    return 0

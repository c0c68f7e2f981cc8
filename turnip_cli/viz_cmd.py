"""`turnip viz FILE -o graph.svg`: draw a taskgraph or memgraph (.json or .mlir) with graphviz.

The output format follows the suffix (.svg, .png, .pdf, or .dot for DOT text). Rendering needs the
graphviz `dot` binary; without it the command says how to install it and exits 1.
"""

from __future__ import annotations

import argparse

from turnip_ir.dot import render
from turnip_ir.io import load_graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a taskgraph or memgraph, .json or .mlir")
    parser.add_argument("-o", "--output", default="graph.svg", help="picture to write (.svg, .png, .pdf, .dot)")


def run(args: argparse.Namespace) -> int:
    graph = load_graph(args.file)
    path = render(graph, args.output)
    print(f"wrote {path} ({len(graph)} nodes)")
    return 0

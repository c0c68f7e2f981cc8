"""Graphviz pictures of taskgraphs and memgraphs (DOT text; rendering needs the `dot` binary).

Conventions: one cluster per GPU (plus one for CPU storage); data edges solid black; memory edges red;
redundant memory edges red and dashed; offloads are orange down-pointing houses, reloads green
up-pointing houses; inputs are ellipses; each node shows its task id, op and location. In an SVG, a
reload's tooltip says why it is there (turnip_ir/explain.py).
"""

from __future__ import annotations

import shutil

import graphviz

from turnip_ir.errors import InputError
from turnip_ir.files import atomic_write
from turnip_ir.explain import explain_offloads
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.taskgraph import TaskGraph

_STYLE = {
    "input": {"shape": "ellipse", "style": "filled", "fillcolor": "#e8eef7"},
    "kernel": {"shape": "box", "style": "rounded,filled", "fillcolor": "#ffffff"},
    "move": {"shape": "cds", "style": "filled", "fillcolor": "#dde7ff"},
    "offload": {"shape": "invhouse", "style": "filled", "fillcolor": "#ffcc80", "color": "#e65100"},
    "reload": {"shape": "house", "style": "filled", "fillcolor": "#b9f6ca", "color": "#1b5e20"},
}


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g}{unit}" if unit == "B" else f"{n:.3g}{unit}"
        n /= 1024
    return str(n)


def taskgraph_dot(graph: TaskGraph) -> graphviz.Digraph:
    dot = graphviz.Digraph("taskgraph", graph_attr={"rankdir": "TB", "fontname": "Helvetica"}, node_attr={"fontname": "Helvetica", "fontsize": "10"})
    clusters = _clusters(dot, range(graph.devices), unplaced=any(n.device is None for n in graph.nodes.values()))
    for node in graph.nodes.values():
        kind = node.op if node.op in ("input", "move") else "kernel"
        label = f"{node.id}\\n{node.op} {'x'.join(map(str, node.shape))} {node.dtype}"
        clusters[node.device].node(node.id, label, **_STYLE[kind])
    for node in graph.nodes.values():
        for src in node.inputs:
            dot.edge(src, node.id)
    for out in graph.outputs:
        dot.node(out, peripheries="2")
    _close(dot, clusters)
    return dot


def memgraph_dot(graph: MemGraph) -> graphviz.Digraph:
    title = f"memgraph: {graph.devices} GPU(s), budget {_human(graph.budget)}"
    dot = graphviz.Digraph("memgraph", graph_attr={"rankdir": "TB", "label": title, "fontname": "Helvetica"}, node_attr={"fontname": "Helvetica", "fontsize": "10"})
    clusters = _clusters(dot, range(graph.devices), unplaced=any(n.device is None for n in graph.nodes))
    outputs = set(graph.outputs.values())
    report = explain_offloads(graph)
    why = {reload.node: report.line(reload) for reload in report.reloads}  # the tooltip of each reload in an SVG
    for node in graph.nodes:
        extra = {"peripheries": "2"} if node.id in outputs else {}
        if node.id in why:
            extra["tooltip"] = why[node.id]
        clusters[node.device].node(str(node.id), _mem_label(node), **_STYLE[node.op], **extra)
    for node in graph.nodes:
        for src in node.inputs:
            dot.edge(str(src), str(node.id), color="black")
        for src in node.mem_deps:
            dot.edge(str(src), str(node.id), color="red", constraint="true")
        for src in node.redundant_deps:
            dot.edge(str(src), str(node.id), color="red", style="dashed")
    _close(dot, clusters)
    return dot


def _mem_label(node: MemNode) -> str:
    what = node.kernel if node.op == "kernel" else node.op
    where = []
    if node.loc is not None:
        where.append(f"@{node.loc[0]}+{_human(node.loc[1])}")
    if node.storage is not None:
        where.append(f"cpu@{node.storage[0]}+{_human(node.storage[1])}")
    return f"{node.id}: {node.task}\\n{what} {' '.join(where)}"


def _clusters(dot: graphviz.Digraph, devices, unplaced: bool) -> dict:
    clusters = {}
    for device in devices:
        clusters[device] = graphviz.Digraph(f"cluster_gpu{device}", graph_attr={"label": f"GPU {device}", "style": "rounded", "color": "#888888"})
    if unplaced:
        clusters[None] = graphviz.Digraph("cluster_cpu", graph_attr={"label": "CPU storage / unplaced", "style": "dashed"})
    return clusters


def _close(dot: graphviz.Digraph, clusters: dict) -> None:
    for cluster in clusters.values():
        dot.subgraph(cluster)


def graph_dot(graph: TaskGraph | MemGraph) -> graphviz.Digraph:
    return memgraph_dot(graph) if isinstance(graph, MemGraph) else taskgraph_dot(graph)


PICTURE_FORMATS = ("svg", "png", "pdf", "jpg", "dot", "gv")
LARGE = 100
"""Above this many vertices, dot's network-simplex passes are capped: ranks stay exact, positions get
rougher, and a memgraph of a few hundred vertices (the tiny LLaMA's) draws in seconds, not minutes."""


def have_dot() -> bool:
    return shutil.which("dot") is not None


def render(graph: TaskGraph | MemGraph, path: str) -> str:
    """Write a picture of `graph` to `path` (format from the suffix: .svg, .png, .pdf, or .dot text).

    Returns the path written. Without the `dot` binary only `.dot` can be written; asking for another
    format raises an `InputError` that says how to install graphviz.
    """
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path else "svg"
    if suffix not in PICTURE_FORMATS:
        raise InputError(f"cannot draw {path}: the suffix must be one of {', '.join('.' + f for f in PICTURE_FORMATS)}")
    dot = graph_dot(graph)
    if len(graph.nodes) > LARGE:
        dot.graph_attr.update(nslimit="1", nslimit1="1")
    if suffix in ("dot", "gv"):
        atomic_write(path, dot.source)
        return path
    if not have_dot():
        raise InputError(f"cannot render {path}: the graphviz 'dot' binary is not installed (apt-get install graphviz, or brew install graphviz), or write a .dot file instead")
    atomic_write(path, dot.pipe(format=suffix))  # rendered into memory, then written whole
    return path

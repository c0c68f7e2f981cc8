"""Graphviz pictures of taskgraphs and memgraphs (DOT text; rendering needs the `dot` binary).

Conventions: one cluster per GPU (plus one for CPU storage); data edges solid black; memory edges red;
redundant memory edges red and dashed; offloads are orange down-pointing houses, reloads green
up-pointing houses; inputs are ellipses; each node shows its task id, op and location. In an SVG, a
reload's tooltip says why it is there (turnip_ir/explain.py).
"""

from __future__ import annotations

import shutil
import subprocess

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


def taskgraph_dot(graph: TaskGraph, limit: int | None = None) -> graphviz.Digraph:
    """The taskgraph's first `limit` nodes (all by default) and the edges among them."""
    dot = graphviz.Digraph("taskgraph", graph_attr={"rankdir": "TB", "fontname": "Helvetica"}, node_attr={"fontname": "Helvetica", "fontsize": "10"})
    nodes = list(graph.nodes.values())[:limit]
    drawn = {node.id for node in nodes}
    clusters = _clusters(dot, range(graph.devices), unplaced=any(n.device is None for n in nodes))
    for node in nodes:
        kind = node.op if node.op in ("input", "move") else "kernel"
        label = f"{node.id}\\n{node.op} {'x'.join(map(str, node.shape))} {node.dtype}"
        clusters[node.device].node(node.id, label, **_STYLE[kind])
    for node in nodes:
        for src in node.inputs:
            if src in drawn:
                dot.edge(src, node.id)
    for out in graph.outputs:
        if out in drawn:
            dot.node(out, peripheries="2")
    _close(dot, clusters)
    return dot


def memgraph_dot(graph: MemGraph, limit: int | None = None) -> graphviz.Digraph:
    """The memgraph's first `limit` nodes (all by default) and the edges among them."""
    title = f"memgraph: {graph.devices} GPU(s), budget {_human(graph.budget)}"
    dot = graphviz.Digraph("memgraph", graph_attr={"rankdir": "TB", "label": title, "fontname": "Helvetica"}, node_attr={"fontname": "Helvetica", "fontsize": "10"})
    nodes = graph.nodes[:limit]
    drawn = {node.id for node in nodes}
    clusters = _clusters(dot, range(graph.devices), unplaced=any(n.device is None for n in nodes))
    outputs = set(graph.outputs.values())
    report = explain_offloads(graph)
    why = {reload.node: report.line(reload) for reload in report.reloads}  # the tooltip of each reload in an SVG
    again = {node.id for node in graph.recomputes()}
    for node in nodes:
        extra = {"peripheries": "2"} if node.id in outputs else {}
        if node.id in why:
            extra["tooltip"] = why[node.id]
        label = _mem_label(node)
        if node.id in again:
            label, extra["tooltip"], extra["style"] = label + "\\n(recompute)", "computed again instead of reloaded (remat)", "rounded,filled,dashed"
        clusters[node.device].node(str(node.id), label, **{**_STYLE[node.op], **extra})
    for node in nodes:
        for src in node.inputs:
            if src in drawn:
                dot.edge(str(src), str(node.id), color="black")
        for src in node.mem_deps:
            if src in drawn:
                dot.edge(str(src), str(node.id), color="red", constraint="true")
        for src in node.redundant_deps:
            if src in drawn:
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


def graph_dot(graph: TaskGraph | MemGraph, limit: int | None = None) -> graphviz.Digraph:
    return memgraph_dot(graph, limit) if isinstance(graph, MemGraph) else taskgraph_dot(graph, limit)


PICTURE_FORMATS = ("svg", "png", "pdf", "jpg", "dot", "gv")
LARGE = 100
"""Above this many vertices, dot's network-simplex passes are capped: ranks stay exact, positions get
rougher, and a memgraph of a few hundred vertices (the tiny LLaMA's) draws in seconds, not minutes."""
MAX_DRAWN = 2000
"""Above this many vertices `dot` runs for many minutes (a 5,057-vertex memgraph did not finish in 10), so a
picture of a larger graph needs a `limit`; DOT text has no such cost and is always written whole."""
DOT_TIMEOUT = 300.0
"""Seconds `dot` may run before it is killed and the picture refused."""


def have_dot() -> bool:
    return shutil.which("dot") is not None


def render(graph: TaskGraph | MemGraph, path: str, limit: int | None = None, timeout: float = DOT_TIMEOUT) -> str:
    """Write a picture of `graph`'s first `limit` nodes to `path` (format from the suffix: .svg, .png, .pdf,
    or .dot text).

    Returns the path written. Without the `dot` binary only `.dot` can be written; asking for another
    format raises an `InputError` that says how to install graphviz. A picture of more than `MAX_DRAWN`
    nodes needs a `limit`, and `dot` is killed after `timeout` seconds or on Ctrl-C.
    """
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path else "svg"
    if suffix not in PICTURE_FORMATS:
        raise InputError(f"cannot draw {path}: the suffix must be one of {', '.join('.' + f for f in PICTURE_FORMATS)}")
    text = suffix in ("dot", "gv")
    if limit is not None and limit < 1:
        raise InputError(f"cannot draw {path}: the node limit must be 1 or more, got {limit}")
    if not text and limit is None and len(graph.nodes) > MAX_DRAWN:
        raise InputError(f"cannot draw {path}: {len(graph.nodes)} nodes are more than dot lays out in reasonable time "
                         f"({MAX_DRAWN}); draw the first N with --limit N, or write a .dot file")
    dot = graph_dot(graph, limit)
    if min(len(graph.nodes), limit or len(graph.nodes)) > LARGE:
        dot.graph_attr.update(nslimit="1", nslimit1="1")
    if text:
        atomic_write(path, dot.source)
        return path
    if not have_dot():
        raise InputError(f"cannot render {path}: the graphviz 'dot' binary is not installed (apt-get install graphviz, or brew install graphviz), or write a .dot file instead")
    atomic_write(path, run_dot(dot.source, suffix, timeout))  # rendered into memory, then written whole
    return path


def run_dot(source: str, suffix: str, timeout: float) -> bytes:
    """`dot -T<suffix>` on `source`: the picture's bytes. The child is killed and reaped on a timeout, a
    Ctrl-C or any other exception, so it never outlives the command."""
    proc = subprocess.Popen(["dot", f"-T{suffix}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        data, err = proc.communicate(source.encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise InputError(f"dot did not finish drawing in {timeout:g} s (killed); draw fewer nodes with --limit N") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines() or [f"exit status {proc.returncode}"]
        raise InputError(f"dot failed: {lines[0]}")
    return data

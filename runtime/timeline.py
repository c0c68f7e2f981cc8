"""A run's timeline as a Gantt chart anyone can open: one row per lane (compute streams, H2D, D2H, peer)
per GPU, each vertex a bar coloured by what it is, from the Chrome trace `turnip run --trace` writes.

`write_timeline(trace, "timeline.svg")` writes SVG directly (no dependency); `.png` draws the same chart
with matplotlib, when it is installed. Overlap between kernels and copies, and stalls where a compute row
is empty while copies run, are visible at a glance, without Perfetto.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from turnip_ir.errors import InputError
from turnip_ir.files import atomic_write

COLOURS = {
    "gemm": "#3b6fb6", "attention": "#8e44ad", "elementwise": "#27ae60", "norm": "#16a085",
    "reload": "#e67e22", "offload": "#c0392b", "move": "#7f8c8d",
}
LABELS = {"gemm": "GEMM (matmul, einsum)", "attention": "attention", "elementwise": "elementwise", "norm": "softmax, rmsnorm, rope",
          "reload": "reload (H2D)", "offload": "offload (D2H)", "move": "move (peer)"}


def kind_of(event: dict) -> str:
    """The colour class of a trace event: its op for copies, its kernel family for kernels."""
    if event.get("cat") in ("reload", "offload", "move"):
        return event["cat"]
    name = event.get("name", "").rsplit(" ", 1)[-1]
    if name in ("matmul", "einsum"):
        return "gemm"
    if name == "attention":
        return "attention"
    if name in ("softmax", "rmsnorm", "rope"):
        return "norm"
    return "elementwise"


def read_trace(path: str | Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"trace file '{path}' does not exist") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(f"{path}: not a trace (no 'traceEvents'); `turnip run --trace FILE` writes one")
    return doc


def rows_and_bars(doc: dict):
    """Rows [(pid, tid, label)] in GPU then lane order, and bars [(row index, start us, duration us, kind, name)]."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    bars_raw = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    used = sorted({(e["pid"], e["tid"]) for e in bars_raw} | set(names))
    rows = [(pid, tid, names.get((pid, tid), f"gpu{pid} lane {tid}")) for pid, tid in used]
    index = {(pid, tid): i for i, (pid, tid, _) in enumerate(rows)}
    bars = [(index[(e["pid"], e["tid"])], float(e["ts"]), float(e.get("dur", 0.0)), kind_of(e), e.get("name", "")) for e in bars_raw]
    return rows, bars


def write_timeline(trace: str | Path, output: str | Path, title: str | None = None) -> str:
    doc = read_trace(trace)
    rows, bars = rows_and_bars(doc)
    if not bars:
        raise InputError(f"{trace}: the trace has no vertices to draw")
    suffix = Path(output).suffix.lower()
    title = title or f"{Path(trace).name}: {len(bars)} vertices"
    if suffix == ".svg":
        atomic_write(output, _svg(rows, bars, title))
    elif suffix == ".png":
        _png(rows, bars, title, output)
    else:
        raise InputError(f"cannot draw a timeline as '{suffix or output}': use .svg or .png")
    return str(output)


def _svg(rows, bars, title: str) -> str:
    start = min(b[1] for b in bars)
    end = max(b[1] + b[2] for b in bars)
    span = max(end - start, 1e-9)
    left, top, width, height = 140, 40, 1400, 22
    scale = width / span
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{top + height * len(rows) + 70}" font-family="sans-serif" font-size="12">',
             f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>']
    for i, (_, _, label) in enumerate(rows):
        y = top + i * height
        parts.append(f'<rect x="{left}" y="{y}" width="{width}" height="{height - 2}" fill="{"#f4f4f4" if i % 2 else "#fafafa"}"/>')
        parts.append(f'<text x="{left - 6}" y="{y + height - 7}" text-anchor="end">{escape(label)}</text>')
    for row, ts, dur, kind, name in bars:
        x, w = left + (ts - start) * scale, max(dur * scale, 0.5)
        parts.append(f'<rect x="{x:.2f}" y="{top + row * height + 2}" width="{w:.2f}" height="{height - 6}" fill="{COLOURS[kind]}"><title>{escape(name)} {dur / 1e3:.3f} ms</title></rect>')
    axis = top + height * len(rows) + 4
    for k in range(11):
        x = left + width * k / 10
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis}" stroke="#ccc"/>')
        parts.append(f'<text x="{x:.1f}" y="{axis + 14}" text-anchor="middle">{span * k / 10 / 1e3:.1f} ms</text>')
    x = left
    for kind, colour in COLOURS.items():
        parts.append(f'<rect x="{x}" y="{axis + 26}" width="12" height="12" fill="{colour}"/><text x="{x + 16}" y="{axis + 37}">{LABELS[kind]}</text>')
        x += 190
    parts.append("</svg>")
    return "\n".join(parts)


def _png(rows, bars, title: str, output) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("a .png timeline needs matplotlib (pip install matplotlib); .svg needs nothing") from None
    start = min(b[1] for b in bars)
    figure, axes = plt.subplots(figsize=(16, 0.35 * len(rows) + 1.5))
    for kind, colour in COLOURS.items():
        spans = [((ts - start) / 1e3, max(dur / 1e3, 1e-6)) for row, ts, dur, k, _ in bars if k == kind]
        rows_of = [row for row, ts, dur, k, _ in bars if k == kind]
        for row in sorted(set(rows_of)):
            axes.broken_barh([s for s, r in zip(spans, rows_of) if r == row], (row - 0.4, 0.8), color=colour)
        if spans:
            axes.barh(0, 0, color=colour, label=LABELS[kind])
    axes.set_yticks(range(len(rows)), [label for _, _, label in rows])
    axes.invert_yaxis()
    axes.set_xlabel("ms")
    axes.set_title(title)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(COLOURS), fontsize=8)
    figure.tight_layout()
    try:
        atomic_write(output, lambda handle: figure.savefig(handle, format="png", dpi=120))
    finally:
        plt.close(figure)

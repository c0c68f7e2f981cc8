"""The current GPU figures of docs/benchmarks.md, rendered from the JSON in docs/results/.

"Current" is the latest result per benchmark point (both, where one sitting ran a point twice). A point of bench/run.py is (workload, tokens,
budget, GPUs, placement, system, attention provider, notifier, and the variant flags of its command:
--schedule, --copy-depth, --inputs, --block, --layer-order, --query-group); a point of bench/bench_cuda.py is a section of its JSON (kernels,
notifiers, copies, ...). Files are ordered by sitting: the `date` each file records, then the sitting's
letter in its name (h200-2026-12-01c-... is the third sitting of that day; a name without one comes
first). The run tables are bench/report.py's `table`, so the page and the report agree; under every
table, the files its rows came from and the command that wrote each.

    .venv/bin/python -m tools.bench_docs                              # print the generated part
    .venv/bin/python -m tools.bench_docs --write docs/benchmarks.md   # replace it between the markers
    .venv/bin/python -m tools.bench_docs --check docs/benchmarks.md   # exit 1 if the page has drifted
    make docs                                                        # this and the pass reference

In the file the generated part sits between `<!-- results:current -->` and `<!-- /results:current -->`;
the hand-written text around the markers is kept. tests/test_bench_docs.py runs the check. Older
figures, with the reading of each sitting, are in docs/benchmarks-log.md.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tools.generated import replace_between, write_or_check

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
BEGIN = "<!-- results:current -->"
END = "<!-- /results:current -->"
VARIANTS = ("--schedule", "--copy-depth", "--inputs", "--block", "--layer-order", "--query-group")
"""Flags of bench/run.py that make a run a point of its own (a study), not a newer figure of the default."""
SUPERSEDED = {
    "h200-2026-12-01-kernels-unrolled.json": "the kernels before quads, measured earlier in the same sitting",
    "h200-2026-12-01-merge-attention.json": "the merge and kernels before the quads rework of that sitting",
    "h200-2026-12-02e-kernels-bf16.json": "the bfloat16 kernels before their stores became one cvt.rn.bf16.f32",
}
"""Files whose figures a later call of the same sitting replaced (docs/benchmarks-log.md says which is
current); file names alone do not order the calls of one sitting."""
SECTIONS = {
    "ceilings": "Ceilings of the machine (bytes/s, FLOP/s)",
    "kernels": "Memory-bound kernels against the HBM copy rate",
    "attention": "Attention providers on 7B blocks (FLOP/s)",
    "merge": "The attention merge alone",
    "triton": "The triton provider's tile sweep (FLOP/s)",
    "notifiers": "Completion notifiers: latency and the stress test (seconds per vertex)",
    "lookahead": "Idle gap between dependent GEMMs, queued ahead or not (seconds)",
    "dispatch": "Host cost per tiny vertex (seconds)",
    "copies": "Reload-bound and duplex copy chains",
    "contention": "H2D alone and under GEMMs",
    "sim": "The sim's prediction beside the measured run (seconds)",
    "peer": "Two GPUs: peer copies and the blocked matmul",
}
"""bench/bench_cuda.py's sections, in page order, with their headings ("ffn" is left out: bench/run.py's
FFN runs are newer)."""


def _report():
    sys.path.insert(0, str(ROOT / "bench"))
    import report

    return report


def sitting(path: Path) -> tuple[str, str]:
    """(date, letter) of the call that wrote `path`: its recorded date, then the letter after the date in its name."""
    date = json.loads(path.read_text()).get("date", "")
    found = re.search(r"\d{4}-\d{2}-\d{2}([a-z]?)-", path.name)
    return date, found.group(1) if found else ""


def result_files() -> list[Path]:
    """Every result file but traces and the superseded, oldest sitting first (by name within a sitting)."""
    paths = [p for p in RESULTS.glob("*.json") if p.name not in SUPERSEDED and "traceEvents" not in json.loads(p.read_text())]
    return sorted(paths, key=lambda p: (sitting(p), p.name))


DEFAULTS = {"--inputs": "weights"}
"""Flag values that name bench/run.py's default outright: such a run is a figure of the default. (Runs
before 2026-12-03h started every input in host memory by default; `weights` keeps the activations on the
GPU, and their rows show 12.06 GiB reloaded at 8k instead of 12.13.)"""


def _variant(command: str) -> str:
    words = command.split()
    named = [(flag, words[words.index(flag) + 1]) for flag in VARIANTS if flag in words]
    return ", ".join(f"{flag[2:].replace('-', ' ')} {value}" for flag, value in named if DEFAULTS.get(flag) != value)


def latest_runs(paths: list[Path]) -> list[dict]:
    """bench/run.py's runs in `paths` (oldest first), those of each point's latest sitting kept: where one
    sitting ran a point in two calls, both rows stay (the names do not say which call came last)."""
    report = _report()
    points: dict[tuple, tuple[tuple[str, str], list[dict]]] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        variant = _variant(doc.get("command", ""))
        when = sitting(path)
        for run in report.load([str(path)]):
            if variant:
                run["label"] += f" ({variant})"
            run["source"] = path.relative_to(ROOT).as_posix()
            run["command"] = doc.get("command", "")
            key = (run["workload"], run["tokens"], run["budget"], run.get("gpus", 1), run["placement"], run["label"], run.get("notifier", ""))
            if key in points and points[key][0] == when:
                points[key][1].append(run)
            else:
                points[key] = (when, [run])
    return [run for _, runs in points.values() for run in runs]


def sources(items: list[tuple[str, str]]) -> str:
    """The files (and commands) a table was rendered from, one line each."""
    lines = []
    for source, command in dict.fromkeys(items):
        lines.append(f"- `{source}`" + (f": `{command.split(' --json')[0]}`" if command else ""))
    return "From:\n\n" + "\n".join(lines)


def run_tables(runs: list[dict]) -> list[str]:
    """One table per workload and length on one GPU, then one of every several-GPU run."""
    report = _report()
    groups: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: (r.get("gpus", 1) > 1, not r["workload"].startswith("llama"), r["tokens"])):
        one = run.get("gpus", 1) == 1
        llama = run["workload"].startswith("llama")  # llama, or llama-bfloat16 / llama-float16 of a --dtype comparison
        title = f"{'LLaMA 7b prefill' if llama else 'FFN'}, T = {run['tokens']}" if one else "Several GPUs (llama)"
        groups.setdefault(title, []).append(run)
    parts = []
    for title, group in groups.items():
        used = [(r["source"], r["command"]) for r in sorted(group, key=lambda r: r["source"])]
        parts.append(f"### {title}\n\n{report.table(group)}\n\n{sources(used)}")
    return parts


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value).replace("|", "/").replace("\n", " ")


def section_table(section: dict) -> str:
    """A bench_cuda.py section as a table: a row per entry, a column per field of the entries that are dicts."""
    nested = {k: v for k, v in section.items() if isinstance(v, dict)}
    flat = {k: v for k, v in section.items() if not isinstance(v, dict)}
    if "rows" in flat and isinstance(flat["rows"], list):  # the sim section: a list of rows already
        nested.update({str(i): row for i, row in enumerate(flat.pop("rows"))})
    lines = []
    if flat:
        lines += ["| figure | value |", "| --- | --- |"] + [f"| {k} | {_cell(v)} |" for k, v in flat.items()]
    if nested:
        columns = list(dict.fromkeys(c for v in nested.values() for c in v))
        lines += [""] if lines else []
        lines += ["| | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
        lines += [f"| {name} | " + " | ".join(_cell(v.get(c, "")) for c in columns) + " |" for name, v in nested.items()]
    return "\n".join(lines)


def section_tables(paths: list[Path]) -> list[str]:
    """The latest measurement of each bench_cuda.py section, with its file."""
    latest: dict[str, tuple[Path, dict]] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        if "runs" in doc:  # bench/run.py's files record their own two ceilings, not bench_cuda.py's section
            continue
        for name, value in doc.items():
            if name in SECTIONS and isinstance(value, dict) and not {"skipped", "error"} & set(value):
                latest[name] = (path, value)
    parts = []
    for name, title in SECTIONS.items():
        if name in latest:
            path, value = latest[name]
            source = f"From `{path.relative_to(ROOT).as_posix()}` ({sitting(path)[0]}): `bench/bench_cuda.py {name}`"
            parts.append(f"### {title}\n\n{section_table(value)}\n\n{source}")
    return parts


def render() -> str:
    """The whole generated part: the run tables, then the bench_cuda.py sections."""
    paths = result_files()
    intro = "_Generated by `.venv/bin/python -m tools.bench_docs --write docs/benchmarks.md` from docs/results/*.json._"
    parts = [intro, "## bench/run.py: turnip against torch and the floor", *run_tables(latest_runs(paths)),
             "## bench/bench_cuda.py: the cuda backend against its ceilings", *section_tables(paths)]
    return "\n\n".join(parts)


def replace_current(doc: str, body: str) -> str:
    """`doc` with what lies between the markers replaced by `body`."""
    return replace_between(doc, BEGIN, END, body)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(argv, __doc__.splitlines()[0], render, replace_current,
                          "differs from docs/results/: run .venv/bin/python -m tools.bench_docs --write FILE")


if __name__ == "__main__":
    sys.exit(main())

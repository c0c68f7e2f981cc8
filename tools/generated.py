"""A generated part of a hand-written page: the text between two marker lines, rendered from code or data.

`tools.pass_docs` renders the pass reference of docs/passes.md from the passes' docstrings, and
`tools.bench_docs` the current figures of docs/benchmarks.md from docs/results/*.json. Both replace only
what lies between their markers, and both have the same command line: `--write FILE` rewrites that part
(atomically), `--check FILE` exits 1 when it has drifted (their tests run the check), and no option
prints the rendered text.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from turnip_ir.files import atomic_write


def replace_between(doc: str, begin: str, end: str, body: str) -> str:
    """`doc` with what lies between the markers `begin` and `end` replaced by `body`."""
    if doc.count(begin) != 1 or doc.count(end) != 1 or doc.index(begin) > doc.index(end):
        raise ValueError(f"the file needs one {begin} and, after it, one {end}")
    head, rest = doc.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write_or_check(argv: list[str] | None, description: str, render: Callable[[], str],
                   replace: Callable[[str, str], str], drifted: str) -> int:
    """The generators' command line; `drifted` is the message's tail when `--check` finds a difference."""
    parser = argparse.ArgumentParser(description=description)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", type=Path, metavar="FILE", help="replace the generated part of FILE")
    action.add_argument("--check", type=Path, metavar="FILE", help="exit 1 if FILE's generated part differs")
    args = parser.parse_args(argv)
    body = render()
    if args.write is None and args.check is None:
        print(body)
        return 0
    path = args.write or args.check
    doc = path.read_text()
    updated = replace(doc, body)
    if args.write is not None:
        atomic_write(path, updated)
    elif updated != doc:
        print(f"{path}: {drifted}", file=sys.stderr)
        return 1
    return 0

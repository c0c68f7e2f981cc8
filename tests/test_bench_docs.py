"""`make bench` (bench/run_all.py) writes every CPU table of docs/benchmarks.md between its markers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run_all  # noqa: E402


def test_every_job_has_its_markers_and_script() -> None:
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    for job in run_all.JOBS:
        assert (ROOT / "bench" / job.args[0]).exists()
        for name in job.tables:
            assert doc.count(f"<!-- bench:{name} -->") == 1 and doc.count(f"<!-- /bench:{name} -->") == 1, name


def test_tables_are_taken_in_order_and_text_around_them_is_kept() -> None:
    output = "header line\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\nnote\n| c |\n| --- |\n| 3 |\n"
    first, second = run_all.tables(output)
    assert first == "| a | b |\n| --- | --- |\n| 1 | 2 |" and second == "| c |\n| --- |\n| 3 |"
    doc = "intro\n<!-- bench:x -->\n| old |\n<!-- /bench:x -->\nreading\n<!-- bench:y -->\n<!-- /bench:y -->\n"
    doc = run_all.replace_block(doc, "x", first)
    doc = run_all.replace_block(doc, "y", second)
    assert doc == f"intro\n<!-- bench:x -->\n{first}\n<!-- /bench:x -->\nreading\n<!-- bench:y -->\n{second}\n<!-- /bench:y -->\n"


def test_a_missing_marker_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(ValueError, match="bench:z"):
        run_all.replace_block("<!-- bench:x -->\n<!-- /bench:x -->\n", "z", "| t |")

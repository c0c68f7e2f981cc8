"""Shared by the golden-file tests: compare with an expected file, or rewrite it under TURNIP_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path

UPDATE = os.environ.get("TURNIP_UPDATE_GOLDEN") == "1"


def compare(expected_path: Path, actual: str) -> None:
    """Assert `actual` equals the file's text; with TURNIP_UPDATE_GOLDEN=1 write it first (then review the diff)."""
    if UPDATE:
        expected_path.write_text(actual)
    assert expected_path.exists(), f"{expected_path.name} is missing: run with TURNIP_UPDATE_GOLDEN=1 and review it"
    assert actual == expected_path.read_text()

"""`make install` warms numba's cache of every compiled sweep, and a failed warm-up never fails the install."""

from __future__ import annotations

import re
from pathlib import Path

from tools import warm_cache

ROOT = Path(__file__).resolve().parent.parent


def test_the_warm_up_compiles_every_cached_sweep() -> None:
    cached = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in ("turnip_ir", "passes", "runtime")
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"^@njit\(cache=True", path.read_text(), re.MULTILINE)
    }
    assert cached == set(warm_cache.MODULES)
    assert warm_cache.warm() == []


def test_a_failed_warm_up_is_a_note_not_a_failure(monkeypatch, capsys) -> None:
    def broken() -> list[str]:
        raise OSError("read-only file system")

    monkeypatch.setattr(warm_cache, "warm", broken)
    assert warm_cache.main() == 0
    assert capsys.readouterr().out.startswith("note: numba's cache was not warmed (OSError: read-only file system)")

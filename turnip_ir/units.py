"""Sizes as people read them and write them: printed by the run summary, the offload report and the backends'
notes (`format_size`), read from `--memory` and `Session(memory=)` (`parse_size`)."""

from __future__ import annotations

import re
from fractions import Fraction

from turnip_ir.errors import InputError
from turnip_ir.limits import INT_LIMIT, shorten

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d{1,3})?)\s*([a-zA-Z]*)\s*$")

MAX_DECIMALS = 4
"""A size that needs more decimals than this to differ from a round figure is written in bytes."""


def format_size(count: int) -> str:
    """Bytes as the run summary prints them: `1.50 GiB`, `12.00 KiB`, `300 B`; with enough decimals that a
    size never reads as a round figure it is not (1052832 bytes is `1.004 MiB`, not `1.00 MiB`, which a
    1 MiB budget would seem to hold), and in bytes when even four do not tell it apart (`1048577 B`)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            for decimals in range(2, MAX_DECIMALS + 1):
                text = f"{count / scale:.{decimals}f}"
                if text[-1] != "0" or Fraction(text) * scale == count:
                    return f"{text} {unit}"
            return f"{count} B"
    return f"{count} B"


def parse_size(text: str) -> int:
    """'4GiB' -> 4294967296; plain numbers are bytes; KiB/MiB/GiB and KB/MB/GB suffixes; fractions and
    exponents such as 1.5GiB or 1e9 (exact, rounded down to whole bytes), below 2**62 bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise InputError(f"memory size '{shorten(text)}' must be bytes or a number with KiB, MiB, GiB, KB, MB or GB")
    size = int(Fraction(match.group(1)) * _UNITS[unit])
    if size >= INT_LIMIT:
        raise InputError(f"memory size '{shorten(text)}' is 2**62 bytes or more, beyond what a plan can address")
    return size

"""Sizes as people read them, shared by the run summary, the offload report and the backends' notes."""

from __future__ import annotations

from fractions import Fraction

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

"""Sizes as people read them, shared by the run summary, the offload report and the backends' notes."""

from __future__ import annotations


def format_size(count: int) -> str:
    """Bytes as the run summary prints them: `1.50 GiB`, `12.00 KiB`, `300 B`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"

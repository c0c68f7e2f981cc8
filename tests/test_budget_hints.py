"""Sizes never read as a round figure they are not (issue 47, item 12)."""

from __future__ import annotations

from turnip_ir.units import format_size

import pytest


@pytest.mark.parametrize("count,text", [
    (300, "300 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (12288, "12.00 KiB"), (3 << 29, "1.50 GiB"),
    (1052832, "1.004 MiB"),  # not "1.00 MiB": a 1 MiB budget does not hold it
    (68095, "66.499 KiB"), (68096, "66.50 KiB"), (1048577, "1048577 B"), (1100000, "1.05 MiB"),
])
def test_a_size_never_reads_as_a_round_figure_it_is_not(count, text):
    assert format_size(count) == text


def test_two_sizes_that_differ_never_read_the_same_near_a_round_figure():
    for scale in (1 << 10, 1 << 20, 1 << 30):
        for count in (scale, scale + 1, scale + 7, scale + scale // 1000, scale + scale // 200 - 1):
            shown = format_size(count)
            if count != scale:
                assert shown != format_size(scale), (count, shown)


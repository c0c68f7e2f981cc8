"""Bounds every reader enforces, the same for JSON and IR text, so that a hostile or mistaken file is
refused in one line at the reader instead of overflowing, recursing or parsing for minutes later.

- `INT_LIMIT`: integers (offsets, sizes, dimensions, attributes) stay below 2**62 in magnitude, so sums
  of two still fit the 64-bit integers of IR text and numpy.
- `MAX_NESTING`: JSON arrays/objects and IR attributes nest at most this deep (Python recursion is the
  real limit; a graph never needs more than a few levels).
- `MAX_RANK`: a tensor has at most this many dimensions (xDSL parses a longer `tensor<...>` in quadratic
  time: 100k dimensions took 74 s to refuse).
- `ECHO_CHARS`: a diagnostic quotes at most this many characters of the input in one piece (`shorten`;
  `quoted` also escapes what a terminal would act on).
"""

from __future__ import annotations

INT_LIMIT = 1 << 62
MAX_NESTING = 200
MAX_RANK = 64
ECHO_CHARS = 80


def int_in_range(value) -> bool:
    """An int (not a bool) of magnitude below `INT_LIMIT`."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < INT_LIMIT


def ints_in_range(values: list) -> bool:
    """Every item an int (not a bool, nor another subclass: this is for values parsed from JSON) of
    magnitude below `INT_LIMIT`: a shape's check in C, not a Python call per dimension."""
    if not _ONLY_INT.issuperset(map(type, values)):
        return False
    return not values or (-INT_LIMIT < min(values) and max(values) < INT_LIMIT)


_ONLY_INT = frozenset([int])


def out_of_range(value: int) -> str:
    """The one-line reason an integer is refused (the number itself shortened)."""
    return f"integer {shorten(str(value))} is out of range (magnitude must stay below 2**62)"


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters with an ellipsis, for echoing input in a diagnostic."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quoted(text) -> str:
    """A name from the input as a diagnostic shows it: shortened to `ECHO_CHARS`, then quoted and escaped
    as Python's `repr` does, so a NUL, a newline or a terminal escape shows as `\\x00`, `\\n`, `\\x1b`."""
    return repr(shorten(str(text)))

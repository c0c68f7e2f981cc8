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

`json_document` is the one JSON reader under these bounds (graphs, configs, safetensors headers, indexes):
a document nested deeper than `MAX_NESTING` or holding an integer of thousands of digits (Python's
int-from-str limit) is one line, never a RecursionError or a ValueError; NaN, Infinity and numbers that
overflow a float (1e999) are refused unless the reader allows them.
"""

from __future__ import annotations

import json
import math

from turnip_ir.errors import InputError

INT_LIMIT = 1 << 62
MAX_NESTING = 200
MAX_RANK = 64
ECHO_CHARS = 80
PATH_CHARS = 400
"""A path echoed whole up to this length: a Hugging Face cache snapshot's is about 120 characters, and a
user must see the path they gave, not its first 80 characters."""


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


def quoted(text, limit: int = ECHO_CHARS) -> str:
    """A name from the input as a diagnostic shows it: shortened to `limit` characters (`ECHO_CHARS`; a path
    the user typed gets `PATH_CHARS`), then quoted and escaped as Python's `repr` does, so a NUL, a newline
    or a terminal escape shows as `\\x00`, `\\n`, `\\x1b`."""
    return repr(shorten(str(text), limit))


def json_document(text: str, name: str = "", allow_nan: bool = False) -> object:
    """`text` parsed as JSON within the bounds above, or a one-line `InputError`: `name:line:col: reason` for
    a syntax error, `name: reason` otherwise (the reason alone where `name` is empty)."""
    constant = None if allow_nan else _refuse_constant
    number = None if allow_nan else _finite_float
    try:
        doc = json.loads(text, parse_constant=constant, parse_float=number)
    except json.JSONDecodeError as err:
        where = f"{name}:" if name else ""
        raise InputError(f"{where}{err.lineno}:{err.colno}: {err.msg[:1].lower()}{err.msg[1:]}") from None
    except _NotFinite as err:
        raise InputError(_named(name, f"{shorten(err.args[0], 20)} is not a finite number (JSON has no NaN or infinity)")) from None
    except RecursionError:
        raise InputError(_named(name, _TOO_DEEP)) from None
    except ValueError as err:  # Python's cap on digits in an integer (4300 by default)
        raise InputError(_named(name, digits_message(str(err)))) from None
    if not _within_depth(text):
        raise InputError(_named(name, _TOO_DEEP))
    return doc


def digits_message(message: str) -> str:
    """Python's refusal of an integer literal of thousands of digits, in our terms (no interpreter setting)."""
    if message.startswith("Exceeds the limit") and "digits" in message:
        return "an integer has thousands of digits (magnitude must stay below 2**62)"
    return message


_TOO_DEEP = f"arrays and objects nest too deep (at most {MAX_NESTING} levels)"


class _NotFinite(ValueError):
    pass


def _refuse_constant(literal: str):
    raise _NotFinite(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotFinite(literal)
    return value


def _named(name: str, reason: str) -> str:
    return f"{name}: {reason}" if name else reason


def _within_depth(text: str) -> bool:
    """Whether a parsed document nests at most `MAX_NESTING` deep (readers and writers recurse into values).

    Works on the text, in C-level string operations, so that it costs little on a large file and cannot
    overflow the stack: escaped backslashes and quotes go, then every character but quotes and brackets;
    string literals are then the quoted runs, which only matter when one holds a bracket. Each pass of
    removing `()` takes the innermost containers, so the passes to empty are the depth. `text` must
    already parse as JSON, so its brackets outside strings balance."""
    kept = text.replace("\\\\", "").replace('\\"', "").translate(_BRACKETS_AND_QUOTES)
    brackets = kept.replace('""', "")  # each removed pair has nothing between it, in or out of a string
    if '"' in brackets:
        brackets = "".join(brackets.split('"')[::2])
    brackets = brackets.translate(_OPEN_CLOSE)
    for _ in range(MAX_NESTING + 1):
        if not brackets:
            return True
        brackets = brackets.replace("()", "")
    return not brackets


_BRACKETS_AND_QUOTES = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in '"[]{}'))
_OPEN_CLOSE = str.maketrans("[]{}", "()()")

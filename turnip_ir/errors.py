"""The errors a user can cause, one class per kind, each with its CLI exit code.

The CLI catches `TurnipError` and prints `str(error)` as one line; internal invariants use `assert`.
"""


class TurnipError(Exception):
    """Base of every user-facing error; `exit_code` is what the CLI returns."""

    exit_code = 1


class InputError(TurnipError):
    """Malformed IR or JSON, a missing file, a bad field: exit 1."""


class ShapeError(InputError):
    """Operands whose shapes or dtypes a kernel does not accept."""


class BudgetError(TurnipError):
    """A per-GPU budget too small for some op's working set: exit 2."""

    exit_code = 2


class VerifyError(TurnipError):
    """A memgraph that breaks one of the seed's conditions: exit 3."""

    exit_code = 3


class KernelError(TurnipError):
    """An unknown kernel, or a kernel that raised at run time: exit 4."""

    exit_code = 4

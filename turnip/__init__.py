"""Turnip's Python API: `Session` runs a LLaMA model under a per-GPU memory budget (prefill, generate).

The API layer: it stands on `turnip_ir`, `frontend`, `passes` and `runtime`; the CLI (`turnip_cli`)
may stand on it. See docs/generation.md. Its errors are `TurnipError`s, one line each: `InputError` for
an argument or a file it cannot use, `BudgetError` for a budget too small (naming the one to pass),
`KernelError` for a run that went wrong (logits holding NaN).
"""

from turnip.session import GenerateResult, Session
from turnip_ir.errors import BudgetError, InputError, KernelError, TurnipError

__all__ = ["BudgetError", "GenerateResult", "InputError", "KernelError", "Session", "TurnipError"]

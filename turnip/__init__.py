"""Turnip's Python API: `Session` runs a LLaMA model under a per-GPU memory budget (prefill, generate).

The API layer: it stands on `turnip_ir`, `frontend`, `passes` and `runtime`; the CLI (`turnip_cli`)
may stand on it. See docs/generation.md.
"""

from turnip.session import GenerateResult, Session

__all__ = ["GenerateResult", "Session"]

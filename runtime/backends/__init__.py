"""Backends by name: `cpu` (numpy, threads), `sim` (virtual clock); `cuda` is the next issue."""

from __future__ import annotations

from runtime.backends.base import Backend, Completion
from turnip_ir.errors import InputError

BACKENDS = ("cpu", "sim", "cuda")


def make_backend(name: str, jitter: float = 0.0, seed: int = 0) -> Backend:
    """A fresh backend of the given kind."""
    if name == "cpu":
        from runtime.backends.cpu import CpuBackend

        return CpuBackend(jitter=jitter, seed=seed)
    if name == "sim":
        from runtime.backends.sim import SimBackend

        return SimBackend(jitter=jitter, seed=seed)
    if name == "cuda":
        raise InputError("the cuda backend is not available yet (use --backend cpu or sim)")
    raise InputError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "Backend", "Completion", "make_backend"]

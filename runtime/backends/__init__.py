"""Backends by name: `cpu` (numpy, threads), `sim` (virtual clock), `cuda` (NVIDIA GPUs), and `auto`
(cuda when a GPU and numba-cuda are there, else cpu)."""

from __future__ import annotations

from runtime.backends.base import ATTENTION_PROVIDERS, Backend, Completion
from turnip_ir.errors import InputError

BACKENDS = ("auto", "cpu", "sim", "cuda")


def cuda_usable() -> bool:
    """True when a real GPU is there with numba-cuda and CuPy (never the simulator: `auto` picks no test instrument)."""
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        from runtime.backends.cuda.compat import gpu_count, simulated
    except ImportError:
        return False
    return not simulated() and gpu_count() > 0


def resolve_backend(name: str) -> str:
    """The concrete backend `name` stands for (`auto` -> cuda or cpu)."""
    if name == "auto":
        return "cuda" if cuda_usable() else "cpu"
    if name not in BACKENDS:
        raise InputError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})")
    return name


CPU_BFLOAT16 = "bfloat16 computed in float32 on the cpu backend"


def compute_dtype(model_dtype: str, wanted: str | None, backend: str) -> str:
    """The dtype a model of `model_dtype` computes in on `backend` when `wanted` (None: the model's own)
    is asked for: bfloat16 runs as such on cuda (and is costed as 2-byte tensors on sim); the cpu backend
    computes it in float32 (numpy has no bfloat16 BLAS), which `CPU_BFLOAT16` says in a summary."""
    dtype = wanted or model_dtype
    return "float32" if dtype == "bfloat16" and backend == "cpu" else dtype


def make_backend(name: str, jitter: float = 0.0, seed: int = 0, cost=None, **options) -> Backend:
    """A fresh backend of the given kind; `cost` (a CostModel) is the sim backend's clock (None: the
    H200 defaults); `options` go to the cuda backend's constructor (the others, which have no such
    options, ignore them)."""
    name = resolve_backend(name)
    if name == "cpu":
        from runtime.backends.cpu import CpuBackend

        return CpuBackend(jitter=jitter, seed=seed)
    if name == "sim":
        from runtime.backends.sim import SimBackend

        return SimBackend(cost=cost, jitter=jitter, seed=seed)
    try:
        from runtime.backends.cuda import CudaBackend, gpu_count
    except ImportError as err:
        raise InputError(f"the cuda backend needs numba-cuda (pip install -e '.[cuda]'): {err}") from None
    if gpu_count() == 0:
        raise InputError("the cuda backend needs an NVIDIA GPU and its driver, and this machine has none (use --backend cpu or sim)")
    return CudaBackend(**options)


__all__ = ["ATTENTION_PROVIDERS", "BACKENDS", "Backend", "Completion", "make_backend", "resolve_backend"]

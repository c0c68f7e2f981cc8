"""The `triton` attention provider: one Triton kernel per block computes attention and folds it into the
packed partial, so no merge kernel runs and nothing is allocated.

A program takes BLOCK_M query rows of one head h (its key-value head g = h // group). It streams the key
block in BLOCK_N columns with the online softmax of flash attention (running maximum and sum, in base 2),
then, in its epilogue, folds the result into `prev` (the packed partial [tq, H*d + H] in float32: the
normalised output, then the log-sum-exp per head) and writes `out`: the next packed partial, or the final
output in q's dtype. q [tq, H*d], k and v [tk, KV*d] are read in place with heads as column offsets, so
grouped heads need no copy. A causal block is a diagonal block (tq == tk): query i sees keys j <= i.

Triton launches on torch's current stream: the provider wraps the arena views as torch tensors (no copy)
and launches inside `torch.cuda.stream(lane's stream)`. The kernel compiles in `prepare` (`warm`), with
Triton's `warmup`, which compiles without running: a run before the loop would write into the arena.
Without a GPU, `TRITON_INTERPRET=1` runs the same kernel on CPU tensors (tests/test_attention_triton.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

from turnip_ir.errors import InputError, KernelError

LOG2E = 1.4426950408889634
ENVIRONMENT = "TURNIP_TRITON_ATTENTION"


@dataclass(frozen=True)
class Config:
    """A launch shape: query rows and key columns per tile, warps per program, and software-pipeline stages.
    The tiles are powers of two from 16 (`tl.arange`, `tl.dot`), `block_m` a multiple of `block_n` (a
    causal block's diagonal starts on a key tile); warps a power of two. The defaults are `default_config`'s
    shape for head widths up to 128."""

    block_m: int = 64
    block_n: int = 64
    warps: int = 4
    stages: int = 3

    @classmethod
    def parse(cls, text: str) -> "Config":
        """`"BLOCK_M,BLOCK_N,WARPS,STAGES"`, as $TURNIP_TRITON_ATTENTION takes it."""
        parts = text.split(",")
        try:
            if len(parts) != 4:
                raise ValueError
            config = cls(*(int(part) for part in parts))
        except ValueError:
            raise InputError(f"{ENVIRONMENT}={text!r}: expected four integers BLOCK_M,BLOCK_N,WARPS,STAGES") from None
        power = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
        if not (power(config.block_m) and power(config.block_n) and config.block_m >= 16 and config.block_n >= 16):
            raise InputError(f"{ENVIRONMENT}={text!r}: BLOCK_M and BLOCK_N must be powers of two from 16")
        if config.block_m % config.block_n:
            raise InputError(f"{ENVIRONMENT}={text!r}: BLOCK_M must be a multiple of BLOCK_N")
        if not power(config.warps) or config.stages < 1:
            raise InputError(f"{ENVIRONMENT}={text!r}: WARPS must be a power of two and STAGES at least 1")
        return config


def default_config(d: int) -> Config:
    """The shape for head width d, unless $TURNIP_TRITON_ATTENTION names one (a tuning knob: docs/runtime.md,
    "Attention providers"). 64 x 64 tiles, 4 warps and 3 stages won the sweep at d 128 (`bench_cuda.py
    triton`; docs/benchmarks.md, "The cuda backend on the H200"); d 64 takes the same shape unmeasured, and
    d 256 halves the key tile and the stages so a program's shared memory stays what it is at d 128 (also
    unmeasured)."""
    text = os.environ.get(ENVIRONMENT)
    if text:
        return Config.parse(text)
    if d <= 128:
        return Config()
    return Config(64, 32, 4, 2)


def supported(heads: int, kv_heads: int, d: int, dtype: str) -> bool:
    """What the kernel takes: float16 or bfloat16 (float32 dots would run as tf32; the kernel casts to its
    operands' type, so both halves work) and a power-of-two head width from 16 to 256 (`tl.arange`,
    `tl.dot`). Other blocks go to the cublas provider."""
    return dtype in ("float16", "bfloat16") and 16 <= d <= 256 and d & (d - 1) == 0 and heads % kv_heads == 0


@lru_cache(maxsize=None)
def kernel():
    """The jitted kernel (imported on first use: the module needs triton, which is optional; `auto` finds
    triton installed without importing it, so an install that does not import fails here, in one line)."""
    try:
        from runtime.backends.cuda import attention_triton_kernel
    except ImportError as err:
        raise KernelError(f"attention provider 'triton': triton is installed but does not import ({err})") from None

    return attention_triton_kernel.attention_block


def arguments(q, k, v, prev, out, heads: int, kv_heads: int, causal: bool, final: bool, scale: float, config: Config | None = None):
    """(grid, positional arguments, launch keywords) of one block: torch tensors, 2-D, rows contiguous."""
    tq, width = q.shape
    d = width // heads
    config = config or default_config(d)
    grid = (math.ceil(tq / config.block_m), heads)
    partial = prev if prev is not None else out  # never read without HAS_PREV; any valid pointer will do
    args = (q, k, v, partial, out, scale * LOG2E, tq, k.shape[0], q.stride(0), k.stride(0), v.stride(0), partial.stride(0),
            out.stride(0), heads, heads // kv_heads)
    constants = dict(D=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, CAUSAL=causal, HAS_PREV=prev is not None, FINAL=final,
                     EVEN_N=k.shape[0] % config.block_n == 0, num_warps=config.warps, num_stages=config.stages)
    return grid, args, constants


def launch(q, k, v, prev, out, heads: int, kv_heads: int, causal: bool, final: bool, scale: float, config: Config | None = None) -> None:
    """Run one block on torch's current stream (or on the CPU under TRITON_INTERPRET=1)."""
    grid, args, constants = arguments(q, k, v, prev, out, heads, kv_heads, causal, final, scale, config)
    kernel()[grid](*args, **constants)


def warm(q, k, v, prev, out, heads: int, kv_heads: int, causal: bool, final: bool, scale: float, config: Config | None = None) -> None:
    """Compile the block's specialisation without running it (nothing is written)."""
    grid, args, constants = arguments(q, k, v, prev, out, heads, kv_heads, causal, final, scale, config)
    kernel().warmup(*args, grid=grid, **constants)

"""The end of a `turnip` process: once a command has returned, its results written and its lines printed,
the process ends at once (`end`), without the interpreter's teardown: the operating system and the CUDA
driver take back page-locked host memory, device memory and contexts whole, where unregistering a 7b
session's 30 GB of pinned weights, cache and storage one buffer at a time, then the finalizers of numba,
CuPy and torch, took 1.7 s after the last token on the H100 (bench/investigations/sampled.py). A command
run that way (`turnip`, `python -m turnip_cli.main`) keeps its session open to the end (`scope`); one
called in-process (`turnip_cli.main.main(argv)`, as the tests do) closes it as a library caller would.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time

from turnip_ir.units import format_size

STARTED = time.perf_counter()
"""When the command began: the first import of the `turnip` entry point (turnip_cli/main.py imports this
module before anything else), so a command's "end to end" counts its imports too."""

_ending = False
"""Whether this process ends when the command returns (`end` will be called)."""


def ends_with_command() -> None:
    """Mark this process as one that ends when its command returns (the `turnip` entry point)."""
    global _ending
    _ending = True


def started(call_began: float) -> float:
    """When the command began: the process's start where the command is the process, else `call_began`
    (a command called in-process)."""
    return STARTED if _ending else call_began


def scope(session):
    """`with scope(session):` closes the session at the block's end, unless the process ends right after
    the command (then the operating system frees what it holds, at once)."""
    return contextlib.nullcontext(session) if _ending else session


def end(code: int | None) -> None:
    """Flush what was printed and end the process with `code` (None: 0), skipping the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0 if code is None else int(code))


def settle_heap() -> None:
    """Once a command's long-lived objects are made (its plans, the backend's built work: millions of
    objects at 7b), collect what set-up left and freeze the rest (`gc.freeze`), so the collector's full
    passes later scan only what the steps make. Without it, a `turnip finetune` step at 7b / 4k paid a
    full pass of about 0.3 s every few steps (H100, bench/investigations/finetune_profile.py). Only where
    the process ends with the command (`ends_with_command`): frozen objects are never collected, which a
    process that goes on must not be left with."""
    if _ending:
        gc.collect()
        gc.freeze()


def device_memory_line(peak: int, context: int) -> str:
    """The summary's line of what the process held on the GPU (`turnip generate` and `turnip finetune`)."""
    return f"device memory this process held (the driver, NVML): peak {format_size(peak)}, of which the CUDA context {format_size(context)}"

"""Ctrl-C that cannot be lost.

Python turns SIGINT into a `KeyboardInterrupt` wherever the main thread happens to be. When that is
inside a ctypes callback (llvmlite's object cache while numba compiles, a driver host function),
ctypes prints "Exception ignored ..." with a traceback and swallows it, and the command would go on to
write its outputs as if nothing had happened. `guard()` records every SIGINT as well as raising it,
and hides the swallowed copy; commands call `check()` before anything they write, and the run loop
calls it after every completion through `stop_on_interrupt()`. A swallowed Ctrl-C can also break what
runs after it: numba, interrupted in its object cache's callback during a cold compile, then fails with
"no compiled object yet"; so any exception that leaves `guard()` after a SIGINT is the interrupt. The
module imports nothing of the runtime, so `turnip-opt` starts without it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_pending = False


def _on_sigint(signum, frame) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def _unraisable(hook):
    def quiet(info) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):
            return  # recorded by _on_sigint; check() raises it again where it cannot be swallowed
        hook(info)

    return quiet


def check() -> None:
    """Raise `KeyboardInterrupt` if a SIGINT arrived, even one that something swallowed."""
    if _pending:
        raise KeyboardInterrupt


@contextlib.contextmanager
def guard() -> Iterator[None]:
    global _pending
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; nothing to guard
        return
    _pending = False
    previous, hook = signal.signal(signal.SIGINT, _on_sigint), sys.unraisablehook
    sys.unraisablehook = _unraisable(hook)
    try:
        yield
        check()
    except Exception:
        check()  # a SIGINT came first: what failed after it failed because of it
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook


def stop_on_interrupt():
    """A run-loop callback that stops the run at the next completion after a Ctrl-C swallowed where it landed."""
    from runtime.callbacks import Callback

    class StopOnInterrupt(Callback):
        def vertex_end(self, completion) -> None:
            check()

    return StopOnInterrupt()

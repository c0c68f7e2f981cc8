"""Run functions in forked child processes, a few at a time, and collect what they return.

Fork, not spawn: a child starts with the parent's modules and objects (a closure over a model's config
and the budget) without importing or pickling them, so it costs milliseconds, and only its result is
pickled back through a pipe. What a child does must not touch what a fork does not carry over: it
compiles and simulates, and never uses a GPU the parent may have opened, the parent's threads, or its
terminal. The parent's memory is shared copy-on-write: weights it holds are not copied, as long as the
child does not write them.

A process that holds page-locked memory (a session's weights, registered with the GPU's driver) should
not fork: Linux copies pinned pages into the child at once rather than sharing them. `method="forkserver"`
forks the children from a small server process instead (started once, its imports paid once, about a
second of CPU): the work and its arguments are then pickled to the child, so they must be module-level
functions and plain data.

State: `slots` children at most run at once, each under a key; `wait` returns the results of those that
finished (a `TurnipError` a child raised is raised again here, anything else as a `RuntimeError` with
the child's traceback); `stop` kills one that is no longer wanted, `close` every one left. Where the
start method is not available (`available(method)` is False) callers run their work in process instead.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import traceback
import types
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection, wait
from typing import Any

from turnip_ir.errors import TurnipError
from turnip_ir.pools import physical_cores


def available(method: str = "fork") -> bool:
    return method in multiprocessing.get_all_start_methods()


SLOTS_VARIABLE = "TURNIP_SEARCH_WORKERS"
"""An environment variable that sets `default_slots` (for A/B runs of a search's process count)."""


def default_slots() -> int:
    """How many children run at once by default: one per physical core this process may use. Hyperthreads
    of one core are not counted twice: compiling and simulating are loops over Python objects, and two of
    them on one core's threads share its units, so each candidate, the one the search waits for among
    them, would take longer (not measured: the GPU host has one thread per core, where nothing changes).
    `TURNIP_SEARCH_WORKERS` overrides it."""
    given = os.environ.get(SLOTS_VARIABLE, "").strip()
    if given:
        try:
            return max(1, int(given))
        except ValueError:
            raise TurnipError(f"{SLOTS_VARIABLE}={given!r} is not a whole number of processes") from None
    return physical_cores()


def start_server(preload: tuple[str, ...] = ()) -> None:
    """Start the server `method="forkserver"` children are forked from now, its imports of `preload` paid
    while the caller goes on (0.5 s before the first child's answer on the 2-core VM when it is started
    with the first child), for a caller that may fork from it later (a session, before its weights are
    page-locked). Nothing where the method is not available; a server already running is kept; one that
    cannot start now is left to the first child to start (or to fail there, naming why)."""
    if not available("forkserver"):
        return
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(list(preload))
    try:
        with _main_left_out():
            forkserver.ensure_running()
    except OSError:  # a head start only
        pass


@contextlib.contextmanager
def _main_left_out():
    """A bare `__main__` while a child is started from the server: multiprocessing would have the child
    run the caller's script again (its path goes with the child's preparation), and a script without an
    `if __name__ == "__main__"` guard (a user's, calling a session) would then run its work again in every
    child. The work is a module-level function of an importable module, which needs nothing of `__main__`."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class ForkPool:
    """At most `slots` forked children at once, each computing one function's result; `method` is "fork"
    (from this process) or "forkserver" (from a server process; `preload` names the modules it imports)."""

    def __init__(self, slots: int, method: str = "fork", preload: tuple[str, ...] = ()):
        self.slots = slots
        self.children: dict[Hashable, tuple[multiprocessing.Process, Connection]] = {}
        self.context = multiprocessing.get_context(method)
        if method == "forkserver":
            self.context.set_forkserver_preload(list(preload))

    @property
    def free(self) -> int:
        return self.slots - len(self.children)

    def start(self, key: Hashable, work: Callable[[], Any]) -> None:
        """Fork a child that computes `work()` (a slot must be free and `key` new)."""
        assert self.free > 0 and key not in self.children
        reader, writer = self.context.Pipe(duplex=False)
        child = self.context.Process(target=_child, args=(work, writer), daemon=True)
        gc.freeze()  # the child's collector leaves the parent's objects alone: their pages stay shared
        try:
            with _main_left_out() if self.context.get_start_method() == "forkserver" else contextlib.nullcontext():
                child.start()
        finally:
            gc.unfreeze()
        writer.close()
        self.children[key] = (child, reader)

    def wait(self, timeout: float | None = None) -> list[tuple[Hashable, Any]]:
        """The (key, result) of every child that has finished, waiting up to `timeout` seconds for one."""
        ready = wait([reader for _, reader in self.children.values()], timeout)
        finished = []
        for key, (child, reader) in list(self.children.items()):
            if reader in ready:
                finished.append((key, self._result(key, child, reader)))
        return finished

    def _result(self, key: Hashable, child: multiprocessing.Process, reader: Connection) -> Any:
        try:
            ok, value = reader.recv()
        except EOFError:  # it died without an answer (killed, out of memory)
            ok, value = False, None
        finally:
            reader.close()
            child.join()
            del self.children[key]
        if value is None and not ok:
            value = f"the child process computing {key} ended with exit code {child.exitcode} and no answer"
        if ok:
            return value
        if isinstance(value, TurnipError):
            raise value
        raise RuntimeError(value)

    def stop(self, key: Hashable) -> None:
        """Kill the child computing `key`; its result is dropped."""
        child, reader = self.children.pop(key)
        child.kill()
        child.join()
        reader.close()

    def close(self) -> None:
        for key in list(self.children):
            self.stop(key)

    def __enter__(self) -> ForkPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _child(work: Callable[[], Any], writer: Connection) -> None:
    """In the child: send (True, result), or (False, the TurnipError or the traceback's text)."""
    try:
        answer = (True, work())
    except TurnipError as err:
        answer = (False, err)
    except BaseException:  # noqa: BLE001 (everything is reported to the parent, which raises it)
        answer = (False, traceback.format_exc())
    writer.send(answer)
    writer.close()

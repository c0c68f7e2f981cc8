"""Progress of the commands' long phases on stderr: reading, building, compiling, verifying, preparing, running.

A phase that lasts more than `DELAY` seconds gets a status line when it passes that mark and one with its
time when it ends; shorter phases print nothing. Running has the executor's bar (runtime/callbacks.py
`ProgressBar`, with the same delay). All of it is on only when stderr is a terminal or `--progress` asks,
so scripted and tested output is unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from runtime.callbacks import Callback

DELAY = 2.0
"""Seconds a phase runs silently before it is reported (as tqdm's `delay`)."""


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true", help="report phases longer than 2 s and the run's "
                        "progress on stderr even when it is not a terminal")


class Progress:
    """Status lines for the phases of one command; `enabled` False makes every call a no-op."""

    def __init__(self, enabled: bool, stream: TextIO | None = None, delay: float | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.delay = DELAY if delay is None else delay
        self._current: tuple[str, float, threading.Timer, list[bool]] | None = None

    @classmethod
    def for_args(cls, args: argparse.Namespace) -> "Progress":
        return cls(getattr(args, "progress", False) or sys.stderr.isatty())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end()

    def begin(self, name: str) -> None:
        self.end()
        if not self.enabled:
            return
        shown = [False]
        timer = threading.Timer(self.delay, self._show, (name, shown))
        timer.daemon = True
        self._current = (name, time.perf_counter(), timer, shown)
        if self.delay <= 0:
            self._show(name, shown)  # at once, not racing the phase's end
        else:
            timer.start()

    def end(self) -> None:
        if self._current is None:
            return
        name, began, timer, shown = self._current
        self._current = None
        timer.cancel()
        if timer.is_alive():
            timer.join()
        if shown[0]:
            print(f"turnip: {name}: done in {time.perf_counter() - began:.1f} s", file=self.stream, flush=True)

    def _show(self, name: str, shown: list[bool]) -> None:
        shown[0] = True
        print(f"turnip: {name} ...", file=self.stream, flush=True)

    def until_run_starts(self) -> Callback:
        """A run-loop callback that ends the current phase (preparing) when the executor starts."""
        progress = self

        class EndPhase(Callback):
            def start(self, graph) -> None:
                progress.end()

        return EndPhase()

"""The `turnip` process ends at once after its command (turnip_cli/process.py): its outputs and lines are all
there and its exit code is the command's; called in-process, a command closes its session as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from turnip_cli import process
from turnip_cli.main import main

ROOT = Path(__file__).resolve().parents[1]
GENERATE = ["generate", "--config", "tiny", "--prompt-tokens", "12", "--batch", "2", "--max-new-tokens", "3", "--backend", "cpu"]


def _turnip(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turnip_cli.main", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_process_writes_everything_and_exits_with_the_commands_code(tmp_path):
    done = _turnip(*GENERATE, "--memory", "1MiB", "--outputs", "out.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("end to end: ") for line in lines) and lines[-1] == "wrote out.npz"
    assert main([*GENERATE, "--memory", "1MiB", "--outputs", str(tmp_path / "in.npz")]) == 0
    assert np.array_equal(np.load(tmp_path / "out.npz")["generated"], np.load(tmp_path / "in.npz")["generated"])
    refused = _turnip(*GENERATE, "--memory", "1KiB", "--outputs", "no.npz", cwd=tmp_path)
    assert refused.returncode == 2 and "too small" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert not (tmp_path / "no.npz").exists()


def test_in_process_a_command_closes_its_session(monkeypatch):
    from turnip import session as session_module

    closed = []
    close = session_module.Session.close
    monkeypatch.setattr(session_module.Session, "close", lambda self: (closed.append(self), close(self)))
    assert main([*GENERATE, "--memory", "1MiB"]) == 0
    assert len(closed) == 1 and closed[0].closed
    monkeypatch.setattr(process, "_ending", True)  # the `turnip` entry point's process: left to the operating system
    assert main([*GENERATE, "--memory", "1MiB"]) == 0
    assert len(closed) == 1


def test_the_heap_is_frozen_only_where_the_process_ends_with_the_command(monkeypatch):
    import gc

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    process.settle_heap()
    assert not frozen  # a command called in-process leaves the caller's collector alone
    monkeypatch.setattr(process, "_ending", True)
    process.settle_heap()
    assert frozen == [True]

"""The command line as a new user meets it (issue 47): a Ctrl-C that lands in a ctypes callback during a
cold numba compile still ends in "interrupted"."""

from __future__ import annotations

import ctypes
import signal

import pytest

import turnip_cli.run_cmd
from turnip_cli import interrupt
from turnip_cli.main import main


def _swallowed_ctrl_c() -> None:
    """SIGINT inside a ctypes callback, as in llvmlite's object cache while numba compiles: the handler's
    KeyboardInterrupt is printed as "Exception ignored" (hidden by the guard) and the callback returns."""
    callback = ctypes.CFUNCTYPE(None)(lambda: signal.raise_signal(signal.SIGINT))
    callback()


@pytest.mark.parametrize("then", [RuntimeError("no compiled object yet for <Library 'llama'>"), ValueError("x"), None])
def test_ctrl_c_swallowed_during_a_cold_compile_is_the_interrupted_line(then, monkeypatch, capsys):
    def run(args):
        _swallowed_ctrl_c()
        if then is not None:
            raise then  # what numba raises when it asks the object cache for what the interrupted callback never stored
        return 0

    monkeypatch.setattr(turnip_cli.run_cmd, "run", run)
    assert main(["run", "in.json", "--memory", "1MiB"]) == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["turnip: interrupted"], err


def test_an_error_after_a_swallowed_ctrl_c_is_the_interrupt_not_its_message(monkeypatch, capsys):
    from turnip_ir.errors import KernelError

    def run(args):
        _swallowed_ctrl_c()
        raise KernelError("kernel 'matmul' raised: no compiled object yet")

    monkeypatch.setattr(turnip_cli.run_cmd, "run", run)
    assert main(["run", "in.json", "--memory", "1MiB"]) == 130
    assert capsys.readouterr().err.splitlines() == ["turnip: interrupted"]


def test_an_error_without_a_ctrl_c_is_still_its_own(monkeypatch):
    def run(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(turnip_cli.run_cmd, "run", run)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["run", "in.json", "--memory", "1MiB"])
    assert not interrupt._pending

"""Ctrl-C and slow children in the CLI entry points, through real processes and signals.

A Ctrl-C while the entry point is still importing xDSL or numpy must end in "interrupted" and exit 130,
not a traceback; a `dot` that takes too long or is interrupted must be killed, not left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, not the installed one

# Runs an entry point as its console script does (`from MODULE import main; sys.exit(main())`), with an
# import hook that sleeps when MODULE_TO_STALL is first imported, after touching a marker file: the test
# sends SIGINT while the entry point is inside that import.
STALLED_ENTRY = """
import sys, time
entry, stall, marker = sys.argv[1:4]
class Stall:
    def find_spec(self, name, path=None, target=None):
        if name == stall:
            open(marker, "w").close()
            time.sleep(60)
        return None
sys.meta_path.insert(0, Stall())
sys.argv = [entry, *sys.argv[4:]]
from importlib import import_module
sys.exit(import_module(entry).main())
"""


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)


def _interrupted(proc: subprocess.Popen, tool: str) -> None:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [f"{tool}: interrupted"], err
    assert proc.returncode == 130


@pytest.mark.parametrize("entry,stall,tool,args", [
    ("turnip_cli.opt", "xdsl", "turnip-opt", ["in.mlir"]),
    ("turnip_cli.main", "numpy", "turnip", ["run", "in.json", "--memory", "1MiB"]),
])
def test_ctrl_c_while_importing_is_interrupted_not_a_traceback(tmp_path, entry, stall, tool, args) -> None:
    marker = tmp_path / "importing"
    proc = subprocess.Popen([sys.executable, "-c", STALLED_ENTRY, entry, stall, str(marker), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV)
    _wait_for(marker, proc)
    _interrupted(proc, tool)

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


# A fake graphviz: records its pid (exec keeps it) and the DOT text it was given, then draws or hangs.
FAKE_DOT = """#!/bin/sh
echo $$ > "$FAKE_DOT_DIR/pid"
cat > "$FAKE_DOT_DIR/source.dot"
if [ "$FAKE_DOT_HANG" = 1 ]; then exec sleep 120; fi
echo '<svg/>'
"""


@pytest.fixture
def fake_dot(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dot"
    script.write_text(FAKE_DOT)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOT_DIR", str(tmp_path))
    return tmp_path


def _chain(path: Path, tasks: int) -> Path:
    nodes = [{"id": "x", "op": "input", "device": 0, "shape": [8, 8], "dtype": "float32"}]
    for k in range(tasks):
        nodes.append({"id": f"y{k}", "op": "matmul", "device": 0, "inputs": [nodes[-1]["id"], "x"]})
    path.write_text(json.dumps({"format": "turnip.taskgraph/1", "devices": 1, "nodes": nodes, "outputs": [nodes[-1]["id"]]}))
    return path


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ctrl_c_kills_dot(fake_dot, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_DOT_HANG", "1")
    graph = _chain(fake_dot / "g.json", 5)
    proc = subprocess.Popen([sys.executable, "-m", "turnip_cli.main", "viz", str(graph), "-o", "g.svg"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=fake_dot, env={**os.environ, "PYTHONPATH": str(ROOT)})
    _wait_for(fake_dot / "pid", proc)
    time.sleep(0.2)  # the pid is written before `exec sleep`
    pid = int((fake_dot / "pid").read_text())
    _interrupted(proc, "turnip")
    assert _gone(pid), "dot still runs after turnip viz was interrupted"
    assert not (fake_dot / "g.svg").exists()


def test_slow_dot_is_killed_after_the_timeout(fake_dot, monkeypatch, capsys) -> None:
    from turnip_cli.main import main

    monkeypatch.setenv("FAKE_DOT_HANG", "1")
    monkeypatch.chdir(fake_dot)
    graph = _chain(fake_dot / "g.json", 5)
    assert main(["viz", str(graph), "-o", "g.svg", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["turnip viz: error: dot did not finish drawing in 1 s (killed); draw fewer nodes with --limit N"]
    assert _gone(int((fake_dot / "pid").read_text()))
    assert not (fake_dot / "g.svg").exists()


def test_large_graph_needs_a_limit(fake_dot, monkeypatch, capsys) -> None:
    from turnip_cli.main import main

    monkeypatch.chdir(fake_dot)
    graph = _chain(fake_dot / "g.json", 2100)
    assert main(["viz", str(graph), "-o", "g.svg"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2101 nodes" in err[0] and "--limit N" in err[0], err
    assert not (fake_dot / "pid").exists(), "dot ran on a graph past the limit"
    assert main(["viz", str(graph), "-o", "g.svg", "--limit", "40"]) == 0
    assert capsys.readouterr().out.strip() == "wrote g.svg (the first 40 of 2101 nodes)"
    source = (fake_dot / "source.dot").read_text()
    assert '"y38"' in source or "y38 " in source or "\ty38" in source
    assert "y39" not in source  # x and y0..y38 are the first 40
    assert (fake_dot / "g.svg").read_text().strip() == "<svg/>"


def test_limit_draws_the_first_nodes_of_a_memgraph_and_their_edges(tmp_path, capsys) -> None:
    from turnip_cli.main import main
    from turnip_ir.io import load_graph

    memgraph = Path(__file__).parent / "golden" / "valid" / "memgraph_issue.mlir"
    nodes = load_graph(str(memgraph)).nodes
    assert main(["viz", str(memgraph), "-o", str(tmp_path / "part.dot"), "--limit", "3"]) == 0
    source = (tmp_path / "part.dot").read_text()
    drawn = {str(node.id) for node in nodes[:3]}
    for node in nodes:
        declared = f"\t{node.id} [label=" in source
        assert declared == (str(node.id) in drawn), node.id
    for line in source.splitlines():
        if " -> " in line:
            src, dst = line.split(" [")[0].strip().split(" -> ")
            assert {src, dst} <= drawn, line
    assert main(["viz", str(memgraph), "-o", str(tmp_path / "none.dot"), "--limit", "0"]) == 1
    assert "limit must be 1 or more" in capsys.readouterr().err

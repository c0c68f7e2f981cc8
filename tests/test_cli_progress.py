"""Progress on stderr: a status line for each phase longer than the delay, a run bar that ends at its total,
and nothing at all when stderr is not a terminal and --progress is not given."""

from __future__ import annotations

import io
import time

from frontend.workloads import matmul
from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.callbacks import ProgressBar
from turnip_cli import progress
from turnip_cli.main import main as turnip
from turnip_cli.progress import Progress


def test_a_long_phase_gets_a_line_when_it_passes_the_delay_and_one_when_it_ends() -> None:
    stream = io.StringIO()
    report = Progress(True, stream, delay=0.05)
    with report.phase("quick"):
        pass
    with report.phase("compiling"):
        time.sleep(0.4)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "turnip: compiling ..."
    assert lines[1].startswith("turnip: compiling: done in ") and len(lines) == 2


def test_disabled_progress_prints_nothing() -> None:
    stream = io.StringIO()
    with Progress(False, stream, delay=0.0).phase("compiling"):
        time.sleep(0.1)
    assert stream.getvalue() == ""


def test_the_run_bar_ends_at_its_total(capsys) -> None:
    memgraph = compile_taskgraph(matmul.build(matmul.PRESETS["small"]).taskgraph(), 12288)
    execute(memgraph, backend="sim", callbacks=[ProgressBar(delay=0)])
    last = capsys.readouterr().err.replace("\n", "\r").split("\r")
    drawn = [part for part in last if part.strip()][-1]
    total = len(memgraph.nodes)
    assert f"{total}/{total}" in drawn, drawn


def _taskgraph(tmp_path, capsys) -> str:
    path = str(tmp_path / "g.json")
    assert turnip(["build", "matmul", "-o", path]) == 0
    capsys.readouterr()
    return path


def test_run_reports_its_phases_with_progress(tmp_path, capsys, monkeypatch) -> None:
    path = _taskgraph(tmp_path, capsys)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    assert turnip(["run", path, "--memory", "1MiB", "--backend", "sim", "--progress"]) == 0
    err = capsys.readouterr().err
    assert f"turnip: reading {path} and compiling: done in " in err
    assert "turnip: preparing: done in " in err


def test_run_prints_no_progress_off_a_terminal(tmp_path, capsys, monkeypatch) -> None:
    path = _taskgraph(tmp_path, capsys)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    assert turnip(["run", path, "--memory", "1MiB", "--backend", "sim"]) == 0
    assert capsys.readouterr().err == ""


def test_build_reports_its_phases_with_progress(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(progress, "DELAY", 0.0)
    assert turnip(["build", "matmul", "-o", str(tmp_path / "g.json"), "--progress"]) == 0
    err = capsys.readouterr().err
    assert "turnip: building the taskgraph: done in " in err and f"turnip: writing {tmp_path / 'g.json'}: done in " in err

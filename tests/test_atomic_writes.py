"""Every file turnip writes is written whole or not at all: a failed write keeps the old file, a run
writes its outputs only once everything succeeded, an output never overwrites an input, and concurrent
writers of one path each leave one whole file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from runtime_plans import naive_memgraph

from frontend.workloads import ffn as ffn_workload
from runtime import execute
from tools.synthetic import random_memgraph
from turnip_cli.main import main
from turnip_ir import files
from turnip_ir.errors import InputError

GOOD = "the old, good contents\n"


def _memgraph(tmp_path: Path) -> Path:
    taskgraph = ffn_workload.build(ffn_workload.FfnConfig(layers=1, tokens=4, hidden=8, ffn=16, block=4)).taskgraph()
    path = tmp_path / "mg.json"
    path.write_text(naive_memgraph(taskgraph).dumps())
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _leftovers(folder: Path, *keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def _fail_replace(monkeypatch, after: int = 0):
    """os.replace raises ENOSPC from its (after+1)-th call on, as a full disk would."""
    real = os.replace
    calls = []

    def replace(src, dst, *a, **kw):
        calls.append(dst)
        if len(calls) > after:
            raise OSError(28, "No space left on device")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    return calls


# ----- the writer -------------------------------------------------------------------------------------


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    target.write_text(GOOD)

    def half(handle):
        handle.write(b"half a fi")
        raise OSError(27, "File too large")

    with pytest.raises(InputError, match=f"cannot write {target}: File too large"):
        files.atomic_write(target, half)
    _fail_replace(monkeypatch)
    with pytest.raises(InputError, match=f"cannot write {target}: No space left on device"):
        files.atomic_write(target, "new")
    assert target.read_text() == GOOD
    assert _leftovers(tmp_path, "out.json") == []


def test_a_file_size_limit_keeps_the_old_file(tmp_path):
    """RLIMIT_FSIZE, as `ulimit -f` sets it, stops a real write half-way."""
    target = tmp_path / "big.bin"
    target.write_text(GOOD)
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from turnip_ir.files import atomic_write\n"
        "from turnip_ir.errors import InputError\n"
        "try:\n"
        "    atomic_write(sys.argv[1], b'x' * 100000)\n"
        "except InputError as err:\n"
        "    print(err)\n"
        "    sys.exit(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot write {target}: File too large" in proc.stdout
    assert target.read_text() == GOOD
    assert _leftovers(tmp_path, "big.bin") == []


def test_concurrent_writers_of_one_path_both_succeed_with_whole_contents(tmp_path):
    target = tmp_path / "same.bin"
    contents = [b"a" * 200_000, b"b" * 300_000]
    errors = []

    def write(data):
        try:
            for _ in range(100):
                files.atomic_write(target, data)
        except Exception as err:  # noqa: BLE001 - any failure of either writer fails the test
            errors.append(err)

    threads = [threading.Thread(target=write, args=(data,)) for data in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert target.read_bytes() in contents
    assert _leftovers(tmp_path, "same.bin") == []


def test_the_written_file_has_the_usual_permissions(tmp_path):
    target = tmp_path / "new.json"
    files.atomic_write(target, "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


# ----- what the commands write --------------------------------------------------------------------------


def test_a_failed_trace_write_keeps_the_old_trace(tmp_path, monkeypatch):
    result = execute(random_memgraph(1, vertices=20, devices=1), backend="sim")
    target = tmp_path / "trace.json"
    target.write_text(GOOD)
    _fail_replace(monkeypatch)
    with pytest.raises(InputError, match="cannot write"):
        result.recorder.write_trace(target)
    assert target.read_text() == GOOD


@pytest.mark.parametrize("suffix", ["dot", "svg"])
def test_a_failed_picture_write_keeps_the_old_picture(tmp_path, monkeypatch, capsys, suffix):
    if suffix == "svg":
        from turnip_ir.dot import have_dot

        if not have_dot():
            pytest.skip("the graphviz 'dot' binary is not installed")
    source = _memgraph(tmp_path)
    target = tmp_path / f"picture.{suffix}"
    target.write_text(GOOD)
    _fail_replace(monkeypatch)
    assert main(["viz", str(source), "-o", str(target)]) == 1
    assert f"cannot write {target}: No space left on device" in _one_line(capsys)
    assert target.read_text() == GOOD
    assert _leftovers(tmp_path, "mg.json", target.name) == []


def test_a_failed_timeline_write_keeps_the_old_picture(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "trace.json"
    execute(random_memgraph(1, vertices=20, devices=1), backend="sim").recorder.write_trace(trace)
    target = tmp_path / "timeline.svg"
    target.write_text(GOOD)
    _fail_replace(monkeypatch)
    assert main(["viz", str(trace), "-o", str(target)]) == 1
    assert f"cannot write {target}" in _one_line(capsys)
    assert target.read_text() == GOOD


def test_save_sharded_writes_its_index_atomically(tmp_path, monkeypatch):
    from frontend.safetensors import INDEX_FILE, save_sharded

    (tmp_path / INDEX_FILE).write_text(GOOD)
    _fail_replace(monkeypatch, after=2)  # both shards written, then the index fails
    with pytest.raises(InputError, match=f"cannot write {tmp_path / INDEX_FILE}"):
        save_sharded({"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)}, tmp_path)
    assert (tmp_path / INDEX_FILE).read_text() == GOOD


def test_a_run_that_fails_on_the_trace_keeps_the_old_outputs(tmp_path, monkeypatch, capsys):
    source = _memgraph(tmp_path)
    outputs, trace = tmp_path / "out.npz", tmp_path / "trace.json"
    outputs.write_text(GOOD)
    trace.write_text(GOOD)
    real = files._write_temporary

    def no_trace(target, data):
        if Path(target).name == "trace.json":
            raise OSError(28, "No space left on device")
        return real(target, data)

    monkeypatch.setattr(files, "_write_temporary", no_trace)
    assert main(["run", str(source), "--backend", "cpu", "--outputs", str(outputs), "--trace", str(trace)]) == 1
    assert f"cannot write {trace}: No space left on device" in _one_line(capsys)
    assert outputs.read_text() == GOOD and trace.read_text() == GOOD
    assert _leftovers(tmp_path, "mg.json", "out.npz", "trace.json") == []


def test_run_says_what_it_wrote(tmp_path, capsys):
    source = _memgraph(tmp_path)
    outputs, trace = tmp_path / "out.npz", tmp_path / "trace.json"
    assert main(["run", str(source), "--backend", "cpu", "--outputs", str(outputs), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {outputs}" in out and f"wrote {trace}" in out
    with np.load(outputs) as data:
        assert data.files
    assert json.loads(trace.read_text())["traceEvents"]


def test_explain_json_says_what_it_wrote(tmp_path, capsys):
    source = _memgraph(tmp_path)
    report = tmp_path / "why.json"
    assert main(["explain", str(source), "--json", str(report)]) == 0
    assert f"wrote {report}" in capsys.readouterr().out
    assert json.loads(report.read_text())


# ----- an output is never an input ---------------------------------------------------------------------


def test_run_refuses_to_overwrite_its_input(tmp_path, capsys, monkeypatch):
    source = _memgraph(tmp_path)
    before = source.read_text()
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(source), "--backend", "cpu", "--outputs", "mg.json"]) == 1
    line = _one_line(capsys)
    assert "--outputs mg.json is the input file" in line
    assert main(["run", str(source), "--backend", "sim", "--trace", str(tmp_path / "." / "mg.json")]) == 1
    assert "--trace" in _one_line(capsys)
    assert main(["run", str(source), "--backend", "cpu", "--trace", "t.json", "--outputs", "./t.json"]) == 1
    assert "--trace t.json is also --outputs ./t.json" in _one_line(capsys)
    assert source.read_text() == before and not (tmp_path / "t.json").exists()


def test_run_refuses_to_overwrite_its_inputs_npz(tmp_path, capsys):
    source = _memgraph(tmp_path)
    inputs = tmp_path / "in.npz"
    np.savez(inputs)
    assert main(["run", str(source), "--backend", "cpu", "--inputs", str(inputs), "--outputs", str(inputs)]) == 1
    assert "is the input file" in _one_line(capsys)


def test_a_symlink_to_the_input_is_the_input(tmp_path, capsys):
    source = _memgraph(tmp_path)
    before = source.read_text()
    (tmp_path / "link.json").symlink_to(source)
    assert main(["viz", str(source), "-o", str(tmp_path / "link.json")]) == 1
    assert "is the input file" in _one_line(capsys)
    assert source.read_text() == before


def test_viz_refuses_to_overwrite_its_input(tmp_path, capsys):
    picture = tmp_path / "g.dot"
    picture.write_text("digraph {}")
    assert main(["viz", str(picture), "-o", str(picture)]) == 1
    assert "is the input file" in _one_line(capsys)
    assert picture.read_text() == "digraph {}"


def test_explain_refuses_to_overwrite_its_input(tmp_path, capsys):
    source = _memgraph(tmp_path)
    before = source.read_text()
    assert main(["explain", str(source), "--json", str(source)]) == 1
    assert "--json" in _one_line(capsys)
    assert source.read_text() == before


def test_turnip_opt_refuses_to_overwrite_its_input(tmp_path):
    source = _memgraph(tmp_path)
    before = source.read_text()
    proc = subprocess.run([sys.executable, "-m", "turnip_cli.opt", str(source), "-o", str(source)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "is the input file" in proc.stderr and "Traceback" not in proc.stderr
    assert source.read_text() == before


# ----- naming things ------------------------------------------------------------------------------------


def test_viz_without_o_names_the_picture_after_its_input(tmp_path, capsys, monkeypatch):
    source = _memgraph(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr("turnip_ir.dot.have_dot", lambda: True)
    monkeypatch.setattr("turnip_ir.dot.run_dot", lambda source, suffix, timeout: b"<svg/>")
    assert main(["viz", str(source)]) == 0
    assert (work / "mg.svg").read_bytes() == b"<svg/>"
    assert "wrote mg.svg" in capsys.readouterr().out
    assert not (work / "graph.svg").exists()


def test_a_trace_given_as_a_graph_is_named_as_a_trace(tmp_path, capsys):
    trace = tmp_path / "g.json"
    execute(random_memgraph(1, vertices=20, devices=1), backend="sim").recorder.write_trace(trace)
    assert main(["run", str(trace), "--backend", "sim"]) == 1
    assert f"{trace} is a run trace, not a taskgraph or memgraph: view it with turnip viz" in _one_line(capsys)


def test_the_sim_makespan_is_labelled_as_predicted(tmp_path, capsys):
    source = _memgraph(tmp_path)
    assert main(["run", str(source), "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    assert "predicted makespan" in out and "(sim)" in out
    assert main(["run", str(source), "--backend", "cpu"]) == 0
    assert "predicted" not in capsys.readouterr().out

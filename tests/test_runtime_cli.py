"""`turnip run` through a subprocess: exit codes, one-line errors, outputs and trace files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from kernel_formulas import evaluate
from runtime_plans import naive_memgraph

from tools.random_graphs import random_taskgraph
from frontend.workloads import ffn as ffn_workload

TURNIP = [sys.executable, "-m", "turnip_cli.main", "run"]


def _turnip(*args, **kw) -> subprocess.CompletedProcess:
    """`turnip run` as a user runs it: the real CUDA driver, not the simulator the test session uses."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout, also from another cwd
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": root}
    return subprocess.run([*TURNIP, *map(str, args)], capture_output=True, text=True, timeout=120, env=env, **kw)


def _one_line_error(proc, code, text):
    assert proc.returncode == code, proc.stderr
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _one_layer_ffn():
    return ffn_workload.build(ffn_workload.FfnConfig(layers=1, tokens=4, hidden=8, ffn=16, block=4)).taskgraph()


@pytest.fixture
def ffn(tmp_path):
    taskgraph = ffn_workload.build(ffn_workload.FfnConfig(layers=3, tokens=16, hidden=32, ffn=64, block=16, gpus=2, placement="layers")).taskgraph()
    path = tmp_path / "ffn.json"
    path.write_text(taskgraph.dumps())
    return taskgraph, path


def test_taskgraph_is_compiled_run_and_outputs_match_reference(ffn, tmp_path):
    taskgraph, path = ffn
    inputs = {task: np.random.default_rng(7).standard_normal(node.shape).astype(np.float32)
              for task, node in taskgraph.nodes.items() if node.op == "input"}
    np.savez(tmp_path / "in.npz", **inputs)
    proc = _turnip(path, "--memory", "24KiB", "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz",
                   "--trace", tmp_path / "trace.json", "--order", "random", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert "reloaded" in proc.stdout and "busy" in proc.stdout and "peak arena use" in proc.stdout
    with np.load(tmp_path / "out.npz") as out:
        expected = evaluate(taskgraph, inputs)
        assert set(out.files) == set(expected)
        for task in expected:
            np.testing.assert_allclose(out[task], expected[task], rtol=1e-4, atol=1e-3)
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {"gpu0 compute0", "gpu0 h2d", "gpu0 d2h", "gpu1 peer"} <= names
    assert any(e["ph"] == "X" and e["name"] == "up0 einsum" for e in trace)


def test_memgraph_file_runs_on_sim(tmp_path):
    path = tmp_path / "mg.json"
    path.write_text(naive_memgraph(random_taskgraph(2, tasks=20)).dumps())
    proc = _turnip(path, "--backend", "sim", "--order", "fixed", "--jitter", "0.2")
    assert proc.returncode == 0, proc.stderr
    assert "backend sim, order fixed" in proc.stdout


@pytest.mark.parametrize(
    "args, code, text",
    [
        (["--backend", "cuda"], 1, "the cuda backend needs an NVIDIA GPU"),
        (["--memory", "lots"], 1, "memory size 'lots'"),
        (["--memory", "1KiB"], 2, "budget"),
        (["--backend", "sim", "--outputs", "o.npz"], 1, "--outputs needs --backend cpu"),
        (["--inputs", "missing.npz"], 1, "inputs file 'missing.npz' does not exist"),
        (["--outputs", "no/such/dir/o.npz"], 1, "cannot write no/such/dir/o.npz: its folder does not exist"),
        (["--trace", "no/such/dir/t.json"], 1, "cannot write no/such/dir/t.json: its folder does not exist"),
        (["--jitter", "-1"], 1, "--jitter must be a finite number, 0 or more"),
        (["--streams", "0"], 1, "streams must be at least 1"),
    ],
)
def test_user_errors_are_one_line(ffn, tmp_path, args, code, text):
    _, path = ffn
    args = ["--memory", "1MiB", *args] if "--memory" not in args else args
    _one_line_error(_turnip(path, *args, cwd=tmp_path), code, text)


def test_wrongly_shaped_and_unknown_inputs_are_named(ffn, tmp_path):
    _, path = ffn
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 3), np.float32))
    _one_line_error(_turnip(path, "--memory", "1MiB", "--inputs", tmp_path / "bad.npz"), 1, "input 'x': shape [3, 3]")
    np.savez(tmp_path / "extra.npz", nope=np.zeros(3, np.float32))
    _one_line_error(_turnip(path, "--memory", "1MiB", "--inputs", tmp_path / "extra.npz"), 1, "input 'nope'")


def test_failing_kernel_names_the_vertex_and_writes_no_outputs(tmp_path, monkeypatch, capsys):
    from runtime.kernels_numpy import NUMPY_KERNELS
    from turnip_cli.main import main

    def broken(xs, out, attrs):
        raise FloatingPointError("overflow")

    monkeypatch.setitem(NUMPY_KERNELS, "gelu", broken)  # in-process: no plan that checks can make numpy raise
    doc = json.loads(naive_memgraph(_one_layer_ffn()).dumps())
    act = next(node for node in doc["nodes"] if node["task"] == "act0")
    (tmp_path / "mg.json").write_text(json.dumps(doc))
    assert main(["run", str(tmp_path / "mg.json"), "--backend", "cpu", "--outputs", str(tmp_path / "out.npz")]) == 4
    err = capsys.readouterr().err
    assert f"node {act['id']} (gelu 'act0') failed: FloatingPointError: overflow" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.npz").exists()


def test_declared_shape_that_would_broadcast_is_refused_before_running(tmp_path):
    doc = json.loads(naive_memgraph(_one_layer_ffn()).dumps())
    act = next(node for node in doc["nodes"] if node["task"] == "act0")
    act["shape"] = [2, 4, 16]  # numpy would broadcast gelu's [4, 16] into it and run on
    (tmp_path / "mg.json").write_text(json.dumps(doc))
    proc = _turnip(tmp_path / "mg.json", "--no-verify", "--outputs", tmp_path / "out.npz")
    _one_line_error(proc, 1, f"node {act['id']} (gelu 'act0'): declared [2, 4, 16] float32 but gelu computes [4, 16] float32")


def test_unknown_kernel_is_an_error(tmp_path):
    doc = json.loads(naive_memgraph(_one_layer_ffn()).dumps())
    next(node for node in doc["nodes"] if node["task"] == "act0")["kernel"] = "frobnicate"
    (tmp_path / "mg.json").write_text(json.dumps(doc))
    _one_line_error(_turnip(tmp_path / "mg.json"), 1, "unknown kernel 'frobnicate'")


def test_ctrl_c_stops_cleanly(tmp_path):
    """Ctrl-C in the middle of the run: the progress bar (`--progress`, drawn once the run has lasted 2 s;
    the run, slowed by jitter, lasts about 15 s) says the loop is running, whatever the machine's speed or
    load; waiting for CPU seconds instead raced the end of the run once numba's cache was warm."""
    path = tmp_path / "big.json"
    path.write_text(naive_memgraph(random_taskgraph(5, tasks=400)).dumps())
    proc = subprocess.Popen([*TURNIP, str(path), "--jitter", "0.25", "--progress", "--outputs", str(tmp_path / "o.npz")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen, deadline = b"", time.monotonic() + 90
    while b"vertex/s" not in seen and time.monotonic() < deadline:
        chunk = os.read(proc.stderr.fileno(), 4096)  # blocks until the process writes (or ends: b"")
        if not chunk:
            break
        seen += chunk
    assert b"vertex/s" in seen and proc.poll() is None, seen.decode(errors="replace")[-2000:]
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=30)
    err = (seen + rest).decode(errors="replace")
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "o.npz").exists()


def test_a_ctrl_c_that_a_ctypes_callback_swallows_still_stops(capsys):
    """CI once sent the Ctrl-C above while numba compiled: llvmlite's ctypes callback ate it and the run wrote outputs."""
    import ctypes

    from turnip_cli import interrupt

    before = signal.getsignal(signal.SIGINT)  # not always Python's default: a shell's background job ignores SIGINT

    @ctypes.CFUNCTYPE(None)
    def callback():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs here, inside the callback, and ctypes swallows its exception
            pass

    with pytest.raises(KeyboardInterrupt):
        with interrupt.guard():
            callback()
            reached = True
    assert reached  # the interrupt was swallowed where it landed, and raised again by the guard
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before


def test_a_given_memgraph_with_a_race_is_refused_unless_told(tmp_path):
    from pathlib import Path

    race = Path(__file__).parent / "golden_passes" / "verify_race.mlir"
    proc = _turnip(race)
    _one_line_error(proc, 3, "race: node 3 (exp 'c') overwrites [1024, 2048) on GPU 0")
    assert _turnip(race, "--no-verify").returncode == 0


def test_schedule_auto_compiles_every_schedule_and_says_which_the_sim_chose(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(random_taskgraph(3, tasks=60, devices=1, sizes=(64, 128)).dumps())
    proc = _turnip(path, "--memory", "200KiB", "--backend", "sim", "--schedule", "auto")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("schedule auto: "))
    chosen = line.split()[2]
    assert chosen in ("given", "dfs", "memory") and all(f"{s} " in line for s in ("given", "dfs", "memory"))
    _one_line_error(_turnip(path, "--memory", "200KiB", "--backend", "sim", "--schedule", "fastest"), 2, "--schedule")


def test_a_huge_budget_allocates_only_the_plans_peak(ffn):
    """Issue 27 item 8: the cpu backend allocated the whole budget (64 GiB: numpy's _ArrayMemoryError)."""
    _, path = ffn
    proc = _turnip(path, "--memory", "1e18", "--backend", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "peak arena use" in proc.stdout


@pytest.mark.parametrize("memory", ["1e23", "4611686018427387904", "5e9GiB"])
def test_an_absurd_memory_size_is_refused_in_one_line(ffn, memory):
    _, path = ffn
    _one_line_error(_turnip(path, "--memory", memory), 1, f"memory size '{memory}' is 2**62 bytes or more")


def test_a_storage_region_past_host_memory_is_refused_before_running(ffn, tmp_path):
    """Issue 27 item 9: a storage offset of 2**50 passed validation, then failed allocating a petabyte."""
    from passes.pipeline import compile_taskgraph

    doc = json.loads(compile_taskgraph(ffn[0], 24 << 10).dumps())
    node = next(n for n in doc["nodes"] if n.get("storage"))
    node["storage"][0] = 2**50
    path = tmp_path / "far.json"
    path.write_text(json.dumps(doc))
    _one_line_error(_turnip(path, "--backend", "cpu"), 1, "of host memory for the GPU arenas and the CPU storage, but only")

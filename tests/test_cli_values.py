"""The values of the commands' flags, checked before any work: each bad one is a single line naming the
flag, on every command that takes it (`--seed`, `--gpus`, `turnip viz --timeout`, `turnip run --jitter`,
`turnip explain --streams`), never a traceback or minutes of work."""

from __future__ import annotations

import json
import signal

import pytest

from frontend.workloads import matmul
from passes.pipeline import compile_taskgraph
from turnip_cli.main import main as turnip


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(compile_taskgraph(matmul.build(matmul.PRESETS["small"]).taskgraph(), 12288).to_json()))
    return path


@pytest.fixture(autouse=True)
def deadline():
    """A flag that starts minutes of work fails the test after 20 s instead."""
    def expired(*_):
        raise TimeoutError("still running after 20 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _one_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


COMMANDS = {
    "llama": ["llama", "--config", "tiny", "--tokens", "8", "--memory", "1MiB", "--backend", "cpu"],
    "generate": ["generate", "--config", "tiny", "--prompt-tokens", "4", "--max-new-tokens", "1", "--memory", "1MiB",
                 "--backend", "cpu"],
    "run": ["run", "{plan}", "--backend", "cpu"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("seed", ["-1", str(2**62), "99999999999999999999999"])
def test_a_seed_numpy_cannot_take_is_one_line(capsys, plan, command, seed):
    argv = [a.format(plan=plan) for a in COMMANDS[command]]
    assert turnip([*argv, "--seed", seed]) == 1
    assert _one_line(capsys).endswith(f"error: --seed must be an integer from 0 to 2**62 - 1, got {seed[:77]}"
                                      + ("..." if len(seed) > 80 else ""))


@pytest.mark.parametrize("argv", [
    ["llama", "--config", "tiny", "--tokens", "8", "--memory", "1MiB", "--backend", "sim"],
    ["generate", "--config", "tiny", "--prompt-tokens", "4", "--max-new-tokens", "1", "--memory", "1MiB", "--backend", "sim"],
    ["build", "llama", "-o", "{tmp}/g.json"],
], ids=["llama", "generate", "build"])
def test_a_hundred_thousand_gpus_are_one_line(tmp_path, capsys, argv):
    assert turnip([*[a.format(tmp=tmp_path) for a in argv], "--gpus", "100000"]) == 1
    assert _one_line(capsys).endswith("error: --gpus must be at most 1024, got 100000")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("timeout", ["nan", "inf", "-inf", "0", "-1", "1e300"])
def test_viz_timeout_must_be_a_finite_positive_number_of_seconds(tmp_path, capsys, plan, timeout):
    assert turnip(["viz", str(plan), "-o", str(tmp_path / "g.svg"), f"--timeout={timeout}"]) == 1
    assert "error: --timeout must be a number of seconds above 0 and at most 86400, got" in _one_line(capsys)
    assert not (tmp_path / "g.svg").exists()


@pytest.mark.parametrize("jitter", ["nan", "inf", "-0.5"])
def test_run_jitter_must_be_finite(capsys, plan, jitter):
    assert turnip(["run", str(plan), "--backend", "cpu", "--jitter", jitter]) == 1
    assert "error: --jitter must be a finite number, 0 or more, got" in _one_line(capsys)


def test_explain_streams_must_be_positive(capsys, plan):
    assert turnip(["explain", str(plan), "--streams", "0"]) == 1
    assert _one_line(capsys).endswith("error: --streams must be a positive integer, got 0")


# ----- counts bounded before anything is allocated or run --------------------------------------------------------

GENERATE = ["generate", "--config", "tiny", "--memory", "1MiB"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt-tokens", "100000000", "--max-new-tokens", "1"], "--prompt-tokens must be at most 16777216, got 100000000"),
    (["--prompt-tokens", "4", "--max-new-tokens", str(10**12)], "--max-new-tokens must be at most 1048576, got 1000000000000"),
    (["--prompt-tokens", "4", "--max-new-tokens", "100000000", "--backend", "sim"], "--max-new-tokens must be at most 1048576"),
    (["--prompt-tokens", "4", "--batch", "100000000", "--max-new-tokens", "1"], "--batch must be at most 65536"),
    (["--prompt-tokens", "0", "--max-new-tokens", "1"], "--prompt-tokens must be a positive integer, got 0"),
])
def test_generate_counts_past_their_bounds_are_one_line(capsys, monkeypatch, argv, message):
    monkeypatch.setattr("frontend.workloads.llama.random_ids", _never)
    assert turnip([*GENERATE, "--backend", "cpu", *argv]) == 1
    assert f"error: {message}" in _one_line(capsys)


def _never(*_):
    raise AssertionError("token ids drawn before the check")


@pytest.mark.parametrize("backend, parts", [
    ("cpu", ["weights", "activations of 1000000 tokens", "cpu arenas", "KV cache", "token ids"]),
    ("sim", ["token ids"]),
])
def test_generate_holds_the_run_against_host_memory_before_drawing_prompts(capsys, monkeypatch, backend, parts):
    monkeypatch.setattr("frontend.workloads.llama.random_ids", _never)
    monkeypatch.setattr("turnip_cli.llama_cmd.available_bytes", lambda: 1 << 20)
    assert turnip([*GENERATE, "--backend", backend, "--prompt-tokens", "1000000", "--batch", "2", "--max-new-tokens", "100"]) == 1
    line = _one_line(capsys)
    assert "error: host memory: the run needs" in line and "(1.00 MiB) are available" in line
    listed = line[line.index("bytes (") + 7 : line.index(") but")]
    assert [part.rsplit(" ", 2)[0] for part in listed.split(", ")] == parts


def test_the_kv_cache_of_many_new_tokens_is_counted(capsys, monkeypatch):
    """tiny: 2 layers of k and v, 4 kv heads of 16 in float32, so 1024 bytes a row; 1M rows are 1 GiB."""
    monkeypatch.setattr("turnip_cli.llama_cmd.available_bytes", lambda: 1 << 30)
    assert turnip([*GENERATE, "--backend", "cpu", "--prompt-tokens", "4", "--max-new-tokens", str(1 << 20)]) == 1
    assert "KV cache 1.001 GiB" in _one_line(capsys)  # 2^20 rows of 1 KiB and the prompt's: just over 1 GiB


# ----- one bound for turnip-opt's options and turnip run's plans ------------------------------------------------

@pytest.mark.parametrize("budget, code", [("99999999999999999999999", 1), (str(2**62), 1), (str(2**62 - 1), 0)])
def test_turnip_opt_holds_a_budget_to_the_bound_turnip_run_holds_a_plan_to(tmp_path, capsys, budget, code):
    from turnip_cli.opt import main as turnip_opt

    graph, plan = tmp_path / "g.json", tmp_path / "plan.json"
    graph.write_text(json.dumps(matmul.build(matmul.PRESETS["small"]).taskgraph().to_json()))
    assert turnip_opt([str(graph), "-p", f"turnip-memgraph{{budget={budget}}}", "--emit", "json", "-o", str(plan)]) == code
    if code:
        assert _one_line(capsys).endswith(f"error: turnip-memgraph: option budget={budget} is out of range "
                                          "(magnitude must stay below 2**62)")
        assert not plan.exists()
        return
    capsys.readouterr()
    assert turnip(["run", str(plan), "--backend", "sim"]) == 0, capsys.readouterr().err  # what one writes, the other runs

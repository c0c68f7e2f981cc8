"""bench/bench_generation.py on the CPU (`--quick`: tiny-gqa, cpu backend, torch CPU), so the GPU benchmark of
issue 44 cannot rot: every stage runs and records its figures, the hand-written prefill is checked (and the check
fails on a wrong prefill), the session's greedy tokens equal the hand run's, the command runs as a child three
times with its summary read, and the budget verdicts follow the device memory a stand-in nvidia-smi reports
(peak <= budget + the probe's context), through bench/gpu_check.py's memory section too, which fails loudly."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

pytest.importorskip("torch")

import bench_generation  # noqa: E402

MIB = 1 << 20
FAKE_SMI = '''#!{python}
"""nvidia-smi for tests: lists `turnip generate`, `turnip llama` and the numba context probe by their command
lines, among the processes of this test (its token in their environment)."""
import os, sys, time
RULES = (("generate", "FAKE_GENERATE_MIB"), ("llama", "FAKE_LLAMA_MIB"))
TOKEN = ("FAKE_SMI_TOKEN=" + os.environ["FAKE_SMI_TOKEN"]).encode()
def listing():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace").split("\\0")
            ours = TOKEN in open(f"/proc/{{pid}}/environ", "rb").read().split(b"\\0")
        except OSError:
            continue
        if not ours:
            continue
        if "turnip_cli.main" in words:
            for word, key in RULES:
                if word in words:
                    print(f"{{pid}}, {{os.environ[key]}}", flush=True)
        elif any("current_context" in w for w in words) and not any("nvidia-smi" in w for w in words):
            print(f"{{pid}}, {{os.environ['FAKE_CONTEXT_MIB']}}", flush=True)
if "-lms" in sys.argv:
    while True:
        listing()
        time.sleep(0.1)
listing()
'''


def fake_nvidia_smi(tmp_path: Path, generate: int, llama: int, context: int) -> dict:
    """An environment whose nvidia-smi reports these MiB for the children."""
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "FAKE_GENERATE_MIB": str(generate),
            "FAKE_LLAMA_MIB": str(llama), "FAKE_CONTEXT_MIB": str(context), "FAKE_SMI_TOKEN": str(tmp_path)}


def bench(*options: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "bench_generation.py"), "--quick", *options],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def table_row(stdout: str, figure: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith(f"| {figure}"))


def test_the_in_process_stages_run_and_agree_with_the_hand_written_prefill_and_decoder(tmp_path):
    out = tmp_path / "g.json"
    done = bench("--stages", "hand", "session", "batch1", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.rstrip().splitlines()[-1].startswith("wrote ")
    stages = json.loads(out.read_text())["stages"]
    hand, session, batch1 = stages["hand"], stages["session"], stages["batch1"]
    assert hand["check"]["met"] and hand["check"]["against_decoder"] < 1e-4, hand["check"]
    assert hand["whole_s"] == pytest.approx(hand["prefill_s"] + sum(hand["step_s"])) and len(hand["step_s"]) == 4
    main = session["main"]
    assert np.array_equal(main["tokens"], hand["tokens"])  # the same model, prompts and greedy steps, float32
    assert main["backends_built"] == 1 and main["prefill_s"] > 0 and main["first_token_s"] <= main["call_s"]
    assert session["wide"]["batch"] == 6 and len(session["wide"]["step_s"]) == 2
    assert session["llama"]["tokens"] == 30 and session["llama"]["run_s"] > 0 and len(session["llama"]["runs_s"]) == 2
    assert batch1["floor_s"] == pytest.approx(batch1["weight_bytes"] / batch1["h2d_bytes_per_s"])
    assert batch1["steady_over_floor"] == pytest.approx(batch1["steady_step_s"] / batch1["floor_s"])
    assert Path(batch1["trace"]).is_file() and len(batch1["tokens"][0]) == 3
    assert "| yes |" in table_row(done.stdout, "hand prefill check")
    assert "| yes |" in table_row(done.stdout, "session backends built")


def test_the_prefill_check_fails_on_a_prefill_with_the_wrong_positions(monkeypatch):
    import torch  # noqa: F401  (the check's)

    real = bench_generation.rope_tables
    bench = bench_generation.Bench(bench_generation.parse(["--quick", "--json", os.devnull]))
    assert bench_generation.check_prefill(bench)["met"]
    monkeypatch.setattr(bench_generation, "rope_tables", lambda config, tokens: tuple(t[1:] for t in real(config, tokens + 1)))
    wrong = bench_generation.check_prefill(bench)
    assert not wrong["met"] and wrong["against_decoder"] > 1e-2 and wrong["against_resident"] == 0


@pytest.mark.slow  # five fresh processes, each importing the toolkit
def test_the_command_and_the_budget_stages_follow_the_sampled_device_memory(tmp_path):
    out = tmp_path / "c.json"
    env = fake_nvidia_smi(tmp_path, generate=50, llama=500, context=100)
    done = bench("--stages", "command", "budget", "--json", str(out), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    stages = json.loads(out.read_text())["stages"]
    runs = stages["command"]["runs"]
    assert list(runs) == ["first", "warm", "warm, plans read"]
    for run in runs.values():
        assert run["returncode"] == 0 and run["device_peak"] == 50 * MIB and run["sampler"] == "nvidia-smi, by pid", run
        assert run["wall_s"] > run["end_to_end_s"] > 0
        assert run["steady_step_ms"] > 0 and any(line.startswith("decode 4 step(s)") for line in run["summary"])
    assert "plan(s) read from --plan-dir" in runs["warm, plans read"]["summary"][0] and "read from" not in runs["warm"]["summary"][0]
    budget = stages["budget"]
    assert budget["context"]["device_peak"] == 100 * MIB
    checks = budget["checks"]
    assert [c["met"] for c in checks.values()] == [True, True, True, False], checks
    llama = checks["llama 24 at 1MiB"]
    assert llama["limit"] == MIB + 100 * MIB and llama["margin"] == llama["limit"] - 500 * MIB
    assert table_row(done.stdout, "budget: llama 24 at 1MiB").endswith("| NO |")
    assert table_row(done.stdout, "budget: command (warm)").endswith("| yes |")
    assert not any(Path(run["command"].split()[3]).parent.exists() for run in runs.values())  # --quick's folder is removed


@pytest.mark.slow  # three fresh processes
def test_gpu_checks_memory_section_fails_loudly_above_budget_and_context(tmp_path):
    env = {**fake_nvidia_smi(tmp_path, generate=5000, llama=50, context=100), "OUT": str(tmp_path / "out")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--no-tests", "--sections", "memory",
                           "--memory-options=--quick"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith("MEMORY CHECK FAILED")]
    assert failed and all("budget: generate" in line for line in failed), done.stdout[-2000:]
    checks = json.loads((tmp_path / "out" / "memory.json").read_text())["stages"]["budget"]["checks"]
    assert {name: check["met"] for name, check in checks.items()} == {"generate": False, "llama 24 at 1MiB": True}


def test_nvidia_smis_listing_is_read_line_by_line():
    text = "123, 4567\r\n[N/A], 12\nNo running processes found\n  89 ,  0\n"
    assert bench_generation.parse_apps(text) == {123: 4567, 89: 0}


def test_a_peak_at_the_limit_keeps_the_budget_and_one_byte_more_does_not():
    assert bench_generation.verdict(5 * MIB, 4 * MIB, MIB)["met"]
    over = bench_generation.verdict(5 * MIB + 1, 4 * MIB, MIB)
    assert over["met"] is False and over["margin"] == -1
    assert bench_generation.verdict(None, 4 * MIB, MIB)["met"] is None and bench_generation.verdict(MIB, 4 * MIB, None)["met"] is None


def test_the_summary_reader_matches_what_turnip_generate_prints():
    from turnip.session import GenerateResult
    from turnip_cli.generate_cmd import summary_lines

    result = GenerateResult(np.zeros((2, 3), np.int64), prefill_seconds=1.25, step_seconds=[0.9, 0.5, 0.5], call_seconds=3.5,
                            first_token_seconds=2.25, compile_seconds=0.75, compiles=2, step_bytes_placed=[10, 1, 1],
                            device_peak=4608 * MIB, device_context=512 * MIB)
    figures = bench_generation.summary_figures("noise\n" + "\n".join(summary_lines(result, 0.5, 4.0)) + "\nwrote x\n")
    assert figures["prefill_s"] == 1.25 and figures["first_token_s"] == 2.25 and figures["steady_step_ms"] == 500.0
    assert figures["end_to_end_s"] == 4.0 and figures["compile_s"] == 0.75 and figures["load_s"] == 0.5
    assert figures["own_device_peak"] == 4608 * MIB and figures["own_context"] == 512 * MIB
    assert all(not line.startswith(("noise", "wrote")) for line in figures["summary"])
    llama = bench_generation.summary_figures("cuda: device memory this process holds (the driver, NVML): peak 2.50 GiB on the worst GPU "
                                             "['2.50 GiB'], of which the CUDA context 500.00 MiB\n")
    assert llama["own_device_peak"] == 2560 * MIB and llama["own_context"] == 500 * MIB


def test_the_budget_check_takes_the_childs_own_report_where_nothing_was_sampled_and_fails_a_failed_child():
    run = {"device_peak": None, "sampler": "nvidia-smi not found", "returncode": 0, "own_device_peak": 5 * MIB, "own_context": MIB}
    check = bench_generation.budget_check(run, 4 * MIB, None, keep=False)
    assert check["met"] and check["limit"] == 5 * MIB and "own NVML report" in check["sampler"] and "run" not in check
    sampled = bench_generation.budget_check({**run, "device_peak": 6 * MIB, "sampler": "nvidia-smi, by pid"}, 4 * MIB, 3 * MIB, keep=True)
    assert sampled["met"] and sampled["peak"] == 6 * MIB and sampled["context"] == 3 * MIB and sampled["run"]["device_peak"] == 6 * MIB
    failed = bench_generation.budget_check({**run, "returncode": 1, "error": "out of memory"}, 4 * MIB, None, keep=False)
    assert failed["met"] is False and failed["error"] == "out of memory"

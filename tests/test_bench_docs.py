"""`make bench` (bench/run_all.py) writes every CPU table of docs/benchmarks.md between its markers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run_all  # noqa: E402


def test_every_job_has_its_markers_and_script() -> None:
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    for job in run_all.JOBS:
        assert (ROOT / "bench" / job.args[0]).exists()
        for name in job.tables:
            assert doc.count(f"<!-- bench:{name} -->") == 1 and doc.count(f"<!-- /bench:{name} -->") == 1, name


def test_tables_are_taken_in_order_and_text_around_them_is_kept() -> None:
    output = "header line\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\nnote\n| c |\n| --- |\n| 3 |\n"
    first, second = run_all.tables(output)
    assert first == "| a | b |\n| --- | --- |\n| 1 | 2 |" and second == "| c |\n| --- |\n| 3 |"
    doc = "intro\n<!-- bench:x -->\n| old |\n<!-- /bench:x -->\nreading\n<!-- bench:y -->\n<!-- /bench:y -->\n"
    doc = run_all.replace_block(doc, "x", first)
    doc = run_all.replace_block(doc, "y", second)
    assert doc == f"intro\n<!-- bench:x -->\n{first}\n<!-- /bench:x -->\nreading\n<!-- bench:y -->\n{second}\n<!-- /bench:y -->\n"


def test_a_missing_marker_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(ValueError, match="bench:z"):
        run_all.replace_block("<!-- bench:x -->\n<!-- /bench:x -->\n", "z", "| t |")


def test_what_bound_a_run_names_both_engines_when_both_are_saturated() -> None:
    from types import SimpleNamespace as NS

    import run

    lanes = [NS(kind="compute"), NS(kind="h2d"), NS(kind="d2h")]

    def bound(compute: float, h2d: float, wall: float = 1.0) -> str:
        done = [NS(lane=0, start=0.0, end=compute), NS(lane=1, start=0.0, end=h2d)]
        recorder = NS(completions=done, graph=NS(lanes=lanes))
        return run.bound_by({"recorder": recorder, "makespan": 1.0, "wall": wall}).split(" (")[0]

    assert bound(0.87, 0.98) == "compute- and PCIe-bound"
    assert bound(0.97, 0.19) == "compute-bound"
    assert bound(0.60, 0.97) == "PCIe-bound"
    assert bound(0.30, 0.30, wall=1.5) == "dispatch-bound"
    assert bound(0.30, 0.30) == "dependency stalls"
    done = [NS(lane=0, start=0.0, end=0.5), NS(lane=0, start=0.25, end=0.75), NS(lane=2, start=0.5, end=1.0)]
    busy = run.engine_busy({"recorder": NS(completions=done, graph=NS(lanes=lanes)), "makespan": 1.0})
    assert busy == {"compute": 0.75, "h2d": 0.0, "d2h": 0.5}


def test_the_where_table_takes_stored_busy_fractions_and_reads_old_bound_lines() -> None:
    import report

    base = {"workload": "llama", "tokens": 8192, "budget": 2.0, "system": "turnip-nondet", "label": "turnip-nondet", "seconds": 0.25}
    old = {**base, "bound": "PCIe-bound (compute 82%, H2D 97%, D2H 0% busy; loop wall 0.246 s vs GPU span 0.245 s)"}
    new = {**base, "bound": "PCIe-bound (whatever)", "engine_busy": {"compute": 0.82, "h2d": 0.97, "d2h": 0.0}}
    rows = report.where([old, new]).splitlines()[2:]
    assert len(rows) == 2 and all("| 82% / 97% / 0% |" in row for row in rows)


def test_the_report_tells_the_notifiers_apart() -> None:
    import report

    paths = sorted(str(p) for p in (ROOT / "docs" / "results").glob("h200-2026-12-01c-notifiers-llama8k-*.json"))
    runs = report.load(paths)
    assert {r["notifier"] for r in runs} == {"hostfunc", "hostfunc-side", "poll"}
    table = report.table(runs)
    assert "| notifier |" in table.splitlines()[0]
    assert sum("| hostfunc-side |" in line for line in table.splitlines()) == 2  # nondet and fixed


def test_the_peer_matmul_inputs_are_reproducible_and_its_check_catches_a_wrong_entry() -> None:
    import numpy as np

    import cuda_workloads

    a = cuda_workloads.random_matrix(96, 0, threads=3)
    assert a.dtype == np.float32 and np.array_equal(a, cuda_workloads.random_matrix(96, 0, threads=3))
    assert 0.8 < a.std() < 1.2 and not np.array_equal(a, cuda_workloads.random_matrix(96, 1, threads=3))
    b = cuda_workloads.random_matrix(96, 1, threads=2)
    c = (a.astype(np.float64) @ b).astype(np.float32)
    rows = np.arange(0, 96, 7)
    assert cuda_workloads.rows_error(a, b, c, rows, columns=40) < 1e-6
    c[14, 50] += 1.0  # row 14 is sampled, column 50 is in the second band
    assert cuda_workloads.rows_error(a, b, c, rows, columns=40) > 1e-3


def test_the_peer_matmul_runs_over_two_gpus_of_the_cpu_backend_and_reports_its_error() -> None:
    import cuda_workloads

    roomy, tight = (1 << 20) / (1 << 30), (8 << 10) / (1 << 30)
    out = cuda_workloads.peer_matmul(64, 1e9, budgets_gib=(roomy, tight), repeats=1, backend="cpu")
    assert out[f"{roomy}-nondet"]["reloaded"] == 0
    tight = out[f"{tight}-nondet"]
    assert tight["moved"] > 0 and tight["reloaded"] > 0  # partial products crossed GPUs; the tight budget offloaded
    assert all(out[key]["error"] < 1e-5 for key in out if "-" in key)


def test_an_edit_made_while_a_benchmark_runs_is_kept(tmp_path, monkeypatch) -> None:
    doc = tmp_path / "doc"  # a copy of the benchmarks page, in small
    doc.write_text("intro\n<!-- bench:x -->\n| old |\n<!-- /bench:x -->\n")

    def job_that_takes_a_while(job, full, commit):
        doc.write_text(doc.read_text().replace("intro", "intro, edited meanwhile"))
        return ["| new |"]

    monkeypatch.setattr(run_all, "JOBS", (run_all.Job(("fake.py",), ("x",)),))
    monkeypatch.setattr(run_all, "run", job_that_takes_a_while)
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--doc", str(doc)])
    assert run_all.main() == 0
    assert doc.read_text() == "intro, edited meanwhile\n<!-- bench:x -->\n| new |\n<!-- /bench:x -->\n"


def test_a_saved_output_is_compared_with_the_run_of_the_same_length_and_budget(tmp_path, capsys) -> None:
    import numpy as np

    import run

    one_gpu = np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32)
    np.save(run._output_path(str(tmp_path), "llama", 8192, 4.0), one_gpu.astype(np.float16))
    saved = run._saved_output(str(tmp_path), "llama", 8192, 4.0)
    report = {"runs": []}
    two_gpus = one_gpu + np.float32(0.04)
    run._record(report, "llama", 8192, 4.0, "turnip-nondet", {"seconds": 0.1, "output": two_gpus}, None, saved)
    assert report["runs"][0]["agreement_saved"] == pytest.approx(0.01)
    assert "against the saved output 1.0e-02" in capsys.readouterr().out
    assert run._saved_output(str(tmp_path), "llama", 32768, 4.0) is None  # another length: nothing to compare
    assert "no saved output" in capsys.readouterr().out


def test_the_gpus_table_sets_each_run_beside_the_one_gpu_run_of_its_length() -> None:
    import report

    base = {"workload": "llama", "tokens": 32768, "budget": 4.0, "system": "turnip-nondet", "reloaded": 12 * report.GIB}
    one = {**base, "gpus": 1, "placement": "", "seconds": 1.3, "sim": 1.27, "busy": [0.96], "moved": 0}
    two = {**base, "gpus": 2, "placement": "zigzag", "seconds": 0.65, "sim": 0.64, "busy": [0.9, 0.91], "moved": 26 * report.GIB,
           "agreement_saved": 1.5e-3, "agreement": 6.8e-3}
    rows = report.gpus_table([two, one]).splitlines()[2:]
    assert rows[0].startswith("| 32768 | 1 | - | nondet | 1.300 |")
    assert rows[1] == "| 32768 | 2 | zigzag | nondet | 0.650 | 0.640 | 1.02 | 1.300 | 2.00 | 90%, 91% | 26.0 | 12.0 | 1.5e-03 | 6.8e-03 |"


def test_the_current_figures_are_what_the_results_render() -> None:
    from tools.bench_docs import replace_current, render

    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert replace_current(doc, render()) == doc, (
        "docs/benchmarks.md has drifted from docs/results/: run .venv/bin/python -m tools.bench_docs --write docs/benchmarks.md")


def test_a_newer_sitting_replaces_the_figure_of_its_point_and_a_study_keeps_its_own_row(tmp_path, monkeypatch) -> None:
    import json

    import tools.bench_docs as bench_docs

    def write(name: str, date: str, seconds: float, extra: str = "") -> None:
        run = {"workload": "llama", "tokens": 8192, "budget": 2.0, "system": "turnip-nondet", "seconds": seconds}
        doc = {"date": date, "command": f"bench/run.py llama --tokens 8192{extra} --json /x.json",
               "ceilings": {"gemm": 1e15, "h2d": 5e10}, "workloads": {"8192": {"flops": 1e14, "weight_bytes": 1e10}}, "runs": [run]}
        (tmp_path / name).write_text(json.dumps(doc))

    write("h200-2026-12-01-llama.json", "2026-12-01", 0.5)
    write("h200-2026-12-01b-llama.json", "2026-12-01", 0.25)
    write("h200-2026-11-30-llama.json", "2026-11-30", 0.125)
    write("h200-2026-12-01c-depth.json", "2026-12-01", 1.0, " --copy-depth 2")
    write("h200-2026-12-01c-depth-again.json", "2026-12-01", 2.0, " --copy-depth 2")  # the same sitting: both rows
    monkeypatch.setattr(bench_docs, "ROOT", tmp_path)
    monkeypatch.setattr(bench_docs, "RESULTS", tmp_path)
    runs = bench_docs.latest_runs(bench_docs.result_files())
    assert sorted((r["label"], r["seconds"]) for r in runs) == [
        ("turnip-nondet", 0.25), ("turnip-nondet (copy depth 2)", 1.0), ("turnip-nondet (copy depth 2)", 2.0)]
    assert {r["source"] for r in runs} == {"h200-2026-12-01b-llama.json", "h200-2026-12-01c-depth.json", "h200-2026-12-01c-depth-again.json"}


def test_the_current_figures_need_their_markers() -> None:
    from tools.bench_docs import BEGIN, END, replace_current

    assert replace_current(f"intro\n{BEGIN}\nold\n{END}\nreading\n", "new") == f"intro\n{BEGIN}\nnew\n{END}\nreading\n"
    with pytest.raises(ValueError, match="results:current"):
        replace_current("no markers\n", "new")


def test_the_make_bench_scripts_import_from_anywhere(tmp_path) -> None:
    """tools/ is not installed: each script of `make bench` puts the repository root on sys.path itself."""
    import subprocess

    scripts = sorted({job.args[0].removesuffix(".py") for job in run_all.JOBS})
    code = "\n".join([  # one interpreter, each script imported as if first: sys.path and tools/ reset between them
        "import importlib, sys",
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})",
        "base = list(sys.path)",
        f"for name in {scripts!r}:",
        "    sys.path[:] = base",
        "    for module in [m for m in sys.modules if m.split('.')[0] == 'tools']:",
        "        del sys.modules[module]",
        "    try:",
        "        importlib.import_module(name)",
        "    except ImportError as err:",
        "        sys.exit(f'{name}: {err}')",
    ])
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]

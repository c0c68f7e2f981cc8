"""bench/bench_interference.py's logic on the CPU (`--backend sim` on the tiny preset): the bursts are the
seed's, the sim's copies slow down inside them, nondet and fixed are both timed per repeat, and the table
and the JSON carry what the lead reads on the H200."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from turnip_ir.cost import CostModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_interference  # noqa: E402

ARGS = ["--backend", "sim", "--config", "7b", "--points", "128@2GiB", "--repeats", "2", "--burst-ms", "1", "5", "--gap-ms", "1", "5"]
"""7b at 128 tokens streams its weights: link-bound, so bursts show (a tiny model is host-bound in the sim)."""


def test_bursts_follow_the_seed_and_stay_in_their_ranges():
    one = bench_interference.bursts_until(3, (1.0, 2.0), (4.0, 8.0), horizon=1.0)
    assert one == bench_interference.bursts_until(3, (1.0, 2.0), (4.0, 8.0), horizon=1.0)
    assert one != bench_interference.bursts_until(4, (1.0, 2.0), (4.0, 8.0), horizon=1.0)
    ends = [0.0] + [end for _, end in one]
    assert all(1e-3 <= end - start <= 2e-3 and 4e-3 <= start - before <= 8e-3 for (start, end), before in zip(one, ends))
    assert one[-1][0] < 1.0 and len(one) > 60


def test_the_sim_path_times_both_orders_under_the_bursts(tmp_path, capsys):
    out = tmp_path / "interference.json"
    assert bench_interference.main(ARGS + ["--json", str(out)]) == 0
    row = json.loads(out.read_text())["points"][0]
    assert {order: len(spans) for order, spans in row["makespans"].items()} == {"nondet": 2, "fixed": 2}
    assert row["ratio"] == pytest.approx(row["medians"]["fixed"] / row["medians"]["nondet"])
    assert 0 < row["interference_rate"] < row["interference_burst_rate"] == pytest.approx(CostModel().h2d_bw / 2)
    assert f"| 128@2GiB | {row['interference_rate'] / 1e9:.1f} ({row['interference_burst_rate'] / 1e9:.1f}) |" in capsys.readouterr().out
    quiet = tmp_path / "quiet.json"
    assert bench_interference.main(ARGS + ["--share", "1.0", "--json", str(quiet)]) == 0  # bursts that take nothing
    calm = json.loads(quiet.read_text())["points"][0]["medians"]
    assert row["medians"]["nondet"] > calm["nondet"] and row["medians"]["fixed"] > calm["fixed"]


def test_a_bad_point_is_one_line(capsys):
    assert bench_interference.main(["--backend", "sim", "--points", "8192-2GiB"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == ["bench_interference: error: point '8192-2GiB': expected TOKENS@BUDGET, e.g. 8192@2GiB"]


def test_the_bound_is_below_every_run_and_names_what_sets_it(tmp_path):
    """Compute, critical path and link are each a floor for any order of the memgraph: on the sim, whose
    durations are exact, neither order's median beats the longest of them; the quiet run is faster."""
    out = tmp_path / "interference.json"
    assert bench_interference.main(ARGS + ["--json", str(out)]) == 0
    row = json.loads(out.read_text())["points"][0]
    least = row["bound"]
    assert least["seconds"] == max(least["compute_s"], least["path_s"], least["link_s"]) > 0
    assert least["link_s"] == pytest.approx(least["reloaded"] / CostModel().h2d_bw)
    assert all(median >= least["compute_s"] and median >= least["path_s"] for median in row["medians"].values())
    assert row["fixed_over_bound"] == pytest.approx(row["medians"]["fixed"] / least["seconds"])
    assert row["quiet_nondet"] < row["medians"]["nondet"]
    assert row["fixed_over_quiet"] == pytest.approx(row["medians"]["fixed"] / row["quiet_nondet"])


def test_the_critical_path_takes_each_vertex_at_its_least_time():
    """run_figures: the longest path over the dependents, every vertex at the least time any run gave it;
    compute, the least busy seconds of the runs' summaries."""
    from types import SimpleNamespace as NS

    from runtime.backends.base import Completion

    lanes = [NS(kind="compute", device=0), NS(kind="h2d", device=0)]
    graph = type("G", (), {"lanes": lanes, "dependents": [[1, 2], [3], [3], []], "__len__": lambda self: 4})()
    one = NS(graph=graph, completions=[Completion(0, 0, 0.0, 1.0), Completion(1, 1, 1.0, 4.0), Completion(2, 0, 1.0, 2.0), Completion(3, 0, 4.0, 5.0)])
    two = NS(graph=graph, completions=[Completion(0, 0, 0.0, 2.0), Completion(1, 1, 2.0, 4.0), Completion(2, 0, 2.0, 5.0), Completion(3, 0, 5.0, 6.0)])
    # each run's summary: GPU 0 busy over that share of its makespan (the first: [0, 2] and [4, 5] of 5 s)
    figures = bench_interference.run_figures([(NS(busy=[0.6], makespan=5.0), one), (NS(busy=[1.0], makespan=6.0), two)])
    assert figures["path_s"] == pytest.approx(1.0 + 2.0 + 1.0)  # 0 (1 s), then 1 at its least (2 s) over 2 (1 s), then 3 (1 s)
    assert figures["compute_s"] == pytest.approx(3.0)  # the least of the runs' busy seconds: the first's


def test_the_build_options_reach_the_plan_and_the_report(tmp_path):
    out = tmp_path / "interference.json"
    assert bench_interference.main(ARGS + ["--layer-order", "halves", "--schedule", "memory", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["build"] == {"block": None, "layer_order": "halves", "query_group": 1, "schedule": "memory"}
    assert report["points"][0]["medians"]["nondet"] > 0


def test_two_gpus_with_an_interferer_on_one_link(tmp_path):
    """--gpus/--placement spread llama as bench/run.py does; --interfere-on 1 puts the bursts on GPU 1's link
    only (one interferer's figures per repeat), and the link floor is the bytes of the GPU that reloads most."""
    out = tmp_path / "interference.json"
    assert bench_interference.main(ARGS + ["--gpus", "2", "--placement", "layers", "--interfere-on", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["gpus"], report["placement"], report["interfere_on"]) == (2, "layers", [1])
    row = report["points"][0]
    assert len(row["interferer"]) == 2 and row["medians"]["nondet"] > 0
    built = bench_interference.built_llama("7b", 128, gpus=2, placement="layers")
    import run

    memgraph = run.compile_turnip(built.graph, 2 << 30, built.activation_ids)[0]
    per_gpu = bench_interference.reloaded_per_gpu(memgraph)
    assert len(per_gpu) == 2 and min(per_gpu) > 0 and row["bound"]["reloaded"] == max(per_gpu)
    both = tmp_path / "both.json"
    assert bench_interference.main(ARGS + ["--gpus", "2", "--placement", "layers", "--interfere-on", "0", "1", "--json", str(both)]) == 0
    assert len(json.loads(both.read_text())["points"][0]["interferer"]) == 4  # two processes, two repeats


def test_each_gpu_draws_its_own_bursts_and_gpu_0_keeps_the_one_gpu_schedule():
    assert bench_interference.burst_seed(5, 0) == 5
    assert len({bench_interference.burst_seed(5, gpu) for gpu in range(8)}) == 8


def test_an_interferer_on_a_gpu_that_is_not_there_is_one_line(capsys):
    assert bench_interference.main(ARGS + ["--gpus", "2", "--interfere-on", "2"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "bench_interference: error: --interfere-on names distinct GPUs of the 2 of --gpus (0 to 1), got [2]"]


def test_interferers_that_cannot_start_say_which_gpu_and_leave_nothing_behind(tmp_path):
    """Where the interfering process cannot copy (no GPU, or no torch), start() names the GPU in one line,
    and leaving the block ends the processes, removes the stop file and reports start()'s error; leaving it
    without an error names the GPU whose process left no figures."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a GPU is here: the interferer would start")
    with pytest.raises(bench_interference.InputError, match="the interfering process on GPU 0 did not start"):
        with bench_interference.Interferers([0], 0, (1.0, 2.0), (1.0, 2.0), scratch=str(tmp_path)) as interferers:
            interferers.start()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(bench_interference.InputError, match="the interfering process on GPU 0 left no figures"):
        with bench_interference.Interferers([0], 0, (1.0, 2.0), (1.0, 2.0), scratch=str(tmp_path)) as interferers:
            try:
                interferers.start()
            except bench_interference.InputError:
                pass  # the process ran and ended without copying
    assert list(tmp_path.iterdir()) == []


def test_the_generation_benchmark_takes_interference_on_a_gpu_only(capsys):
    """bench_generate.py --interfere runs the shape's turnip systems with an interferer on GPU 0 (the GPU
    stage); asked on the CPU it stops with one error line, and off it changes nothing."""
    import bench_generate

    with pytest.raises(SystemExit) as stopped:
        bench_generate.parse(["--interfere", "--device", "cpu"])
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --interfere copies to a GPU: it needs --device cuda")
    shape = {"batch": 2, "prompt": 8, "ragged": True, "systems": {}}
    with bench_generate.interference(bench_generate.parse(["--device", "cpu"]), shape):
        pass
    assert "interferer" not in shape
    shape["interferer"] = {"rate": 10.6e9}
    assert bench_generate.table([shape]).splitlines()[-1] == "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    shape["systems"]["turnip@4"] = {"skipped": "past the time limit"}
    assert "| 2 x 8 ragged (interferer 10.6 GB/s) | turnip@4 | past the time limit |" in bench_generate.table([shape])

"""`turnip viz trace.json -o timeline.svg`: a run's trace as a Gantt chart, one row per lane per GPU."""

from __future__ import annotations

import json
import re

import pytest

from runtime import execute
from tools.synthetic import random_memgraph
from runtime.timeline import write_timeline
from turnip_cli.main import main
from turnip_ir.errors import InputError


@pytest.fixture
def trace(tmp_path):
    result = execute(random_memgraph(2, vertices=200, devices=2), backend="sim")
    path = tmp_path / "trace.json"
    result.recorder.write_trace(path)
    return path, result


def test_every_vertex_is_a_bar_on_its_lanes_row(trace, tmp_path):
    path, result = trace
    out = write_timeline(path, tmp_path / "timeline.svg")
    svg = open(out).read()
    bars = re.findall(r"<rect [^>]*><title>([^<]*)</title>", svg)
    assert len(bars) == len(result.recorder.completions)
    for lane in ("gpu0 compute0", "gpu0 h2d", "gpu0 d2h", "gpu1 peer"):
        assert f">{lane}</text>" in svg
    colours = set(re.findall(r'fill="(#[0-9a-f]{6})"><title>', svg))
    assert {"#e67e22", "#c0392b", "#7f8c8d"} <= colours  # reloads, offloads and moves each have their colour


def test_the_cli_draws_a_trace_and_refuses_what_is_no_timeline(trace, tmp_path, capsys):
    path, _ = trace
    assert main(["viz", str(path), "-o", str(tmp_path / "t.svg")]) == 0
    assert "timeline" in capsys.readouterr().out
    assert main(["viz", str(path), "-o", str(tmp_path / "t.pdf")]) == 1
    assert "use .svg or .png" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(InputError, match="no vertices"):
        write_timeline(empty, tmp_path / "e.svg")


def test_viz_says_what_it_reads_when_given_a_picture(tmp_path, capsys):
    picture = tmp_path / "picture.svg"
    picture.write_text("<svg></svg>")
    assert main(["viz", str(picture), "-o", str(tmp_path / "out.svg")]) == 1
    err = capsys.readouterr().err
    assert "reads a taskgraph or memgraph (.json or .mlir) or a trace" in err and len(err.strip().splitlines()) == 1


def test_a_dynamic_dimension_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    ir = tmp_path / "dynamic.mlir"
    ir.write_text('"builtin.module"() ({\n  %x, %xt = "turnip.input"() {device = 0 : i64} : () -> (tensor<?xi8>, !turnip.token)\n}) : () -> ()\n')
    proc = subprocess.run([sys.executable, "-m", "turnip_cli.opt", str(ir)], capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "dimension in ? is dynamic or negative" in proc.stderr

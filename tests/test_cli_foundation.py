"""`turnip-opt` and `turnip viz` through subprocess: exit codes, one-line errors without tracebacks, outputs
written only on success, and the mlir/json/dot emitters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from turnip_ir.io import parse_ir

ROOT = Path(__file__).parent.parent
MODULES = {"turnip": "turnip_cli.main", "turnip-opt": "turnip_cli.opt"}
GOLDEN = Path(__file__).parent / "golden"
MEMGRAPH = GOLDEN / "valid" / "memgraph_issue.mlir"
REDUNDANT = GOLDEN / "valid" / "after_redundant.mlir"


def _run(tool: str, *args) -> subprocess.CompletedProcess:
    """The tool as a user runs it, from this checkout (the installed scripts may import another one)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", MODULES[tool], *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def _failed(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _taskgraph_json(tmp_path: Path, change=None) -> Path:
    doc = {
        "format": "turnip.taskgraph/1",
        "devices": 2,
        "nodes": [
            {"id": "x", "op": "input", "device": 0, "shape": [8, 8], "dtype": "float32"},
            {"id": "y", "op": "matmul", "device": 0, "inputs": ["x", "x"]},
            {"id": "z", "op": "move", "device": 1, "inputs": ["y"]},
        ],
        "outputs": ["z"],
    }
    if change:
        change(doc)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    return path


def test_syntax_error_prints_file_line_col_and_leaves_out_alone(tmp_path) -> None:
    out = tmp_path / "out.mlir"
    out.write_text("previous contents\n")
    bad = GOLDEN / "invalid" / "syntax_error.mlir"
    line = _failed(_run("turnip-opt", bad, "-o", out))
    assert line == f"turnip-opt: error: {bad}:3:26: expected ':'"
    assert out.read_text() == "previous contents\n"


def test_failure_does_not_create_out(tmp_path) -> None:
    out = tmp_path / "new.json"
    line = _failed(_run("turnip-opt", GOLDEN / "invalid" / "wrong_result_shape.mlir", "--emit", "json", "-o", out))
    assert line.endswith("wrong_result_shape.mlir:5:3: turnip.matmul 'c': result must be tensor<4x2xf32>, got tensor<4x8xf32>")
    assert not out.exists()
    assert not list(tmp_path.iterdir())  # no temporary file left behind either


@pytest.mark.parametrize(
    "case,expected",
    [
        ("cycle", "cycle.mlir:3:3: turnip.relu 'p' uses %q before its definition (order or cycle)"),
        ("device_out_of_range", "device_out_of_range.mlir:3:3: turnip.input 'a' is on device 2, but the module has 2 devices"),
        ("unknown_op", "unknown_op.mlir:4:20: operation turnip.tanh is not registered"),
    ],
)
def test_invalid_ir_diagnostics(case, expected) -> None:
    assert _failed(_run("turnip-opt", GOLDEN / "invalid" / f"{case}.mlir")).endswith(expected)


def test_bad_json_field_names_the_node(tmp_path) -> None:
    path = _taskgraph_json(tmp_path, lambda d: d["nodes"][1].update(shape=[8, 9]))
    line = _failed(_run("turnip-opt", path, "-o", tmp_path / "out.mlir"))
    assert line == f"turnip-opt: error: {path}: node 'y': field 'shape' is [8, 9] but the op gives [8, 8]"
    assert not (tmp_path / "out.mlir").exists()


def test_json_syntax_error(tmp_path) -> None:
    path = tmp_path / "g.json"
    path.write_text('{"format": "turnip.taskgraph/1",\n "devices": }')
    assert _failed(_run("turnip-opt", path)) == f"turnip-opt: error: {path}:2:13: expecting value"


def test_missing_file_and_unknown_pass(tmp_path) -> None:
    assert _failed(_run("turnip-opt", tmp_path / "none.mlir")).endswith("none.mlir: No such file or directory")
    assert "nope" in _failed(_run("turnip-opt", MEMGRAPH, "-p", "nope"))


def test_json_in_mlir_out_and_back(tmp_path) -> None:
    source = _taskgraph_json(tmp_path)
    mlir = tmp_path / "g.mlir"
    result = _run("turnip-opt", source, "-o", mlir)
    assert result.returncode == 0, result.stderr
    text = mlir.read_text()
    assert "turnip.matmul %x, %x on 0" in text and "turnip.move %y to 1" in text
    back = _run("turnip-opt", mlir, "--emit", "json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["nodes"] == json.loads(_run("turnip-opt", source, "--emit", "json").stdout)["nodes"]


def test_emit_mlir_is_the_golden_output() -> None:
    result = _run("turnip-opt", MEMGRAPH, "--emit", "mlir")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == MEMGRAPH.with_suffix(".out.mlir").read_text().rstrip("\n")


def test_emit_json_of_a_memgraph() -> None:
    result = _run("turnip-opt", MEMGRAPH, "--emit", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "turnip.memgraph/1" and doc["budget"] == 49152
    assert doc["outputs"] == {"z": 4, "y": 5, "v": 6}
    assert doc["nodes"][6]["mem_deps"] == [3] and doc["nodes"][5]["storage"] == [16384, 16384]


def test_print_op_generic() -> None:
    result = _run("turnip-opt", MEMGRAPH, "--print-op-generic")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith('"builtin.module"() ({')
    assert '"turnip.offload"' in result.stdout and "#turnip.storage<16384, 16384>" in result.stdout
    custom = MEMGRAPH.with_suffix(".out.mlir").read_text()
    from turnip_ir.io import module_text

    assert module_text(parse_ir(result.stdout)) == custom


def test_emit_dot_styles_edges_and_nodes() -> None:
    result = _run("turnip-opt", REDUNDANT, "--emit", "dot")
    assert result.returncode == 0, result.stderr
    dot = result.stdout
    assert dot.startswith("digraph memgraph {")
    assert "3 -> 4 [color=black]" in dot  # data edge
    assert "0 -> 4 [color=red" in dot  # memory edge
    assert "2 -> 4 [color=red style=dashed]" in dot  # redundant memory edge
    assert "shape=invhouse" in dot and "shape=house" in dot  # offload and reload look different


def test_viz_writes_dot_text(tmp_path) -> None:
    out = tmp_path / "graph.dot"
    result = _run("turnip", "viz", REDUNDANT, "-o", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {out} (6 nodes)"
    assert out.read_text().startswith("digraph memgraph {")


@pytest.mark.skipif(shutil.which("dot") is None, reason="the graphviz 'dot' binary is not installed")
def test_viz_renders_svg(tmp_path) -> None:
    out = tmp_path / "graph.svg"
    result = _run("turnip", "viz", MEMGRAPH, "-o", out)
    assert result.returncode == 0, result.stderr
    svg = out.read_text()
    assert "<svg" in svg and "offload" in svg


def test_viz_bad_input_is_one_line(tmp_path) -> None:
    out = tmp_path / "graph.svg"
    line = _failed(_run("turnip", "viz", GOLDEN / "invalid" / "cycle.mlir", "-o", out))
    assert line.startswith("turnip viz: error: ") and line.endswith("cycle.mlir:3:3: turnip.relu 'p' uses %q before its definition (order or cycle)")
    assert not out.exists()


def test_viz_bad_output_paths_are_one_line(tmp_path) -> None:
    line = _failed(_run("turnip", "viz", MEMGRAPH, "-o", tmp_path / "graph.bogus"))
    assert line.endswith("the suffix must be one of .svg, .png, .pdf, .jpg, .dot, .gv")
    line = _failed(_run("turnip", "viz", MEMGRAPH, "-o", tmp_path / "missing" / "graph.dot"))
    assert line == f"turnip viz: error: cannot write {tmp_path / 'missing' / 'graph.dot'}: its folder does not exist"


def test_module_entry_point() -> None:
    result = subprocess.run([sys.executable, "-m", "turnip_cli.opt", str(MEMGRAPH)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "turnip.reload %w at <0, 16384, 16384>" in result.stdout


def _memgraph_json(tmp_path: Path, change) -> Path:
    from test_ir_roundtrip import ISSUE_MEMGRAPH

    doc = json.loads(json.dumps(ISSUE_MEMGRAPH))
    change(doc)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    return path


def test_memgraph_json_checked_as_ir_names_the_file(tmp_path) -> None:
    wrong_shape = _memgraph_json(tmp_path, lambda d: d["nodes"][6].update(shape=[3, 3]))
    line = _failed(_run("turnip-opt", wrong_shape, "--emit", "json"))
    assert line == f"turnip-opt: error: {wrong_shape}: node 6 (relu 'v'): declared [3, 3] float32 but relu computes [64, 64] float32"
    untyped = _memgraph_json(tmp_path, lambda d: d["nodes"][1].pop("shape"))
    done = _run("turnip-opt", untyped)  # w, its reload and y stay untyped: raw bytes in IR
    assert done.returncode == 0 and "%w.reload1, %w.reload1t = turnip.reload %w at <0, 16384, 16384> : tensor<16384xi8>" in done.stdout
    past = _memgraph_json(tmp_path, lambda d: d["nodes"][6].update(loc=[40000, 16384]))
    line = _failed(_run("turnip-opt", past))
    assert line == f"turnip-opt: error: {past}: turnip.relu 'v' location [40000, 56384) ends past the budget of 49152 bytes"


@pytest.mark.parametrize("text, size", [("4GiB", 4 << 30), ("1.5GiB", 3 << 29), ("1e6", 10**6), ("2.5e3KiB", 2_560_000),
                                        ("1E9B", 10**9), ("0.5KiB", 512)])
def test_memory_sizes_take_fractions_and_exponents(text, size):
    """Issue 27 item 8: `--memory 1e23` was a ValueError; exponent forms parse, exactly."""
    from turnip_cli.planning import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["1e23", "1e999", "4611686018427387904"])
def test_memory_sizes_past_2_62_are_refused(text):
    from turnip_cli.planning import parse_size
    from turnip_ir.errors import InputError

    with pytest.raises(InputError, match="is 2\\*\\*62 bytes or more"):
        parse_size(text)

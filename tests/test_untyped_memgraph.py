"""The contract's own memgraph example gives no shapes or dtypes: it must still verify, round-trip
through IR (as untyped `tensor<Nxi8>` values) and run once the inputs are given."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from runtime import execute
from turnip_ir.convert import memgraph_from_ir
from turnip_ir.errors import InputError
from turnip_ir.io import graph_text, parse_ir
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.verifier import verify_memgraph

EXAMPLE = {
    "format": "turnip.memgraph/1",
    "devices": 2,
    "budget": 49152,
    "nodes": [
        {"id": 0, "op": "input", "task": "x", "device": 0, "loc": [0, 16384], "inputs": [], "mem_deps": []},
        {"id": 1, "op": "input", "task": "w", "storage": [0, 16384], "inputs": [], "mem_deps": []},
        {"id": 2, "op": "reload", "task": "w", "device": 0, "loc": [16384, 16384], "inputs": [1], "mem_deps": []},
        {"id": 3, "op": "kernel", "kernel": "matmul", "task": "y", "device": 0, "loc": [32768, 16384], "inputs": [0, 2], "mem_deps": []},
        {"id": 4, "op": "move", "task": "z", "device": 1, "loc": [0, 16384], "inputs": [3], "mem_deps": []},
        {"id": 5, "op": "offload", "task": "y", "device": 0, "storage": [16384, 16384], "inputs": [3], "mem_deps": []},
        {"id": 6, "op": "kernel", "kernel": "relu", "task": "v", "device": 0, "loc": [16384, 16384], "inputs": [0], "mem_deps": [3]},
    ],
    "outputs": {"z": 4, "y": 5, "v": 6},
}


def test_untyped_example_round_trips_through_ir_exactly():
    graph = memgraph_from_json(EXAMPLE)
    text = graph_text(graph, "mlir")
    assert "tensor<16384xi8>" in text
    back = memgraph_from_ir(parse_ir(text))
    assert json.loads(back.dumps()) == EXAMPLE


def test_untyped_example_verifies_through_turnip_opt(tmp_path):
    src = tmp_path / "m.json"
    src.write_text(json.dumps(EXAMPLE))
    done = subprocess.run(
        [sys.executable, "-m", "turnip_cli.opt", str(src), "-p", "turnip-verify-memgraph", "--emit", "json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXAMPLE


def test_untyped_example_with_a_race_is_caught():
    broken = json.loads(json.dumps(EXAMPLE))
    broken["nodes"][6]["mem_deps"] = []  # v overwrites w's reload before matmul y has read it
    with pytest.raises(Exception, match="race"):
        verify_memgraph(memgraph_from_json(broken))


def test_untyped_example_runs_once_inputs_are_given():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    for order in ("nondet", "fixed", "random"):
        result = execute(memgraph_from_json(EXAMPLE), order=order, inputs={"x": x, "w": w}, jitter=0.0005)
        y = x.astype(np.float64) @ w
        np.testing.assert_allclose(result.outputs["y"], y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(result.outputs["z"], y, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(result.outputs["v"], np.maximum(x, 0))


def test_untyped_example_without_inputs_says_what_is_missing():
    with pytest.raises(InputError, match=r"node 0 \(x\): no shape or dtype; .*--inputs"):
        execute(memgraph_from_json(EXAMPLE))

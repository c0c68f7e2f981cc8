"""Every way a memgraph enters checks it the same way: declared types against the kernels, and
`execute()` proves it race-free unless told not to."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from runtime_plans import naive_memgraph

from runtime import execute
from turnip_ir.errors import InputError, KernelError, VerifyError
from turnip_ir.io import graph_text, load_memgraph
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

BROADCAST = "node 3 (relu 'r'): declared [2, 4, 8] float32 but relu computes [4, 8] float32"


def _plan() -> MemGraph:
    """b = x + w (w broadcast over rows), r = relu(b), s = 0.5 x; each in its own region: a correct plan."""
    g = TaskGraph(1)
    x = g.input((4, 8), "float32", id="x")
    w = g.input((8,), "float32", id="w")
    r = g.relu(g.add(x, w, id="b", device=0), id="r", device=0)
    g.output(r, g.scale(x, 0.5, id="s", device=0))
    return naive_memgraph(g)


def _widened(graph: MemGraph) -> MemGraph:
    """relu 'r' declared [2, 4, 8] (numpy would broadcast into it) in a region large enough to hold that."""
    node = graph.nodes[3]
    node.shape, node.loc = (2, 4, 8), (node.loc[0], 256)
    return graph


def test_a_declared_shape_that_would_broadcast_is_refused_by_execute():
    with pytest.raises(InputError, match=f"^{re.escape(BROADCAST)}$"):
        execute(_widened(_plan()), verify=False)


@pytest.mark.parametrize("suffix", [".json", ".mlir"])
def test_a_declared_shape_that_would_broadcast_is_refused_by_the_readers(tmp_path, suffix):
    graph = _widened(_plan())
    if suffix == ".json":
        text = graph.dumps()
    else:
        graph.nodes[3].shape = (4, 8)
        text = graph_text(graph, "mlir").replace("tensor<4x8xf32>) -> tensor<4x8xf32>", "tensor<4x8xf32>) -> tensor<2x4x8xf32>", 1)
        text = text.replace("turnip.output %r, %s : tensor<4x8xf32>", "turnip.output %r, %s : tensor<2x4x8xf32>")
    path = tmp_path / f"m{suffix}"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_memgraph(path)
    message = str(caught.value)
    want = {".json": f"m.json: {BROADCAST}", ".mlir": "turnip.relu 'r': result must be tensor<4x8xf32>, got tensor<2x4x8xf32>"}
    assert "\n" not in message and message.endswith(want[suffix])
    with pytest.raises(InputError, match="relu 'r'"):
        load_memgraph(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["nodes"][4].update(attrs={"factor": "half"}), "node 4 (scale 's'): attribute 'factor' must be a number, got 'half'"),
        (lambda d: d["nodes"][4].update(attrs={}), "node 4 (scale 's'): scale needs the attribute 'factor'"),
        (lambda d: d["nodes"][4]["attrs"].update(eps=0.1), "node 4 (scale 's'): scale has no attribute 'eps'"),
        (lambda d: d["nodes"][2].update(shape=[8, 8]), "node 2 (add 'b'): declared [8, 8] float32 but add computes [4, 8] float32"),
        (lambda d: d["nodes"][1].update(shape=[4]), "node 2 (add 'b'): shapes [4, 8] and [4] do not broadcast"),
        (lambda d: d["nodes"][3].update(dtype="float64"), "node 3 (relu 'r'): declared [4, 8] float64 but relu computes [4, 8] float32"),
    ],
)
def test_json_memgraph_types_and_attributes_are_checked(edit, message):
    doc = json.loads(_plan().dumps())
    edit(doc)
    with pytest.raises(InputError) as caught:
        memgraph_from_json(doc)
    assert str(caught.value) == message


def test_a_copy_keeps_its_input_type():
    g = TaskGraph(2)
    g.output(g.move(g.input((4, 8), id="x"), 1, id="y"))
    doc = json.loads(naive_memgraph(g).dumps())
    doc["nodes"][1]["shape"] = [8, 4]
    with pytest.raises(InputError, match=r"^node 1 \(move 'y'\): declared \[8, 4\] float32 but its input node 0 holds \[4, 8\] float32$"):
        memgraph_from_json(doc)


def test_an_unknown_kernel_in_a_python_built_memgraph_is_named():
    graph = _plan()
    graph.nodes[3].kernel = "tanh"
    with pytest.raises(KernelError, match=r"^node 3 \(tanh 'r'\): unknown kernel 'tanh'"):
        execute(graph)


def _racy() -> MemGraph:
    """relu 'r' written over x while scale 's' may still be reading it."""
    graph = _plan()
    graph.nodes[3].loc = graph.nodes[0].loc
    return graph


def test_execute_verifies_race_freedom_by_default():
    message = "race: node 3 (relu 'r') overwrites [0, 128) on GPU 0 before node 4 (scale 's') has read node 0 ('x')"
    with pytest.raises(VerifyError, match=f"^{re.escape(message)}$"):
        execute(_racy(), backend="sim")


def test_execute_without_verify_runs_a_plan_as_given():
    # the opt-out is for plans verified already; this one runs as given, and in node order on one
    # stream relu 'r' overwrites x (with relu(1 + 1) = 2) before scale 's' reads it: 1.0, not 0.5
    ones = {"x": np.ones((4, 8), np.float32), "w": np.ones(8, np.float32)}
    result = execute(_racy(), order="fixed", streams=1, inputs=ones, verify=False)
    np.testing.assert_array_equal(result.outputs["s"], np.full((4, 8), 1.0, np.float32))

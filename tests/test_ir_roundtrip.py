"""Round trips: IR text to text (custom and generic), JSON to IR to JSON and back, for taskgraphs and
memgraphs, and property tests over random taskgraphs, including ids with odd characters."""

from __future__ import annotations

import copy
import json
import os
import random
import string
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnip_ir.convert import memgraph_from_ir, memgraph_to_ir, taskgraph_from_ir, taskgraph_to_ir
from turnip_ir.io import graph_to_module, module_text, parse_ir, parse_json
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.json_taskgraph import taskgraph_from_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.random_graphs import random_taskgraph
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.workloads import ffn, matmul

# TURNIP_EXAMPLES=600 searches harder (about a minute); the default, 150, keeps the suite quick.
GOLDEN = Path(__file__).parent / "golden" / "valid"
PROPERTY = settings(max_examples=int(os.environ.get("TURNIP_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

ISSUE_TASKGRAPH = {
    "format": "turnip.taskgraph/1",
    "devices": 2,
    "nodes": [
        {"id": "x", "op": "input", "device": 0, "shape": [64, 64], "dtype": "float32"},
        {"id": "w", "op": "input", "device": 0, "shape": [64, 64], "dtype": "float32"},
        {"id": "y", "op": "matmul", "device": 0, "inputs": ["x", "w"]},
        {"id": "z", "op": "move", "device": 1, "inputs": ["y"]},
        {"id": "v", "op": "relu", "device": 0, "inputs": ["x"]},
    ],
    "outputs": ["z", "y", "v"],
}

# The issue's memgraph, with shapes and dtypes on the inputs (the IR needs types; the rest are inferred).
ISSUE_MEMGRAPH = {
    "format": "turnip.memgraph/1",
    "devices": 2,
    "budget": 49152,
    "nodes": [
        {"id": 0, "op": "input", "task": "x", "device": 0, "loc": [0, 16384], "inputs": [], "mem_deps": [],
         "shape": [64, 64], "dtype": "float32"},
        {"id": 1, "op": "input", "task": "w", "storage": [0, 16384], "inputs": [], "mem_deps": [],
         "shape": [64, 64], "dtype": "float32"},
        {"id": 2, "op": "reload", "task": "w", "device": 0, "loc": [16384, 16384], "inputs": [1], "mem_deps": []},
        {"id": 3, "op": "kernel", "kernel": "matmul", "task": "y", "device": 0, "loc": [32768, 16384],
         "inputs": [0, 2], "mem_deps": []},
        {"id": 4, "op": "move", "task": "z", "device": 1, "loc": [0, 16384], "inputs": [3], "mem_deps": []},
        {"id": 5, "op": "offload", "task": "y", "device": 0, "storage": [16384, 16384], "inputs": [3], "mem_deps": []},
        {"id": 6, "op": "kernel", "kernel": "relu", "task": "v", "device": 0, "loc": [16384, 16384],
         "inputs": [0], "mem_deps": [3]},
    ],
    "outputs": {"z": 4, "y": 5, "v": 6},
}


def _through_text(module, generic: bool = False):
    return parse_ir(module_text(module, generic=generic))


def _taskgraph_via_ir(graph: TaskGraph, generic: bool = False) -> TaskGraph:
    return taskgraph_from_ir(_through_text(taskgraph_to_ir(graph), generic))


def _memgraph_via_ir(graph: MemGraph, generic: bool = False) -> MemGraph:
    return memgraph_from_ir(_through_text(memgraph_to_ir(graph), generic))


# ----- text to text -------------------------------------------------------------------------------


def test_custom_and_generic_text_round_trip_identically() -> None:
    two_stage_ffn = ffn.build(ffn.FfnConfig(layers=2, gpus=2, placement="layers")).taskgraph()
    for graph in (matmul.build(matmul.MatmulConfig()).taskgraph(), two_stage_ffn, memgraph_from_json(ISSUE_MEMGRAPH)):
        custom = module_text(graph_to_module(graph))
        generic = module_text(graph_to_module(graph), generic=True)
        assert module_text(parse_ir(custom)) == custom
        assert module_text(parse_ir(generic), generic=True) == generic
        assert module_text(parse_ir(generic)) == custom


# ----- JSON to IR to JSON -----------------------------------------------------------------------


def test_issue_taskgraph_json_ir_json() -> None:
    graph = taskgraph_from_json(ISSUE_TASKGRAPH)
    assert graph["y"].shape == (64, 64) and graph["z"].device == 1
    for generic in (False, True):
        assert _taskgraph_via_ir(graph, generic).to_json() == graph.to_json()


def test_issue_memgraph_json_ir_json() -> None:
    graph = memgraph_from_json(ISSUE_MEMGRAPH)
    doc = graph.to_json()
    contract = {k: v for k, v in doc.items() if k != "nodes"}
    assert contract == {"format": "turnip.memgraph/1", "devices": 2, "budget": 49152, "outputs": {"z": 4, "y": 5, "v": 6}}
    for mine, theirs in zip(doc["nodes"], ISSUE_MEMGRAPH["nodes"]):
        assert {k: mine[k] for k in theirs} == theirs  # every contract field survives as written
    assert doc["nodes"][6]["shape"] == [64, 64] and doc["nodes"][6]["dtype"] == "float32"
    for generic in (False, True):
        assert _memgraph_via_ir(graph, generic).to_json() == doc
    assert memgraph_from_json(json.loads(graph.dumps())).to_json() == doc


def test_memgraph_ir_json_ir_keeps_redundant_edges_and_ids() -> None:
    text = (GOLDEN / "after_redundant.out.mlir").read_text()
    graph = memgraph_from_ir(parse_ir(text))
    node4 = graph.by_id()[4]
    assert (node4.op, node4.mem_deps, node4.redundant_deps) == ("move", (0, 1), (2,))
    assert graph.by_id()[2].device == 0 and graph.by_id()[2].storage == (0, 1024)
    again = memgraph_from_json(json.loads(graph.dumps()))
    assert module_text(memgraph_to_ir(again)) == text


def test_taskgraph_ir_json_ir() -> None:
    text = module_text(parse_ir((GOLDEN / "kernels.mlir").read_text()))
    graph = taskgraph_from_ir(parse_ir(text))
    assert graph["es"].attrs == {"equation": "ij,jk->ki"} and graph["nw"].attrs == {"eps": 1e-6}
    loaded = taskgraph_from_json(json.loads(graph.dumps()))
    assert module_text(graph_to_module(loaded)) == text


def test_taskgraph_text_that_binds_tokens_reads_as_without() -> None:
    """Taskgraph text from before tokens were memgraph-only binds one on every op: it reads as the same
    taskgraph, which prints without them."""
    old = (GOLDEN / "taskgraph_tokens.mlir").read_text()
    new = old.replace(", %xt", "").replace(", %yt", "")
    assert "%xt" in old and "%xt" not in new
    graph = taskgraph_from_ir(parse_ir(old))
    assert graph.to_json() == taskgraph_from_ir(parse_ir(new)).to_json()
    assert module_text(graph_to_module(graph)) == module_text(parse_ir(new))


def test_memgraph_node_ids_survive_gaps() -> None:
    doc = copy.deepcopy(ISSUE_MEMGRAPH)
    for node in doc["nodes"]:
        node["id"] = node["id"] * 10 + 7
        node["inputs"] = [i * 10 + 7 for i in node["inputs"]]
        node["mem_deps"] = [i * 10 + 7 for i in node["mem_deps"]]
    doc["outputs"] = {k: v * 10 + 7 for k, v in doc["outputs"].items()}
    graph = memgraph_from_json(doc)
    assert _memgraph_via_ir(graph).to_json() == graph.to_json()
    assert [n.id for n in graph.nodes] == [7, 17, 27, 37, 47, 57, 67]


# ----- properties -------------------------------------------------------------------------------


@PROPERTY
@given(seed=st.integers(0, 10**6), devices=st.integers(1, 4), tasks=st.integers(1, 40),
       sizes=st.sampled_from([(4,), (4, 8), (2, 4, 8)]), mixed=st.booleans())
def test_random_taskgraphs_round_trip(seed: int, devices: int, tasks: int, sizes: tuple[int, ...], mixed: bool) -> None:
    graph = random_taskgraph(seed, tasks=tasks, devices=devices, sizes=sizes, mixed=mixed)
    doc = graph.to_json()
    assert taskgraph_from_json(json.loads(json.dumps(doc))).to_json() == doc
    assert _taskgraph_via_ir(graph).to_json() == doc
    text = module_text(graph_to_module(graph))
    assert module_text(taskgraph_to_ir(taskgraph_from_ir(parse_ir(text)))) == text


ODD_IDS = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits + "_[],.-$ :%#@\"\\'/()", min_size=1, max_size=8),
    st.sampled_from(["blk[0,1]", "x_1", "x_2", "x", "n0", "n1", "t1", "xt", "x.1", "v1", "1", "_0", "x_1_0"]),
)


@st.composite
def taskgraphs(draw) -> TaskGraph:
    """A taskgraph built op by op with the builder: every op kind, every kernel, drawn ids."""
    graph = TaskGraph(devices=draw(st.integers(1, 3)))
    for _ in range(draw(st.integers(1, 14))):
        wanted = draw(ODD_IDS)
        node_id = None if wanted in graph.nodes else wanted
        _add_random_op(draw, graph, node_id)
    outputs = draw(st.lists(st.sampled_from(list(graph.nodes)), max_size=3))
    graph.output(*outputs)
    return graph


def _add_random_op(draw, graph: TaskGraph, node_id: str | None) -> None:
    tensors = [graph.tensor(i) for i in graph.nodes]
    device = draw(st.integers(0, graph.devices - 1))
    kind = draw(st.sampled_from(["input", "unary", "binary", "move", "matmul", "einsum", "scale", "rmsnorm"]))
    if kind == "input" or not tensors:
        shape = draw(st.sampled_from([(4,), (4, 4), (2, 4), (3, 2, 4)]))
        graph.input(shape, draw(st.sampled_from(["float32", "float16", "bfloat16", "float64"])), device=device, id=node_id)
        return
    x = draw(st.sampled_from(tensors))
    same = [t for t in tensors if t.shape == x.shape and t.dtype == x.dtype]
    if kind == "unary":
        graph.kernel(draw(st.sampled_from(["relu", "gelu", "silu", "exp", "softmax"])), x, device=device, id=node_id)
    elif kind == "binary":
        graph.kernel(draw(st.sampled_from(["add", "sub", "mul"])), x, draw(st.sampled_from(same)), device=device, id=node_id)
    elif kind == "move":
        graph.move(x, device, id=node_id)
    elif kind == "matmul" and len(x.shape) == 2 and x.shape[0] == x.shape[1]:
        graph.matmul(x, x, device=device, id=node_id)
    elif kind == "einsum":
        letters = "ijk"[: len(x.shape)]
        graph.einsum(f"{letters}->{letters[::-1]}", x, device=device, id=node_id)
    elif kind == "scale":
        graph.scale(x, draw(st.floats(-4, 4, allow_nan=False).filter(lambda f: f != 0)), device=device, id=node_id)
    else:
        graph.rmsnorm(x, eps=draw(st.sampled_from([None, 1e-5, 0.25])), device=device, id=node_id)


@PROPERTY
@given(graph=taskgraphs())
def test_built_taskgraphs_round_trip_losslessly(graph: TaskGraph) -> None:
    doc = graph.to_json()
    assert taskgraph_from_json(json.loads(json.dumps(doc))).to_json() == doc
    for generic in (False, True):
        assert _taskgraph_via_ir(graph, generic).to_json() == doc
    text = module_text(graph_to_module(graph))
    back = taskgraph_from_ir(parse_ir(text))
    assert list(back.nodes) == list(graph.nodes)
    assert module_text(graph_to_module(back)) == text


@PROPERTY
@given(seed=st.integers(0, 10**6), shuffle=st.randoms(use_true_random=False))
def test_shuffled_node_order_loads_to_the_same_graph(seed: int, shuffle: random.Random) -> None:
    graph = random_taskgraph(seed, tasks=25, devices=3)
    doc = graph.to_json()
    shuffled = dict(doc, nodes=shuffle.sample(doc["nodes"], len(doc["nodes"])))
    loaded = parse_json(json.dumps(shuffled))
    assert {n["id"]: n for n in loaded.to_json()["nodes"]} == {n["id"]: n for n in doc["nodes"]}
    position = {node_id: i for i, node_id in enumerate(loaded.nodes)}
    for node in loaded.nodes.values():
        assert all(position[src] < position[node.id] for src in node.inputs)
    assert loaded.outputs == graph.outputs

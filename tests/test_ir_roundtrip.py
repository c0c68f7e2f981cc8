"""Round trips: IR text to text (custom and generic), JSON to IR to JSON and back, for taskgraphs and
memgraphs, and property tests over random taskgraphs, including ids with odd characters."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnip_ir.convert import memgraph_from_ir, memgraph_to_ir, taskgraph_from_ir, taskgraph_to_ir
from turnip_ir.errors import InputError
from turnip_ir.io import graph_to_module, module_text, parse_ir, parse_json
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.json_taskgraph import taskgraph_from_json
from turnip_ir.memgraph import MemGraph
from tools.random_graphs import random_taskgraph
from turnip_ir.taskgraph import TaskGraph
from frontend.workloads import ffn, matmul

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
    assert "%x, %xt = turnip.input at <0, 0, 16384> {node = 7 : i64}" in module_text(memgraph_to_ir(graph))


def test_a_node_id_given_twice_is_an_error() -> None:
    text = (GOLDEN / "memgraph_issue.mlir").read_text().replace("at <0, 32768, 16384>", "at <0, 32768, 16384> {node = 1}")
    with pytest.raises(InputError, match=r"^turnip.matmul 'y': node id 1 is also turnip.input 'w''s \(give each op its own `node`\)$"):
        memgraph_from_ir(parse_ir(text))


def test_memgraph_names_say_their_tasks_even_when_names_collide() -> None:
    """A task whose name an earlier value took (`yt`, the token of `y`; `y.reload1`, a task of that
    name) or that is no SSA name (`x_1`) carries `task`; the rest are said by their names. The printer
    writes a taken name with a suffix (`%yt_1`), and the text reads back exactly."""
    nodes = [("y", "input", []), ("yt", "input", []), ("y.reload1", "input", []), ("x_1", "input", [])]
    doc = {"format": "turnip.memgraph/1", "devices": 1, "budget": 8192, "outputs": {}, "nodes": []}
    for node_id, (task, op, inputs) in enumerate(nodes):
        doc["nodes"].append({"id": node_id, "op": op, "task": task, "device": 0, "loc": [64 * node_id, 64],
                             "inputs": inputs, "mem_deps": [], "shape": [4, 4], "dtype": "float32"})
    doc["nodes"].append({"id": 4, "op": "offload", "task": "y", "device": 0, "storage": [0, 64], "inputs": [0], "mem_deps": [3]})
    doc["nodes"].append({"id": 5, "op": "reload", "task": "y", "device": 0, "loc": [0, 64], "inputs": [4], "mem_deps": [1, 2]})
    doc["outputs"] = {"y": 5}
    graph = memgraph_from_json(doc)
    text = module_text(memgraph_to_ir(graph))
    assert "%y, %yt = turnip.input at <0, 0, 64> :" in text
    assert '%yt_1, %ytt = turnip.input at <0, 64, 64> {task = "yt"}' in text
    assert "%y.reload1, %y.reload1t = turnip.input at <0, 128, 64> :" in text
    assert '%x.1, %x.1t = turnip.input at <0, 192, 64> {task = "x_1"}' in text
    assert "%y.offload1, %y.offload1t = turnip.offload %y on 0 to <0, 64> after[%x.1t] :" in text
    assert '%y.reload1_1, %y.reload1t_1 = turnip.reload %y.offload1 at <0, 0, 64> after[%ytt, %y.reload1t] {task = "y"}' in text
    assert memgraph_from_ir(parse_ir(text)).to_json() == graph.to_json()


def test_memgraph_text_with_node_names_reads_as_with_task_names() -> None:
    """Memgraph text that names node N `%nN` and gives every task (the form before names said tasks)
    reads as the same memgraph."""
    new = (GOLDEN / "memgraph_issue.mlir").read_text()
    old = new
    names = ["x", "w", "w.reload1", "y", "z", "y.offload1", "v"]
    tasks = ["x", "w", "w", "y", "z", "y", "v"]
    for node, (name, task) in reversed(list(enumerate(zip(names, tasks)))):
        old = re.sub(rf"%{re.escape(name)}(t?)\b(?![.\w])", rf"%n{node}\1", old)
        old = re.sub(rf"(%n{node}t = [^:]*?)( : )", rf'\1 {{task = "{task}"}}\2', old, count=1)
    assert "%n6, %n6t = turnip.relu %n0 at <0, 16384, 16384> after [%n3t] {task = \"v\"}" in old
    assert memgraph_from_ir(parse_ir(old)).to_json() == memgraph_from_ir(parse_ir(new)).to_json()


# ----- properties -------------------------------------------------------------------------------


@settings(PROPERTY, max_examples=min(PROPERTY.max_examples, 20))
@given(seed=st.integers(0, 10**6), devices=st.integers(1, 3), factor=st.sampled_from([1.0, 1.3, 3.0]))
def test_compiled_memgraphs_read_like_their_taskgraph_and_round_trip(seed: int, devices: int, factor: float) -> None:
    """Every value of a compiled memgraph is named after its task (a copy: `task.reloadN`), so no op
    needs a `task` or `node` property, and the text reads back to the same memgraph."""
    from passes.insert_offload import minimum_budget
    from passes.pipeline import compile_taskgraph
    from passes.place_devices import place_devices

    taskgraph = random_taskgraph(seed, tasks=15, devices=devices, sizes=(4, 8), mixed=True)
    memgraph = compile_taskgraph(taskgraph, int(minimum_budget(place_devices(taskgraph)) * factor))
    module = memgraph_to_ir(memgraph)
    for op, node in zip(module.ops, memgraph.nodes):
        assert op.task is None and op.node is None
        copy = rf"\.{node.op}\d+" if node.op in ("offload", "reload") else ""
        assert re.fullmatch(re.escape(node.task) + copy, op.result.name_hint), (op.result.name_hint, node.label())
    assert memgraph_from_ir(_through_text(module)).to_json() == memgraph.to_json()



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

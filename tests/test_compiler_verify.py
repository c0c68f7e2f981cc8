"""The verifier on hand-written memgraphs: each broken condition gets its one-line diagnostic."""

from __future__ import annotations

import copy
import json

import pytest

from turnip_ir.verifier import verify_memgraph
from turnip_cli.opt import main as opt_main
from turnip_ir.errors import VerifyError
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

T = {"shape": [16, 16], "dtype": "float32"}
DOC = {
    "format": "turnip.memgraph/1",
    "devices": 1,
    "budget": 4096,
    "nodes": [
        {"id": 0, "op": "input", "task": "x", "device": 0, "loc": [0, 1024], "inputs": [], **T},
        {"id": 1, "op": "input", "task": "w", "device": 0, "loc": [1024, 1024], "inputs": [], **T},
        {"id": 2, "op": "kernel", "kernel": "matmul", "task": "y", "device": 0, "loc": [2048, 1024], "inputs": [0, 1], **T},
        {"id": 3, "op": "kernel", "kernel": "relu", "task": "v", "device": 0, "loc": [1024, 1024], "inputs": [0], "mem_deps": [2], **T},
    ],
    "outputs": {"y": 2, "v": 3},
}


def _graph(edit=None) -> MemGraph:
    doc = copy.deepcopy(DOC)
    if edit:
        edit(doc["nodes"])
    return memgraph_from_json(doc)


def _taskgraph() -> TaskGraph:
    g = TaskGraph(1)
    x, w = g.input((16, 16), id="x"), g.input((16, 16), id="w")
    g.matmul(x, w, device=0, id="y")
    g.relu(x, device=0, id="v")
    g.output("y", "v")
    return g


def test_correct_handwritten_memgraph_verifies_against_its_taskgraph():
    verify_memgraph(_graph(), _taskgraph())


def test_missing_memory_edge_is_a_race_naming_both_nodes():
    def drop(nodes):
        nodes[3]["mem_deps"] = []

    with pytest.raises(VerifyError) as err:
        verify_memgraph(_graph(drop))
    assert str(err.value) == "race: node 3 (relu 'v') overwrites [1024, 2048) on GPU 0 before node 2 (matmul 'y') has read node 1 ('w')"


def test_overwritten_output_is_reported():
    def clobber(nodes):
        nodes.append({"id": 4, "op": "kernel", "kernel": "relu", "task": "z", "device": 0, "loc": [2048, 1024], "inputs": [3], **T})

    with pytest.raises(VerifyError) as err:
        verify_memgraph(_graph(clobber))
    assert str(err.value) == "output 'y': node 4 (relu 'z') overwrites [2048, 3072) on GPU 0 held by node 2 (matmul 'y')"


def test_location_outside_budget_is_reported():
    def shift(nodes):
        nodes[2]["loc"] = [3584, 1024]

    with pytest.raises(VerifyError, match=r"node 2 \(matmul 'y'\): location \[3584, 4608\) is outside the budget \[0, 4096\)"):
        verify_memgraph(_graph(shift))


def test_operand_from_the_wrong_task_is_reported():
    def swap(nodes):
        nodes[2]["inputs"] = [1, 0]

    with pytest.raises(VerifyError, match=r"node 2 \(matmul 'y'\): operand 0 comes from 'w', not 'x'"):
        verify_memgraph(_graph(swap), _taskgraph())


def test_kernel_reading_another_gpu_is_reported():
    graph = _graph()
    graph.devices = 2
    graph.nodes[1].device = 1
    with pytest.raises(VerifyError, match=r"node 2 \(matmul 'y'\) cannot read node 1 \(input 'w'\)"):
        verify_memgraph(graph)


def test_reload_chain_satisfies_the_data_dependency():
    def offload(nodes):
        nodes[3]["inputs"] = [5]
        nodes[3]["mem_deps"] = [2, 4]
        nodes.insert(3, {"id": 4, "op": "offload", "task": "x", "device": 0, "storage": [0, 1024], "inputs": [0], **T})
        nodes.insert(4, {"id": 5, "op": "reload", "task": "x", "device": 0, "loc": [0, 1024], "inputs": [4], "mem_deps": [2, 4], **T})

    verify_memgraph(_graph(offload), _taskgraph())


def test_turnip_opt_verify_exits_3_with_the_diagnostic(tmp_path, capsys):
    doc = copy.deepcopy(DOC)
    doc["nodes"][3]["mem_deps"] = []
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert opt_main([str(path), "-p", "turnip-verify-memgraph"]) == 3
    assert "race: node 3 (relu 'v') overwrites [1024, 2048) on GPU 0" in capsys.readouterr().err


def test_duplicate_id_and_dangling_dependencies_are_reported_on_a_graph_built_in_python():
    """The JSON reader refuses these first; the verifier names them too for graphs built in memory."""
    twice = _graph()
    twice.nodes[3].id = 2
    with pytest.raises(VerifyError, match="^node 2: duplicate id$"):
        verify_memgraph(twice)
    for field in ("inputs", "mem_deps", "redundant_deps"):
        dangling = _graph()
        setattr(dangling.nodes[3], field, getattr(dangling.nodes[3], field) + (9,))
        with pytest.raises(VerifyError, match=r"^node 3 \(relu 'v'\) depends on node 9, which does not exist$"):
            verify_memgraph(dangling)


def test_nodes_out_of_order_are_sorted_and_still_verified():
    """Nodes listed after a node that reads them, or inputs after a kernel, still verify; a race is still found."""
    graph = _graph()
    graph.nodes.reverse()
    verify_memgraph(graph, _taskgraph())
    graph.nodes[0].mem_deps = ()  # node 3, now listed first
    with pytest.raises(VerifyError, match=r"^race: node 3 \(relu 'v'\) overwrites \[1024, 2048\) on GPU 0"):
        verify_memgraph(graph)


def test_a_later_operand_from_the_wrong_task_is_named_by_its_position():
    def swap(nodes):
        nodes[2]["inputs"] = [0, 0]

    with pytest.raises(VerifyError, match=r"^node 2 \(matmul 'y'\): operand 1 comes from 'x', not 'w'$"):
        verify_memgraph(_graph(swap), _taskgraph())

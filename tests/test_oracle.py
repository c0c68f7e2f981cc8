"""The oracle (tests/oracle.py) against the fast verifier: both catch broken hand-written memgraphs, and
bugs planted in the memory-edge inserter are caught by the oracle even where the verifier shares them.

The inserter and the verifier share `turnip_ir.memarrays` (`written_region`, the regions `MemArrays` holds)
and `turnip_ir.last_writer` (`Overwrites`, the last-writer sweep): a bug there makes the inserter leave out
edges and the verifier look away from the same bytes. The oracle shares nothing.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
from oracle import violations

import turnip_ir.memarrays
from turnip_ir.last_writer import Overwrites
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from turnip_ir.errors import VerifyError
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.memgraph import MemGraph
from tools.random_graphs import random_taskgraph
from turnip_ir.memarrays import STORAGE
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.verifier import verify_memgraph

T = {"shape": [16, 16], "dtype": "float32"}
DOC = {
    "format": "turnip.memgraph/1",
    "devices": 1,
    "budget": 4096,
    "nodes": [
        {"id": 0, "op": "input", "task": "x", "device": 0, "loc": [0, 1024], "inputs": [], **T},
        {"id": 1, "op": "input", "task": "w", "device": 0, "loc": [1024, 1024], "inputs": [], **T},
        {"id": 2, "op": "kernel", "kernel": "matmul", "task": "y", "device": 0, "loc": [2048, 1024], "inputs": [0, 1], **T},
        {"id": 3, "op": "offload", "task": "y", "device": 0, "storage": [0, 1024], "inputs": [2], **T},
        {"id": 4, "op": "kernel", "kernel": "relu", "task": "v", "device": 0, "loc": [1024, 1024], "inputs": [0], "mem_deps": [2], **T},
        {"id": 5, "op": "offload", "task": "v", "device": 0, "storage": [1024, 1024], "inputs": [4], **T},
    ],
    "outputs": {"y": 3, "v": 5},
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


def test_the_correct_memgraph_passes_both():
    verify_memgraph(_graph(), _taskgraph())
    assert violations(_graph(), _taskgraph()) == []


def _set(node: int, **fields):
    return lambda nodes: nodes[node].update(fields)


BROKEN = {
    "reader not waited for": (_set(4, mem_deps=[]), "race: node 4 (relu 'v') may overwrite [1024, 2048) on GPU 0 before node 2 (matmul 'y') reads node 1 (input 'w')"),
    "two writers unordered": (_set(4, loc=[2048, 1024], mem_deps=[]), "race: node 2 (matmul 'y') and node 4 (relu 'v') both use [2048, 3072) on GPU 0"),
    "storage reused unordered": (_set(5, storage=[512, 1024]), "race: node 3 (offload 'y') and node 5 (offload 'v') both use [512, 1024) on CPU storage"),
    "two inputs in one place": (_set(1, loc=[512, 1024]), "race: node 0 (input 'x') and node 1 (input 'w') both use [512, 1024) on GPU 0"),
    "output overwritten": (_set(5, storage=[0, 1024], mem_deps=[3]), "output 'y': node 5 (offload 'v') may overwrite [0, 1024) on CPU storage after node 3"),
    "cycle": (None, "cycle: nodes [2, 3, 4, 5]"),
    "wrong operand": (_set(2, inputs=[1, 0]), "node 2 (matmul 'y'): operand 0 holds 'w', not 'x'"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_both_catch_a_broken_memgraph(case):
    edit, message = BROKEN[case]
    if case == "cycle":  # the JSON reader refuses cycles, so build the graph and then close the loop
        graph = _graph()
        graph.nodes[2].mem_deps = (5,)
    else:
        graph = _graph(edit)
    with pytest.raises(VerifyError):
        verify_memgraph(graph, _taskgraph())
    found = violations(graph, _taskgraph())
    assert any(problem.startswith(message) for problem in found), found


# ----- bugs planted in the memory-edge inserter -----------------------------------------------------------


def _plans(seeds=range(12)):
    """(placed taskgraph, memgraph, verifier's verdict) for small random graphs at tight budgets."""
    for seed in seeds:
        placed = place_devices(random_taskgraph(seed, tasks=30, devices=1 + seed % 2, sizes=(8, 16, 24)))
        plan = compile_taskgraph(placed, int(minimum_budget(placed) * 1.3), verify=False)
        try:
            verify_memgraph(plan, placed)
            yield placed, plan, True
        except VerifyError:
            yield placed, plan, False


def _in_step(graph, arrays) -> None:
    """The pipeline keeps one MemArrays beside the graph: a planted inserter edits both."""
    if arrays is not None:
        arrays.__dict__.update(turnip_ir.memarrays.MemArrays.build(graph.nodes).__dict__)


def _keep_first_edge(real):
    def inserter(graph, arrays=None):  # planted: each node keeps only its first memory dependency
        counts = real(graph, arrays)
        for node in graph.nodes:
            node.mem_deps = node.mem_deps[:1]
        _in_step(graph, arrays)
        return counts

    return inserter


def _all_redundant(real):
    def inserter(graph, arrays=None):  # planted: every memory dependency filed as implied by a data path
        counts = real(graph, arrays)
        for node in graph.nodes:
            if node.op != "offload":
                node.mem_deps, node.redundant_deps = (), node.redundant_deps + node.mem_deps
        _in_step(graph, arrays)
        return counts

    return inserter


@pytest.mark.parametrize("plant", [_keep_first_edge, _all_redundant])
def test_an_inserter_bug_of_its_own_is_caught_by_both(plant, monkeypatch):
    import passes.insert_memory_deps as inserter  # the pass's run() calls the module's function

    monkeypatch.setattr(inserter, "insert_memory_deps", plant(inserter.insert_memory_deps))
    caught = 0
    for placed, plan, verified in _plans():
        assert verified == (violations(plan, placed) == []), "the oracle and the verifier disagree"
        caught += not verified
    assert caught >= 6, "the planted bug should break most tight plans"


def _offset_as_end(node):
    """planted: (offset, size) read as (start, end), so most regions look empty."""
    if node.loc is not None and node.device is not None:
        return (node.device, node.loc[0], node.loc[1])
    if node.storage is not None:
        return (STORAGE, node.storage[0], node.storage[1])
    return None


def _first_overlap_only(real_init):
    def init(self, arrays):  # planted: each node keeps only the first earlier write it overwrites
        real_init(self, arrays)
        counts = np.diff(self.ptr)
        keep = np.zeros(len(self.writer), dtype=bool)
        keep[self.ptr[:-1][counts > 0]] = True
        self.writer, self.start, self.end, self.node = self.writer[keep], self.start[keep], self.end[keep], self.node[keep]
        self.ptr = np.concatenate([[0], np.cumsum(np.minimum(counts, 1))]).astype(np.int64)

    return init


def _plant_shared(monkeypatch, bug: str) -> None:
    if bug == "written_region":
        shared = turnip_ir.memarrays.written_region
        for module in list(sys.modules.values()):  # every module that imported it: the inserter's and the verifier's
            if getattr(module, "written_region", None) is shared:
                monkeypatch.setattr(module, "written_region", _offset_as_end)
    else:
        monkeypatch.setattr(Overwrites, "__init__", _first_overlap_only(Overwrites.__init__))


@pytest.mark.parametrize("bug", ["written_region", "Overwrites"])
def test_a_bug_shared_with_the_verifier_is_caught_by_the_oracle(bug, monkeypatch):
    _plant_shared(monkeypatch, bug)
    verdicts = [(verified, violations(plan, placed) != []) for placed, plan, verified in _plans()]
    assert all(caught for _, caught in verdicts), "at 1.3x the minimum budget every plan reuses memory, so the bug breaks it"
    assert sum(verified for verified, _ in verdicts) >= 3, "the verifier, sharing the bug, should pass some broken plans"

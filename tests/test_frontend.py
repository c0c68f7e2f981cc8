"""The frontend's lowering: tasks, moves and add trees counted for given partitions and placements."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from turnip_ir.errors import InputError
from frontend import LoadBalanced, Program, Site, given, on, round_robin, split_block, split_count
from frontend.workloads import matmul


def ops(graph) -> Counter:
    return Counter(node.op for node in graph.nodes.values())


def test_splits_cover_the_dimension():
    assert split_count(10, 3) == (4, 3, 3)
    assert split_block(100, 32) == (32, 32, 32, 4)
    assert split_block(64, 32) == (32, 32)
    with pytest.raises(InputError, match="cannot cut a dimension of 3 into 4 blocks"):
        split_count(3, 4)


def test_seed_matmul_places_products_on_the_diagonal_and_sums_on_the_owner():
    graph = matmul.build(matmul.MatmulConfig(m=256, k=256, n=256, block=128, gpus=3)).taskgraph()
    assert ops(graph) == {"input": 8, "matmul": 8, "add": 4, "move": 12}
    for i in range(2):
        for j in range(2):
            for k in range(2):
                assert graph[f"C[{i},{j}].p{k}"].device == (i + j + k) % 3
            root = graph[f"C[{i},{j}]"]
            assert root.op == "add" and root.device == (i + j) % 3
    assert graph.outputs == ["C[0,0]", "C[0,1]", "C[1,0]", "C[1,1]"]


@pytest.mark.parametrize("k_blocks, adds_per_block", [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4)])
def test_split_contraction_adds_a_balanced_tree_per_output_block(k_blocks, adds_per_block):
    prog = Program(1)
    a = prog.input("A", (8, 10 * k_blocks), "float32", (2, k_blocks))
    b = prog.input("B", (10 * k_blocks, 6), "float32", (k_blocks, 3))
    c = prog.einsum("ik,kj->ij", a, b, name="C")
    graph = prog.taskgraph()
    assert ops(graph)["matmul"] == 2 * 3 * k_blocks
    assert ops(graph)["add"] == 2 * 3 * adds_per_block
    depth = 0
    node = graph[c.blocks[(1, 2)].id]
    while node.op == "add":  # the left spine of the tree is its deepest path
        node, depth = graph[node.inputs[0]], depth + 1
    assert depth == (k_blocks - 1).bit_length()


def test_an_operand_block_is_moved_once_per_gpu():
    prog = Program(2, round_robin(2))
    w = prog.input("W", (4, 4), "float32", place=on(0))
    x = prog.input("x", (8, 4), "float32", (4,), place=on(0))
    prog.einsum("ti,oi->to", x, w, name="y")
    graph = prog.taskgraph()
    moves = [node for node in graph.nodes.values() if node.op == "move"]
    # blocks 1 and 3 of x run on GPU 1: each x block moves once, W once (shared by both readers)
    assert sorted(node.id for node in moves) == ["W.to1", "x[1,0].to1", "x[3,0].to1"]


def test_inputs_without_placement_appear_on_their_first_readers_gpu():
    prog = Program(3, given(lambda c: 2))
    x = prog.input("x", (4, 4), "float32")
    w = prog.input("w", (4, 4), "float32")
    prog.einsum("ti,oi->to", x, w, name="y")
    graph = prog.taskgraph()
    assert graph["x"].device == graph["w"].device == 2
    assert ops(graph)["move"] == 0


def test_mismatched_cuts_are_refused_not_repartitioned():
    prog = Program(1)
    x = prog.input("x", (8, 4), "float32", (2,))
    w = prog.input("w", (4, 4), "float32", (None, 2))
    with pytest.raises(InputError, match="operand 'w' is cut \\[2, 2\\] along 'i'.*repartitioning"):
        prog.einsum("ti,oi->to", x, w, name="y")


def test_map_aligns_a_weight_vector_and_refuses_a_split_it_cannot_reduce():
    prog = Program(1)
    x = prog.input("x", (8, 4), "float32", (2,))
    norm = prog.map("rmsnorm", x, prog.input("g", (4,), "float32"), name="n", eps=1e-5)
    assert ops(prog.graph)["rmsnorm"] == 2 and norm.splits == ((4, 4), (4,))
    y = prog.input("y", (8, 4), "float32", (2, 2))
    with pytest.raises(InputError, match="rmsnorm reduces over the last axis, which is cut in 2 blocks"):
        prog.map("rmsnorm", y, name="bad")


def test_attention_chains_stay_below_the_diagonal():
    prog = Program(1)
    q = prog.input("q", (40, 32), "float32", (split_block(40, 10), 2))  # 4 heads of 8 in 2 groups
    kv = [prog.input(n, (40, 16), "float32", (split_block(40, 10), 2)) for n in "kv"]
    out = prog.attention(q, *kv, name="a", heads=4, kv_heads=2)
    graph = prog.taskgraph()
    links = [node for node in graph.nodes.values() if node.op == "attention"]
    assert len(links) == 2 * (1 + 2 + 3 + 4)  # per head group, query block i reads key blocks 0..i
    finals = [node for node in links if node.attrs.get("final", True)]
    assert len(finals) == 8 and all(node.attrs.get("causal") for node in finals)
    assert {node.attrs["heads"] for node in links} == {2} and {node.attrs["kv_heads"] for node in links} == {1}
    chain = graph[out.blocks[(3, 1)].id]
    assert [graph[src].id for src in chain.inputs[1:3]] == ["k[3,1]", "v[3,1]"]
    assert graph[chain.inputs[3]].id == "a[3,1].k2"


def test_attention_refuses_head_groups_that_split_a_kv_head():
    prog = Program(1)
    q = prog.input("q", (8, 32), "float32", (None, 4))
    kv = [prog.input(n, (8, 16), "float32", (None, 4)) for n in "kv"]
    with pytest.raises(InputError, match="4 head groups do not divide 4 heads and 2 kv heads"):
        prog.attention(q, *kv, name="a", heads=4, kv_heads=2)


def test_load_balanced_follows_the_data_until_loads_drift_apart():
    place = LoadBalanced(2, flops_per_byte=1.0)
    assert place(Site("op", {}, 0, 100, ((1, 10),))) == 1  # GPU 1 holds the operand
    assert place(Site("op", {}, 1, 100, ((1, 10),))) == 0  # GPU 1 is 100 FLOPs busier than 10 bytes cost


def test_a_placement_outside_the_gpus_is_an_error():
    prog = Program(2, given(lambda c: 5))
    x = prog.input("x", (4, 4), "float32")
    with pytest.raises(InputError, match="placement chose GPU 5, not in \\[0, 2\\)"):
        prog.einsum("ti,oi->to", x, x, name="y")


def test_feed_and_gather_cut_and_reassemble_whole_tensors():
    prog = Program(2)
    a = prog.input("A", (5, 7), "float32", (2, 3))
    b = prog.input("B", (7, 3), "float32", (3,))
    c = prog.einsum("ik,kj->ij", a, b, name="C")
    prog.output(c)
    values = {"A": np.arange(35, dtype=np.float32).reshape(5, 7), "B": np.ones((7, 3), np.float32)}
    arrays = prog.feed(values)
    assert arrays["A[1,2]"].shape == (2, 2) and arrays["A[1,2]"][0, 0] == values["A"][3, 5]
    blocks = {f"C[{i},0]": sum(arrays[f"A[{i},{k}]"] @ arrays[f"B[{k},0]"] for k in range(3)) for i in range(2)}
    np.testing.assert_array_equal(prog.gather(c, blocks), values["A"] @ values["B"])
    with pytest.raises(InputError, match="no value given for input 'B'"):
        prog.feed({"A": values["A"]})


def test_map_refuses_a_letter_it_would_have_to_reduce():
    prog = Program(1)
    x = prog.input("x", (8, 4), "float32", (2,))
    w = prog.input("w", (8, 4), "float32", (2,))
    with pytest.raises(InputError, match="'t' is split but add does not reduce over it"):
        prog.map("add", x, w, name="bad", signature="ti,ti->i")

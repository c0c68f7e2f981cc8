"""Every workload, compiled under a tight budget and run on the cpu backend in random orders, equals its
independent float64 reference; the llama taskgraph has the structure its docstring promises."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnip_ir.kernels import KERNELS

from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from turnip_ir.errors import InputError
from frontend.workloads import ffn, llama, matmul


def tight(graph) -> int:
    """A budget a quarter above the smallest that can work: offloads and reloads are certain."""
    return int(1.25 * minimum_budget(graph)) // 256 * 256


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - expected)) / np.max(np.abs(expected)))


def run_blocked(module, config, seeds=(0, 1)) -> list[float]:
    """The relative error of each run of the compiled workload, one random order per seed."""
    prog = module.build(config)
    graph = prog.taskgraph()
    values = module.random_inputs(config, 7)
    expected = module.float64_forward(config, values)
    memgraph = compile_taskgraph(graph, tight(graph))
    assert memgraph.count("reload") > 0
    errors = []
    for seed in seeds:
        result = execute(memgraph, backend="cpu", order="random", seed=seed, inputs=prog.feed(values))
        errors += [relative_error(prog.gather(x, result.outputs), expected[name]) for name, x in prog.outputs.items()]
    return errors


@pytest.mark.parametrize("config", [
    matmul.PRESETS["small"],
    matmul.MatmulConfig(m=48, k=80, n=40, block=16, gpus=2, placement="round-robin"),
    matmul.MatmulConfig(m=64, k=64, n=32, block=24, gpus=3, placement="load-balanced"),
])
def test_matmul_equals_reference(config):
    assert max(run_blocked(matmul, config)) < 1e-5


@pytest.mark.parametrize("config", [
    ffn.FfnConfig(layers=3, tokens=48, hidden=32, ffn=64, block=16, gpus=2),
    ffn.FfnConfig(layers=4, tokens=40, hidden=32, ffn=48, block=16, gpus=2, ffn_blocks=3, placement="layers"),
    ffn.FfnConfig(layers=2, tokens=64, hidden=32, ffn=64, block=16, gpus=3, placement="load-balanced"),
])
def test_ffn_equals_reference(config):
    assert max(run_blocked(ffn, config)) < 1e-5


def test_ffn_float16_stays_close_to_reference():
    config = ffn.FfnConfig(layers=2, tokens=32, hidden=32, ffn=64, block=16, dtype="float16")
    assert max(run_blocked(ffn, config, seeds=(3,))) < 1e-2


def test_ffn_weights_that_do_not_fit_start_in_cpu_storage():
    config = ffn.FfnConfig(layers=6, tokens=32, hidden=64, ffn=128, block=32)
    graph = ffn.build(config).taskgraph()
    memgraph = compile_taskgraph(graph, tight(graph))
    in_storage = {node.task for node in memgraph.nodes if node.op == "input" and node.device is None}
    assert in_storage and all(task.startswith("w") for task in in_storage)
    # a weight in storage is reloaded for its reader, never offloaded (inputs are read-only)
    offloaded = {node.task for node in memgraph.nodes if node.op == "offload"}
    assert not in_storage & offloaded


LLAMA_CASES = [
    ("tiny", "sequence", 1, 128, 32),
    ("tiny-gqa", "sequence", 3, 100, 32),  # uneven last block
    ("tiny", "layers", 2, 96, 32),
    ("tiny-gqa", "zigzag", 2, 128, 16),
    ("tiny-gqa", "heads", 2, 64, 16),
    ("tiny", "heads", 4, 64, 32),
]


@pytest.mark.parametrize("preset, placement, gpus, tokens, block", LLAMA_CASES)
def test_llama_equals_reference(preset, placement, gpus, tokens, block):
    config = llama.load_config(preset)
    built = llama.build_llama(config, tokens, block, gpus, placement)
    weights, ids = llama.RandomWeights(config, 3), llama.random_ids(config, tokens, 4)
    expected = llama.float64_forward(config, weights, ids)
    memgraph = compile_taskgraph(built.graph, tight(built.graph))
    assert memgraph.count("offload") > 0
    result = execute(memgraph, backend="cpu", order="random", seed=gpus, inputs=built.feed(weights, ids))
    assert relative_error(built.gather(result.outputs), expected) < 1e-5


def test_llama_float16_stays_close_to_reference():
    config = replace(llama.load_config("tiny-gqa"), dtype="float16")
    built = llama.build_llama(config, 64, 16, gpus=2)
    weights, ids = llama.RandomWeights(config, 5), llama.random_ids(config, 64, 5)
    memgraph = compile_taskgraph(built.graph, tight(built.graph))
    result = execute(memgraph, backend="cpu", order="nondet", seed=1, inputs=built.feed(weights, ids))
    hidden = built.gather(result.outputs)
    assert hidden.dtype == np.float16
    assert relative_error(hidden, llama.float64_forward(config, weights, ids)) < 1e-2


def test_llama_task_counts_per_layer():
    config = llama.load_config("tiny")  # 2 layers, 4 heads
    graph = llama.build_llama(config, 128, 32).graph  # 4 token blocks
    per_layer = {"rmsnorm": 2 * 4, "einsum": 7 * 4, "rope": 2 * 4, "attention": 4 * 5 // 2, "add": 2 * 4, "swiglu": 4}
    expected = Counter({op: 2 * n for op, n in per_layer.items()}) + Counter({"rmsnorm": 4, "input": 3 * 4 + 2 * 9 + 1})
    assert Counter(node.op for node in graph.nodes.values()) == expected


def test_llama_heads_placement_sums_partial_projections_across_gpus():
    config = llama.load_config("tiny")  # 4 kv heads: 2 per GPU
    graph = llama.build_llama(config, 64, 32, gpus=2, placement="heads").graph
    counts = Counter(node.op for node in graph.nodes.values())
    # per layer and token block: o and down each sum 2 partials (1 add) next to 2 residual adds
    assert counts["einsum"] == 2 * 2 * (5 * 2 + 2 * 2)
    assert counts["add"] == 2 * 2 * (2 + 2)
    assert counts["attention"] == 2 * 2 * 3
    assert {graph["l0.q[1,1]"].device, graph["l0.attn[1,1]"].device, graph["l0.o[1,0].p1"].device} == {1}
    assert graph["l0.o[1,0]"].device == 0 and graph["l0.attn_res[1,0]"].device == 0


def test_llama_sequence_and_layers_placements():
    config = llama.load_config("tiny")
    seq = llama.build_llama(config, 128, 32, gpus=3, placement="sequence").graph
    assert [seq[f"l1.attn[{b},0]"].device for b in range(4)] == [0, 1, 2, 0]
    assert seq["l1.attn[3,0].k1"].inputs[1] == "l1.k_rope[1,0].to0"
    layers = llama.build_llama(config, 128, 32, gpus=2, placement="layers").graph
    assert {layers[f"l0.down[{b},0]"].device for b in range(4)} == {0}
    assert {layers[f"hidden_states[{b},0]"].device for b in range(4)} == {1}
    assert sum(node.op == "move" for node in layers.nodes.values()) == 4 + 2 * 4  # residual + rope tables


def test_llama_runs_layer_by_layer_and_block_by_block():
    graph = llama.build_llama(llama.load_config("tiny"), 128, 32).graph
    position = {node_id: i for i, node_id in enumerate(graph.nodes)}
    assert position["l0.mlp_res[0,0]"] < position["l0.q[1,0]"]  # block 0 finishes its layer before block 1 starts
    assert position["l0.mlp_res[3,0]"] < position["l1.attn_norm[0,0]"]


def test_llama_halves_run_every_block_through_attention_before_the_mlp():
    graph = llama.build_llama(llama.load_config("tiny"), 128, 32, layer_order="halves").graph
    position = {node_id: i for i, node_id in enumerate(graph.nodes)}
    assert position["l0.attn_res[3,0]"] < position["l0.mlp_norm[0,0]"]  # every block's attention half first
    assert position["l0.mlp_res[0,0]"] < position["l0.mlp_norm[1,0]"]  # then the MLP half block by block
    assert position["l0.mlp_res[3,0]"] < position["l1.attn_norm[0,0]"]


def test_llama_query_groups_interleave_their_chains_key_block_by_key_block():
    graph = llama.build_llama(llama.load_config("tiny"), 128, 32, layer_order="halves", query_group=2).graph
    links = [node_id for node_id, node in graph.nodes.items() if node.op == "attention" and node_id.startswith("l0.")]
    assert links == ["l0.attn[0,0]", "l0.attn[1,0].k0", "l0.attn[1,0]",  # group 0: blocks 0 and 1
                     "l0.attn[2,0].k0", "l0.attn[3,0].k0", "l0.attn[2,0].k1", "l0.attn[3,0].k1",  # group 1, by key block
                     "l0.attn[2,0]", "l0.attn[3,0].k2", "l0.attn[3,0]"]
    position = {node_id: i for i, node_id in enumerate(graph.nodes)}
    assert position["l0.q_rope[3,0]"] < position["l0.attn[2,0].k0"]  # the group's queries are all made first
    plain = llama.build_llama(llama.load_config("tiny"), 128, 32).graph
    assert list(llama.build_llama(llama.load_config("tiny"), 128, 32, query_group=1).graph.nodes) == list(plain.nodes)


def test_query_groups_reload_k_and_v_less_where_a_layer_of_them_does_not_fit():
    config = llama.load_config("tiny")
    reloaded = {}
    for group in (1, 4):
        built = llama.build_llama(config, 512, 32, layer_order="halves", query_group=group)
        kv = sum(node.nbytes for node in built.graph.nodes.values() if node.id.startswith("l0.k_rope") or node.id.startswith("l0.v["))
        memgraph = compile_taskgraph(built.graph, kv // 2)  # half of one layer's k and v
        reloaded[group] = sum(n.loc[1] for n in memgraph.nodes if n.op == "reload" and ("k_rope" in n.task or ".v[" in n.task))
    assert 0 < reloaded[4] < reloaded[1] / 2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(["tiny", "tiny-gqa"]), tokens=st.integers(40, 160), block=st.sampled_from([16, 24, 32]),
       layer_order=st.sampled_from(llama.LAYER_ORDERS), query_group=st.integers(1, 5), slack=st.sampled_from([1.0, 1.25, 2.0]),
       remat=st.booleans(), seed=st.integers(0, 2**16))
def test_llama_in_every_layer_order_and_query_group_equals_the_reference(preset, tokens, block, layer_order, query_group,
                                                                        slack, remat, seed):
    config = llama.load_config(preset)
    built = llama.build_llama(config, tokens, block, layer_order=layer_order, query_group=query_group)
    weights, ids = llama.RandomWeights(config, seed), llama.random_ids(config, tokens, seed)
    budget = int(slack * minimum_budget(built.graph)) // 256 * 256 + 256
    memgraph = compile_taskgraph(built.graph, budget, remat=remat)  # the pipeline verifies its plan
    result = execute(memgraph, backend="cpu", order="random", seed=seed, inputs=built.feed(weights, ids))
    assert relative_error(built.gather(result.outputs), llama.float64_forward(config, weights, ids)) < 1e-5


def test_llama_rejects_what_it_cannot_build():
    config = llama.load_config("tiny-gqa")  # 2 kv heads
    with pytest.raises(InputError, match="placement 'heads' needs gpus \\(4\\) to divide the kv heads \\(2\\)"):
        llama.build_llama(config, 64, gpus=4, placement="heads")
    with pytest.raises(InputError, match="unknown llama placement 'rings'"):
        llama.build_llama(config, 64, placement="rings")
    with pytest.raises(InputError, match="unknown llama layer order 'rows' \\(known: blocks, halves\\)"):
        llama.build_llama(config, 64, layer_order="rows")
    with pytest.raises(InputError, match="llama: query_group must be a positive integer, got 0"):
        llama.build_llama(config, 64, query_group=0)
    with pytest.raises(InputError, match="token id 300 is out of the vocabulary range \\[0, 256\\)"):
        llama.build_llama(config, 2).feed(llama.RandomWeights(config, 0), np.array([1, 300]))


def test_zigzag_deals_blocks_out_in_a_snake_and_balances_causal_attention():
    from frontend.workloads.llama.graph import zigzag

    assert [zigzag(b, 3) for b in range(8)] == [0, 1, 2, 2, 1, 0, 0, 1]
    config = llama.load_config("tiny")
    work = {}
    for placement in ("sequence", "zigzag"):
        graph = llama.build_llama(config, 256, 32, gpus=2, placement=placement).graph
        flops = [0, 0]
        for node in graph.nodes.values():
            if node.op == "attention":
                flops[node.device] += KERNELS["attention"].flops([graph.nodes[i].shape for i in node.inputs], node.shape, node.attrs)
        work[placement] = max(flops) / min(flops)
    assert work["zigzag"] < work["sequence"]  # 8 blocks: the snake evens out the attention work per GPU

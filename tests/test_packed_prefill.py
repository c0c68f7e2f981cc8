"""One prefill for a batch of prompts (issue 44): sequences packed end to end through one llama graph.

Each prompt's k/v rows and final hidden states must equal those of its own prefill (float64 formulas and
the cpu backend, in random orders, under budgets that force offload); no attention task may read keys of
another prompt (the graph inspected); segmented causal attention equals a float64 reference per sequence
(the numpy kernel, the float64 formulas, and random layouts). The cuda simulator's and the GPU's checks of
the segmented kernel are in test_cuda_sim.py and test_cuda_gpu.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_formulas import apply, evaluate

from frontend.partition import split_packed
from frontend.workloads import llama
from frontend.workloads.llama.config import Rope
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.kernels_numpy import NUMPY_KERNELS
from tests import formulas_llama as formulas
from turnip_ir.errors import InputError
from turnip_ir.cost import CostModel
from turnip_ir.kernels import KERNELS
from turnip_ir.memgraph import MemNode
from turnip_ir.verifier import verify_memgraph

SMALL = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


# ----- the cut -------------------------------------------------------------------------------------------
def test_sequences_join_a_block_while_they_fit_and_long_ones_take_blocks_of_their_own():
    assert split_packed([512] * 16, 4096) == (4096, 4096)
    assert split_packed([3000, 2000, 2000, 1192], 4096) == (3000, 4000, 1192)
    assert split_packed([5, 2, 2, 1, 5], 4) == (4, 1, 4, 1, 4, 1)  # the last piece of a long one is closed
    assert split_packed([1, 1, 4, 3], 4) == (2, 4, 3)
    assert split_packed([7], 4) == (4, 3)


@pytest.mark.parametrize("tokens, block, placement, gpus", [(128, 32, "sequence", 1), (100, 32, "zigzag", 2), (20, 64, "heads", 2)])
def test_one_sequence_builds_the_graph_of_no_sequences(tokens, block, placement, gpus):
    config = llama.load_config("tiny-gqa")
    plain = llama.build_llama(config, tokens, block, gpus, placement, kv_outputs=True)
    packed = llama.build_llama(config, tokens, block, gpus, placement, kv_outputs=True, sequences=[tokens])
    assert packed.graph.to_json() == plain.graph.to_json()
    assert packed.sequences == plain.sequences == (tokens,)


def test_sequences_that_do_not_make_the_tokens_are_refused():
    config = llama.load_config("tiny")
    with pytest.raises(InputError, match=r"^llama: sequences \[3, 4\] add up to 7 tokens, not 8$"):
        llama.build_llama(config, 8, sequences=[3, 4])
    with pytest.raises(InputError, match=r"^llama: sequences must be positive integer lengths, got \[4, 0, 4\]$"):
        llama.build_llama(config, 8, sequences=[4, 0, 4])
    with pytest.raises(InputError, match=r"^llama: sequences must be positive integer lengths, got \[\]$"):
        llama.build_llama(config, 8, sequences=[])


def test_attention_refuses_a_block_that_mixes_a_piece_of_a_sequence_with_others():
    from frontend import Program

    prog = Program(1)
    q, k, v = (prog.input(name, (8, 8), "float32", ((4, 4),)) for name in "qkv")
    with pytest.raises(InputError, match=r"^attention 'a': token block 0 \[0, 4\) holds a piece of a sequence beside others"):
        prog.attention(q, k, v, name="a", heads=2, kv_heads=2, sequences=[2, 4, 2])


# ----- no attention across sequences -----------------------------------------------------------------------
def _sequence_of(bounds: list[int], row: int) -> int:
    return int(np.searchsorted(bounds, row, side="right")) - 1


def _token_block(block_id: str) -> int:
    """The token block of a q/k block id: 'l0.k_rope[i,g]' or 'l0.k_rope[i,g].to1', 'l0.k_rope' for one block."""
    return int(block_id.split("[")[1].split(",")[0].rstrip("]")) if "[" in block_id else 0


def _check_attention_stays_in_sequences(built: llama.LlamaGraph) -> int:
    """Every attention task reads key blocks of its query block's sequences only: a full link has one
    sequence in both blocks, a causal one reads its own block and names in `segments` exactly where the
    sequences inside it start. Returns the count of segmented tasks."""
    bounds = [*built.sequence_starts, built.tokens]
    x = built.program.inputs["hidden"]
    split = x.splits[0]
    first = [sum(split[:i]) for i in range(len(split))]
    graph = built.graph
    segmented = 0
    for node in graph.nodes.values():
        if node.op != "attention":
            continue
        q, k = (graph[node.inputs[n]] for n in (0, 1))
        q_block, k_block = (_token_block(t.id) for t in (q, k))
        q_rows = range(first[q_block], first[q_block] + q.shape[0])
        k_rows = range(first[k_block], first[k_block] + k.shape[0])
        q_seqs = {_sequence_of(bounds, r) for r in q_rows}
        k_seqs = {_sequence_of(bounds, r) for r in k_rows}
        if node.attrs.get("causal", False):
            assert q_block == k_block, node.id
            inside = [b - q_rows.start for b in bounds if q_rows.start < b < q_rows.stop]
            assert node.attrs.get("segments", "") == ",".join(map(str, inside)), node.id
            segmented += bool(inside)
        else:
            assert k_block < q_block and len(q_seqs) == 1 and q_seqs == k_seqs, node.id
    return segmented


@SMALL
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8), block=st.sampled_from([4, 7, 16, 32]),
       window=st.sampled_from([None, 3, 20]))
def test_no_attention_task_reads_keys_of_another_sequence(lengths, block, window):
    config = replace(llama.load_config("tiny"), num_hidden_layers=1)
    if window is not None:
        config = replace(config, model_type="mistral", sliding_window=window)
    built = llama.build_llama(config, sum(lengths), block, sequences=lengths)
    _check_attention_stays_in_sequences(built)
    # each sequence's chains read every block of it that causality (and the window) lets them
    links = sum(1 for node in built.graph.nodes.values() if node.op == "attention")
    assert links <= sum(len(split_packed([n], block)) * (len(split_packed([n], block)) + 1) // 2 for n in lengths)


def test_a_batch_of_short_prompts_is_one_segmented_task_per_block_and_head_group():
    config = llama.load_config("tiny")
    built = llama.build_llama(config, 64, 32, sequences=[8] * 8)
    assert _check_attention_stays_in_sequences(built) == 2 * config.num_hidden_layers
    attention = [node for node in built.graph.nodes.values() if node.op == "attention"]
    assert len(attention) == 2 * config.num_hidden_layers  # no chains: one causal task per block
    assert {node.attrs["segments"] for node in attention} == {"8,16,24"}


# ----- each sequence as its own prefill --------------------------------------------------------------------
def _own_prefill(config, weights, ids, block) -> tuple[np.ndarray, list]:
    """A sequence's own prefill in float64 by the formulas: its final hidden states and its k/v per layer."""
    built = llama.build_llama(config, len(ids), min(block, len(ids)), kv_outputs=True)
    outputs = evaluate(built.graph, built.feed(weights, ids))
    return built.gather(outputs), built.gather_kv(outputs)


def _packed_matches_own_prefills(config, lengths, block, seed, budget_slack=1.25, **build):
    weights = llama.RandomWeights(config, seed)
    prompts = [llama.random_ids(config, n, seed + s) for s, n in enumerate(lengths)]
    built = llama.build_llama(config, sum(lengths), block, kv_outputs=True, sequences=lengths, **build)
    budget = int(budget_slack * minimum_budget(built.graph)) // 256 * 256 + 256
    memgraph = compile_taskgraph(built.graph, budget)
    verify_memgraph(memgraph, built.graph)
    assert memgraph.count("offload") + memgraph.count("reload") > 0
    result = execute(memgraph, backend="cpu", order="random", seed=seed, inputs=built.feed(weights, np.concatenate(prompts)))
    hidden, kv = built.gather_sequences(result.outputs), built.gather_kv_sequences(result.outputs)
    assert [len(h) for h in hidden] == list(lengths)
    for s, ids in enumerate(prompts):
        own_hidden, own_kv = _own_prefill(config, weights, ids, block)
        assert _relative(hidden[s], own_hidden) < 1e-5
        assert _relative(hidden[s], llama.float64_forward(config, weights, ids)) < 1e-5
        for (k, v), (own_k, own_v) in zip(kv[s], own_kv):
            assert _relative(k, own_k) < 1e-5 and _relative(v, own_v) < 1e-5
    return built


@pytest.mark.parametrize("preset, lengths, block, build", [
    ("tiny", [8] * 6, 16, {}),  # uniform: three blocks of two
    ("tiny-gqa", [5, 20, 1, 3, 9], 8, {}),  # ragged: one longer than a block, one of length 1
    ("tiny-gqa", [5, 20, 1, 3, 9], 8, {"layer_order": "halves", "query_group": 2}),
    ("tiny-gqa", [12, 2, 2, 9, 7], 8, {"gpus": 2, "placement": "zigzag"}),
    ("tiny", [12, 2, 2, 9, 7], 8, {"gpus": 2, "placement": "layers"}),
    ("tiny-gqa", [12, 2, 2, 9, 7], 8, {"gpus": 2, "placement": "heads"}),
])
def test_packed_prefill_gives_each_sequence_its_own_prefill(preset, lengths, block, build):
    built = _packed_matches_own_prefills(llama.load_config(preset), lengths, block, seed=len(lengths), **build)
    assert _check_attention_stays_in_sequences(built) > 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 14), min_size=1, max_size=5), block=st.sampled_from([4, 6, 8]),
       layer_order=st.sampled_from(llama.LAYER_ORDERS), query_group=st.integers(1, 3), slack=st.sampled_from([1.25, 2.0]),
       seed=st.integers(0, 2**16))
def test_random_batches_in_any_order_and_budget_give_each_sequence_its_own_prefill(lengths, block, layer_order, query_group,
                                                                                 slack, seed):
    config = replace(llama.load_config("tiny-gqa"), num_hidden_layers=1)
    _packed_matches_own_prefills(config, lengths, block, seed, budget_slack=slack, layer_order=layer_order, query_group=query_group)


def test_packed_prefill_keeps_rope_positions_and_windows_per_sequence():
    """Dynamic RoPE scales by each sequence's own length; mistral's window never reaches another sequence."""
    config = llama.load_config("tiny-gqa")
    dynamic = replace(config, rope=Rope(type="dynamic", factor=2.0), max_position_embeddings=10)
    _packed_matches_own_prefills(dynamic, [14, 3, 4, 11], 8, seed=5)
    windowed = replace(config, model_type="mistral", sliding_window=5)
    _packed_matches_own_prefills(windowed, [14, 3, 4, 11], 8, seed=6)


def test_kv_pieces_put_every_row_of_every_kv_output_in_its_sequences_cache():
    """Writing each piece of each k/v output into per-sequence caches (as `execute(outputs_into=)` would)
    rebuilds `gather_kv_sequences`, with every cache row written exactly once."""
    config = llama.load_config("tiny-gqa")
    lengths = [5, 20, 1, 3, 9]
    built = llama.build_llama(config, sum(lengths), 8, gpus=2, placement="heads", kv_outputs=True, sequences=lengths)
    rng = np.random.default_rng(0)
    outputs = {task: rng.standard_normal(built.graph[task].shape) for task in built.graph.outputs}
    width = config.num_key_value_heads * config.head_dim
    caches = [[{kind: np.full((n, width), np.nan) for kind in "kv"} for _ in range(config.num_hidden_layers)] for n in lengths]
    written = [[{kind: np.zeros((n, width), int) for kind in "kv"} for _ in range(config.num_hidden_layers)] for n in lengths]
    pieces = built.kv_pieces()
    assert set(pieces) == {t for layer in built.kv for x in layer for t in (b.id for b in x.blocks.values())}
    for task, parts in pieces.items():
        assert [p.row_start for p in parts] == sorted(p.row_start for p in parts)
        assert sum(p.row_stop - p.row_start for p in parts) == outputs[task].shape[0]
        for p in parts:
            rows = slice(p.first_position, p.first_position + p.row_stop - p.row_start)
            caches[p.sequence][p.layer][p.kind][rows, p.columns[0] : p.columns[1]] = outputs[task][p.row_start : p.row_stop]
            written[p.sequence][p.layer][p.kind][rows, p.columns[0] : p.columns[1]] += 1
    want = built.gather_kv_sequences(outputs)
    for s in range(len(lengths)):
        for layer, (k, v) in enumerate(want[s]):
            np.testing.assert_array_equal(caches[s][layer]["k"], k)
            np.testing.assert_array_equal(caches[s][layer]["v"], v)
            assert (written[s][layer]["k"] == 1).all() and (written[s][layer]["v"] == 1).all()


# ----- the segmented kernel ----------------------------------------------------------------------------------
def _per_sequence_attention(q, k, v, heads, kv_heads, cuts) -> np.ndarray:
    """Causal attention over each sequence alone (tests/formulas_llama.py), stacked."""
    bounds = [0, *cuts, len(q)]
    return np.concatenate([formulas.attention(q[a:b], k[a:b], v[a:b], heads, kv_heads, causal=True)
                           for a, b in zip(bounds, bounds[1:])])


@SMALL
@given(rows=st.integers(2, 24), data=st.data(), kv_heads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_segmented_attention_is_causal_attention_per_sequence(rows, data, kv_heads, seed):
    cuts = sorted(data.draw(st.sets(st.integers(1, rows - 1), min_size=1, max_size=rows - 1)))
    heads, width = 2, 3
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((rows, heads * width))
    k, v = (rng.standard_normal((rows, kv_heads * width)) for _ in range(2))
    attrs = {"heads": heads, "kv_heads": kv_heads, "causal": True, "segments": ",".join(map(str, cuts))}
    want = _per_sequence_attention(q, k, v, heads, kv_heads, cuts)
    np.testing.assert_allclose(apply("attention", [q, k, v], attrs), want, rtol=1e-10, atol=1e-10)
    out = np.full(q.shape, np.nan)
    NUMPY_KERNELS["attention"]([q, k, v], out, attrs)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)
    (shape, dtype) = KERNELS["attention"].infer([q.shape, k.shape, v.shape], ["float64"] * 3, attrs)
    assert shape == q.shape and dtype == "float64"


# ----- the sim's cost ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("segments, calls, triton_calls", [(None, 1, 1), ("1024,2048,3072", 1, 4), ("1000,3000", 3, 3)])
def test_the_sim_prices_a_segmented_block_per_sequence_and_per_call(segments, calls, triton_calls):
    """FLOPs: each sequence's causal block; launches and the loop's attention time: one per call the cuda
    backend makes (torch takes sequences of one length in one batched call, triton one call each)."""
    q = MemNode(0, "input", "q", 0, (0, 0), None, (), shape=(4096, 4096), dtype="float16")
    k = MemNode(1, "input", "k", 0, (0, 0), None, (), shape=(4096, 1024), dtype="float16")
    attrs = {"heads": 32, "kv_heads": 8, "causal": True} | ({} if segments is None else {"segments": segments})
    node = MemNode(2, "kernel", "a", 0, (0, 0), None, (0, 1, 1), kernel="attention", shape=(4096, 4096), dtype="float16", attrs=attrs)
    bounds = [0, *(int(x) for x in (segments or "").split(",") if x), 4096]
    flops = sum(4 * (b - a) ** 2 * 4096 // 2 for a, b in zip(bounds, bounds[1:]))
    for model, count in ((CostModel(), calls), (CostModel().for_attention("triton"), triton_calls)):
        assert model.attention_calls(node) == count
        assert model.kernel_time(node, [q, k, k]) == pytest.approx(flops / model.causal_attention_flops + count * model.launch)
        assert model.host_time(node, [q, k, k]) == pytest.approx(model.host_per_vertex + count * model.host_per_attention)


def test_the_packed_prefill_benchmark_runs_quickly_and_says_each_target(tmp_path):
    """bench/bench_packed.py --quick end to end: every batch plain and with k/v outputs, each against one
    prefill of its tokens and prompt by prompt, the targets named; the JSON holds the same figures."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "packed.json"
    done = subprocess.run([sys.executable, str(root / "bench" / "bench_packed.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["kv_outputs"]) for r in results] == [(b, kv) for kv in (False, True) for b in ("8 x 8", "24 + 16 + 16 + 8")]
    for row in results:
        assert row["packed"]["seconds"] > 0 and row["packed"]["reloaded"] > 0  # the budget forces reloads
        assert row["prompt_by_prompt_s"] > row["packed"]["seconds"]  # each weight streamed once per block, not per prompt
        assert f"| {row['batch']} | {'yes' if row['kv_outputs'] else 'no'} | {row['packed']['blocks']} |" in done.stdout
        assert row["ratio"] == row["packed"]["seconds"] / next(r["one_prefill"]["seconds"] for r in results
                                                                if r["batch"] == row["batch"] and not r["kv_outputs"])

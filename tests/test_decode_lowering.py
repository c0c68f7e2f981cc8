"""The decode step lowered from the prefill's decoder layer is the graph the hand-written builder made.

The step runs every token, so its graph is a performance contract: the same kernels with the same
attributes on the same GPUs, the same operand and result shapes, as many tasks and inputs, moves only where
they were, and the same wiring (each task's operands the same tasks, the inputs by their ids, which the
session and the KV cache feed), the tasks in the same order. tests/decode_reference.py keeps the builder as
the oracle. The compiled plans of both, at budgets from roomy down to the smallest that compiles, have the
same makespan in the sim.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from frontend.workloads import llama
from frontend.workloads.llama.config import from_hf
from frontend.workloads.llama.decode import head_blocks
from frontend.workloads.llama.graph import linear
from frontend.workloads.llama.train import MODULES, LoraSpec, lora_projection
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from tests.decode_reference import reference_decode_graph
from turnip_ir.taskgraph import TaskGraph

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}
CONFIGS = {
    "llama": llama.load_config("tiny"),
    "llama gqa": llama.load_config("tiny-gqa"),
    "llama, 4 layers, fp16": from_hf({**TINY, "num_hidden_layers": 4, "torch_dtype": "float16"}, "four"),
    "qwen2 bias, tied": from_hf({**TINY, "model_type": "qwen2", "tie_word_embeddings": True}, "qwen2"),
    "mistral window": from_hf({**TINY, "model_type": "mistral", "sliding_window": 7}, "mistral"),
    "one head block": from_hf({**TINY, "hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 32}, "wide"),
}
STEPS = [  # (cache lengths, kv_block)
    ([0, 5, 3], 2),
    ([23], 4),
    ([40, 1030], 1024),
    ([0], 1024),
]


def signatures(graph: TaskGraph) -> Counter:
    """The multiset of (op, attributes, operands' (shape, dtype, GPU), shape, dtype, GPU, is an output) of the tasks."""
    nodes, outputs = graph.nodes, set(graph.outputs)
    return Counter((node.op, tuple(sorted(node.attrs.items())), tuple((nodes[i].shape, nodes[i].dtype, nodes[i].device) for i in node.inputs),
                    node.shape, node.dtype, node.device, node.id in outputs) for node in nodes.values())


def wiring(graph: TaskGraph, table: dict) -> list[int]:
    """Each task named by what it computes from the inputs (by id): its signature and its operands' names, interned
    in `table` (shared by the graphs compared), in the graph's order, inputs left out (they are created where
    first read). Equal lists mean equal graphs up to the tasks' own ids, their tasks in the same order (the
    order a plan's schedule follows)."""
    names: dict[str, int] = {}
    for node in graph.nodes.values():  # operands before their readers
        what = (node.op, tuple(sorted(node.attrs.items())), node.shape, node.dtype, node.device,
                node.id if node.op == "input" else None, tuple(names[i] for i in node.inputs), node.id in graph.outputs)
        names[node.id] = table.setdefault(what, len(table))
    return [names[node.id] for node in graph.nodes.values() if node.op != "input"]


def makespans(graph: TaskGraph, budgets: list[int]) -> list[float]:
    """The sim's makespan of `graph`'s plan at each budget, planned as the session plans a step (inputs kept)."""
    return [execute(compile_taskgraph(graph, budget, inputs="recur"), backend="sim", order="fixed").summary.makespan
            for budget in budgets]


@pytest.mark.parametrize("family", CONFIGS)
@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("lengths, kv_block", STEPS)
def test_the_decode_step_is_the_hand_written_graph(family, gpus, lengths, kv_block):
    config = CONFIGS[family]
    step = llama.build_decode_step(config, lengths, gpus=gpus, kv_block=kv_block)
    want = reference_decode_graph(config, tuple(lengths), step.columns, gpus, kv_block)
    got = signatures(step.graph)
    assert got == signatures(want), f"tasks only in the new graph: {got - signatures(want)}; only in the old: {signatures(want) - got}"
    table: dict = {}
    assert wiring(step.graph, table) == wiring(want, table)
    assert {n.id for n in step.graph.nodes.values() if n.op == "input"} == {n.id for n in want.nodes.values() if n.op == "input"}


@pytest.mark.parametrize("family, gpus", [("llama gqa", 1), ("qwen2 bias, tied", 2), ("mistral window", 2), ("llama, 4 layers, fp16", 2)])
def test_the_decode_steps_plans_take_as_long_as_the_hand_written_ones(family, gpus):
    config = CONFIGS[family]
    step = llama.build_decode_step(config, [9, 0, 17], gpus=gpus, kv_block=4)
    want = reference_decode_graph(config, step.cache_lengths, step.columns, gpus, 4)
    least = minimum_budget(want)
    assert minimum_budget(step.graph) == least
    budgets = [1 << 30, 4 * least, 2 * least, least]
    assert makespans(step.graph, budgets) == makespans(want, budgets)


def test_the_7b_decode_step_is_the_hand_written_graph_and_plans_as_fast():
    """The model the step is tuned for: 32 layers over 2 GPUs, a batch of 8 at several kv blocks, 4 and 8 GiB."""
    config = llama.load_config("7b")
    lengths = [100, 3000, 2500, 1, 700, 1024, 2048, 4000]
    step = llama.build_decode_step(config, lengths, gpus=2)
    want = reference_decode_graph(config, tuple(lengths), step.columns, 2, llama.KV_BLOCK)
    assert signatures(step.graph) == signatures(want)
    table: dict = {}
    assert wiring(step.graph, table) == wiring(want, table)
    budgets = [8 << 30, 4 << 30]
    assert makespans(step.graph, budgets) == makespans(want, budgets)


def test_a_head_of_one_block_is_fed_whole_by_its_own_name():
    """From hidden 1024 up the head's blocks are 8192 rows, so a vocabulary of 128 is one block: its input is
    the head's own name, fed the whole head, and its output alone is the logits."""
    config = CONFIGS["one head block"]
    weights = llama.RandomWeights(config, 1)
    step = llama.build_decode_step(config, [2], kv_block=4)
    assert head_blocks(config) == [(0, 128)] and "lm_head.weight" in step.graph.nodes
    cache = [[(np.zeros((2, 256), "float32"),) * 2] * config.num_hidden_layers]
    inputs = step.feed(weights, np.zeros((1, 1024), "float32"), cache)
    assert inputs["lm_head.weight"].shape == (128, 1024) and np.array_equal(inputs["lm_head.weight"], weights["lm_head.weight"])
    assert step.logits({"logits": np.arange(128.0)[None]}).tolist() == [list(range(128))]


def test_adapters_lower_into_the_prefill_and_the_decode_step():
    """A LoRA projection (training's) given to the prefill and to the step: the hidden states, the cache rows and the
    logits equal those of the weights with each adapter merged in, W + (alpha / r) B A, on every projection."""
    config = llama.load_config("tiny-gqa")
    spec = LoraSpec(rank=4, alpha=8.0, targets=tuple(MODULES))
    weights = dict(llama.RandomWeights(config, 2))
    rng = np.random.default_rng(0)
    adapters = {name: (0.1 * rng.standard_normal(shape)).astype("float32") for name, shape in spec.shapes(config).items()}
    merged = dict(weights)
    for name, a in adapters.items():
        if name.endswith(".lora_A.weight"):
            module = name.removesuffix(".lora_A.weight")
            merged[module + ".weight"] = weights[module + ".weight"] + spec.scaling * adapters[module + ".lora_B.weight"] @ a
    ids = np.array([3, 1, 4, 1, 5])
    results = []
    for values, projection in ((merged, linear), ({**weights, **adapters}, lora_projection(spec, config.dtype))):
        prefill = llama.build_llama(config, 4, block=2, kv_outputs=True, projection=projection)
        outputs = _run(prefill.graph, prefill.feed(values, ids[:4]))
        cache = prefill.gather_kv(outputs)
        step = llama.build_decode_step(config, [4], kv_block=2, projection=projection)
        logits = step.logits(_run(step.graph, step.feed(values, llama.embed(values, ids[4:], config), [cache])))
        results.append((prefill.gather(outputs), np.concatenate([np.concatenate(pair, axis=1) for pair in cache], axis=1), logits))
    assert any(node.id.endswith("lora_b") for node in step.graph.nodes.values())
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _run(graph: TaskGraph, inputs: dict) -> dict:
    return execute(compile_taskgraph(graph, 1 << 30), backend="cpu", inputs=inputs).outputs

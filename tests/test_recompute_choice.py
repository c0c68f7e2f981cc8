"""The sim's choice of how many layers a training step recomputes (turnip/recompute.py): where the host link
binds, recomputing wins and is chosen; where compute binds, none is; every candidate's plan verifies, and
the chosen step gives the plain step's gradients."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from frontend.workloads import llama
from frontend.workloads.llama.config import from_hf
from frontend.workloads.llama.train import LoraSpec, build_training_step
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from turnip.recompute import choose_recompute, recompute_candidates
from turnip_ir.cost import CostModel

CONFIG = from_hf({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 1024,
                  "model_type": "llama", "dtype": "float16"}, "tiny4")
LORA = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
SEQ_LEN, BLOCK = 512, 128
QUIET = {"launch": 0.0, "host_per_vertex": 0.0, "host_per_attention": 0.0, "notify_latency": 0.0}
"""No loop or launch costs: the tiny step's plans differ in their link and GPU work alone."""
SLOW_LINK = replace(CostModel(), h2d_bw=2e9, d2h_bw=2e9, duplex_bw=4e9, **QUIET)
SLOW_GPU = replace(CostModel(), half_flops=1e9, fp32_flops=1e9, attention_flops=1e9, causal_attention_flops=1e9, hbm_bw=1e9, **QUIET)


def _choose(cost: CostModel):
    budget = {}
    built = []

    def build(k):
        step = build_training_step(CONFIG, 1, SEQ_LEN, LORA, block=BLOCK, recompute=k)
        built.append(k)
        return step

    def plan(step):
        budget.setdefault("bytes", int(minimum_budget(step.graph) * 4))  # the plain step's: one budget for all
        return compile_taskgraph(step.graph, budget["bytes"], remat=True, cost=cost, inputs="host", start_on_gpu=step.activation_ids)

    return choose_recompute(build, plan, CONFIG.num_hidden_layers, lambda: cost), built


def test_the_candidates_are_none_half_and_all():
    assert recompute_candidates(32) == [0, 16, 32]
    assert recompute_candidates(1) == [0, 1]


def test_where_the_link_binds_recomputing_is_chosen():
    choice, _ = _choose(SLOW_LINK)
    assert choice.layers > 0
    assert choice.step.recomputed == choice.layers
    assert choice.makespans[choice.layers] < choice.makespans[0]
    assert "recomputes the forward of" in choice.text()


def test_where_compute_binds_none_is_chosen_and_the_next_candidate_is_not_tried():
    choice, built = _choose(SLOW_GPU)
    assert choice.layers == 0
    assert built == [0, 2]  # half tried, lost: all is not built
    assert math.isinf(choice.makespans[2]) or choice.makespans[2] >= choice.makespans[0]


def test_the_chosen_step_computes_the_plain_steps_gradients():
    choice, _ = _choose(SLOW_LINK)
    config64 = replace(CONFIG, dtype="float64")
    weights = dict(llama.RandomWeights(config64, seed=1))
    rng = np.random.default_rng(0)
    adapters = {name: 0.2 * rng.standard_normal(shape) for name, shape in LORA.shapes(config64).items()}
    ids = rng.integers(0, CONFIG.vocab_size, (1, SEQ_LEN))
    grads = []
    for count in (0, choice.layers):
        step = build_training_step(config64, 1, SEQ_LEN, LORA, block=BLOCK, recompute=count)
        memgraph = compile_taskgraph(step.graph, int(minimum_budget(step.graph) * 1.5), remat=True)
        grads.append(step.grads(execute(memgraph, "cpu", order="random", seed=count, inputs=step.feed(weights, adapters, ids)).outputs))
    for name in grads[0]:
        np.testing.assert_array_equal(grads[1][name], grads[0][name])


if __name__ == "__main__":
    pytest.main([__file__])

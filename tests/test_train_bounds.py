"""bench/investigations/train_bounds.py: its bounds of a training step are bounds. The sim's makespan of
real plans of the step (a budget that forces offload, nothing or every layer recomputed, in random orders),
priced by the same cost model, is never below them; and they order as they must."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "investigations"))

import train_bounds  # noqa: E402
from frontend.workloads.llama import LoraSpec, build_training_step, load_config  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import sim_makespan  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402

LORA = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))


@pytest.mark.parametrize("recompute", [0, 2])
def test_no_plan_of_the_step_beats_its_bounds(recompute):
    config, seq_len, cost = load_config("tiny"), 256, CostModel()
    found = train_bounds.bounds(config, LORA, seq_len, budget=0, rate=cost.h2d_bw, cost=cost)
    assert 0 < found["backward"] < found["work"] <= found["phase"]
    assert found["held"] == found["phase"]  # nothing held: the same bound
    step = build_training_step(config, 1, seq_len, LORA, recompute=recompute)
    for budget in (192 << 10, 1 << 30):  # the first forces offload (tiny: 145 KiB the least)
        memgraph = compile_taskgraph(step.graph, budget, remat=True, inputs="host", start_on_gpu=step.activation_ids)
        for seed in range(3):
            span = sim_makespan(memgraph, order="random" if seed else "nondet", cost=cost)
            assert span >= found["phase"] * (1 - 1e-9), (budget, seed, span, found)


def test_weights_held_lower_only_the_link_part():
    config, cost = load_config("tiny"), CostModel()
    none = train_bounds.bounds(config, LORA, 128, budget=0, rate=1e6, cost=cost)  # a slow link: bound by it
    held = train_bounds.bounds(config, LORA, 128, budget=1 << 40, rate=1e6, cost=cost)
    assert none["phase"] > none["work"] and held["held"] == held["work"] == none["work"]
    assert none["phase"] == pytest.approx(held["phase"])

"""bench/investigations/train_bounds.py: its bounds of a training step are bounds. The sim's makespan of
real plans of the step (a budget that forces offload and one that does not, nothing or every layer
recomputed, nondet and random orders, the kernels or a slow link binding), priced by the same cost model,
is never below them; and they order as they must."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "investigations"))

import train_bounds  # noqa: E402
from frontend.workloads.llama import LoraSpec, build_training_step, load_config  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import execute  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402

LORA = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))


@pytest.mark.parametrize("recompute", [0, 2])
@pytest.mark.parametrize("link", [None, 5e7])
def test_no_plan_of_the_step_beats_its_bounds(recompute, link):
    """Tiny (2 layers), nothing or both recomputed; at the cost model's link the kernels bind, on a slow link
    (both directions at `link` bytes/s) the weights' crossing before the loss does."""
    config, seq_len, cost = load_config("tiny"), 256, CostModel()
    if link is not None:
        cost = replace(cost, h2d_bw=link, d2h_bw=link, duplex_bw=2 * link)
    found = train_bounds.bounds(config, LORA, seq_len, budget=0, rate=cost.h2d_bw, cost=cost)
    assert 0 < found["backward"] < found["work"] <= found["phase"]
    assert (found["phase"] > 1.5 * found["work"]) == (link is not None)  # which part binds
    assert found["held"] == found["phase"]  # nothing held: the same bound
    step = build_training_step(config, 1, seq_len, LORA, recompute=recompute)
    for budget in (192 << 10, 1 << 30):  # the first forces offload (tiny: 145 KiB the least)
        memgraph = compile_taskgraph(step.graph, budget, remat=True, inputs="host", start_on_gpu=step.activation_ids)
        for order, seed in (("nondet", 0), ("random", 1), ("random", 2)):
            span = execute(memgraph, backend="sim", order=order, seed=seed, cost=cost, verify=False).summary.makespan
            assert span >= found["phase"] * (1 - 1e-9), (budget, order, seed, span, found)


def test_weights_held_lower_only_the_link_part():
    config, cost = load_config("tiny"), CostModel()
    none = train_bounds.bounds(config, LORA, 128, budget=0, rate=1e6, cost=cost)  # a slow link: bound by it
    held = train_bounds.bounds(config, LORA, 128, budget=1 << 40, rate=1e6, cost=cost)
    assert none["phase"] > none["work"] and held["held"] == held["work"] == none["work"]
    assert none["phase"] == pytest.approx(held["phase"])

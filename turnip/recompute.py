"""How much of a training step's forward pass is computed again before its backward: chosen by the sim.

A LoRA step's backward reads what each layer's forward made (its norms, projections, attention partials).
Kept, those activations crowd the frozen weights out of the arena at the turn from forward to backward,
and a budget that cannot hold them moves them out and back over the host link, or the planner recomputes
them one at a time (passes/planner.py, `remat`). A layer whose forward is written again just before its
backward (frontend/autodiff.py `grad(recompute=)`) keeps only its input across the turn: the link carries
fewer bytes, the GPU computes that layer's forward twice. Which wins depends on the step: at 4,096 tokens
a 7b step at 8 GiB is bound by the link and gains (sim: 0.596 s with none, 0.556 s with the first 16
layers); at 16,384 it is bound by compute and loses (2.396 s against 2.508 s).

`choose_recompute` compiles the step with none, then with the first half of the layers recomputed, then
with all of them while each does better, and keeps the fastest by the sim's makespan (a later candidate's
simulation stops once it passes the best so far). The first layers go first: their activations are the
ones held longest (their backward comes last).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from runtime import sim_makespan
from turnip_ir.cost import CostModel
from turnip_ir.memgraph import MemGraph

Step = TypeVar("Step")


@dataclass
class RecomputeChoice(Generic[Step]):
    """The chosen count of recomputed layers, its step and plan, and every candidate's sim makespan in
    seconds (inf: its simulation was stopped once it passed the best)."""

    layers: int
    step: Step
    memgraph: MemGraph
    makespans: dict[int, float] = field(default_factory=dict)

    def text(self) -> str:
        tried = ", ".join(f"{k}: {'over' if math.isinf(s) else f'{s:.3f} s'}" for k, s in self.makespans.items())
        return f"recomputes the forward of {self.layers} layer(s) before their backward (sim by layers recomputed: {tried})"


def recompute_candidates(layers: int) -> list[int]:
    """None, the first half, all: in the order they are tried."""
    return list(dict.fromkeys((0, layers // 2, layers)))


def choose_recompute(build: Callable[[int], Step], plan: Callable[[Step], MemGraph], layers: int,
                     cost: Callable[[], CostModel | None] = lambda: None) -> RecomputeChoice[Step]:
    """The fastest of `build(k)`'s plans (`plan(step)`) by the sim under `cost()` (read after the first
    plan: a session resolves its attention provider there), for k in `recompute_candidates(layers)`, each
    tried only while the one before it did better (module docstring)."""
    best: RecomputeChoice | None = None
    makespans: dict[int, float] = {}
    for k in recompute_candidates(layers):
        step = build(k)
        memgraph = plan(step)
        limit = best.makespans[best.layers] if best is not None else math.inf
        makespans[k] = sim_makespan(memgraph, cost=cost(), deadline=(lambda limit=limit: limit) if best is not None else None, compiled=True)
        if makespans[k] >= limit:
            break
        best = RecomputeChoice(k, step, memgraph, makespans)
    return best

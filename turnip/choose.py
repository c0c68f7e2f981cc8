"""The llama prefill's plan by default: layer order, token block, query group and schedule chosen by the
sim for the budget at hand, in seconds (`choose_llama_plan`; `turnip llama`, `turnip build llama` and a
session's prefills call it, the session at its fixed arena).

A dimension given a value is kept; the others are searched (turnip/search.py: the `auto` flags' search,
one dimension at a time, each candidate ranked by the sim's makespan, made cheap by bounds, deadlines and
forks without changing what it chooses). Where the budget does not bind there is no search: the default
plan's makespan within `BIND_MARGIN` of its lower bound (turnip/bounds.py) leaves no other plan more than
that to gain (unless a dimension is asked for by `auto`, which asks for the ranking itself). The choice is
kept on disk (turnip/choice_cache.py, keyed by everything that changes it: `choice_key`), and with a plan
folder the chosen plan too, so a second process does neither the search nor the compile. The sim predicts
a GPU: callers search for the sim and cuda backends (the cpu backend keeps the defaults unless asked).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from passes.schedules import SCHEDULES
from turnip.candidates import DIMENSIONS, QUERY_GROUPS, Candidate, LlamaPrefill, PlanTarget, block_candidates
from turnip.choice_cache import ChoiceCache, keep_plan, kept_plan
from turnip.plans import PLAN_FORMAT
from turnip.search import LlamaChoice, Search
from turnip_ir.cost import CostModel

__all__ = ["BIND_MARGIN", "Candidate", "LlamaChoice", "LlamaPrefill", "PlanTarget", "block_candidates", "choice_key",
           "choose_llama_plan"]

BIND_MARGIN = 0.03
"""The default plan within this share of its lower bound: the budget does not bind, nothing is searched."""


def choose_llama_plan(prefill: LlamaPrefill, target: PlanTarget, given: Mapping[str, object] | None = None, *,
                      remat: bool = False, cache: ChoiceCache | None = None, plan_dir: Path | None = None,
                      workers: int | None = None, margin: float = BIND_MARGIN, processes: str = "fork") -> LlamaChoice:
    """The prefill's plan at `target`: each dimension of `DIMENSIONS` that `given` names with a value is
    forced (None: the frontend's default); one it leaves out, or names `auto`, is searched (the
    module docstring). A `cache` keeps choices; `plan_dir` keeps plans (turnip/plans.py) and the choices
    too where no cache is given. `workers` (None: one per core) caps the processes compiling at once;
    `processes="forkserver"` starts them from a server process, for a caller that holds page-locked memory
    (turnip/forks.py). Raises the first candidate's `BudgetError` when none fits."""
    # the cuda backend's `auto` attention resolved first (torch's import, about 1 s on a GPU host), outside the
    # choosing's clock: the run imports it all the same, choice or not
    given, target = dict(given or {}), target.resolved()
    began = time.perf_counter()
    searched = [name for name in DIMENSIONS if given.get(name, "auto") == "auto"]
    start = prefill.start(given)
    if not searched:
        return _planned(prefill, target, start, remat, plan_dir, "given", began)
    cache = cache or (ChoiceCache(plan_dir) if plan_dir is not None else None)
    key = choice_key(prefill, target, given, remat, margin)
    kept = cache.read(key, lambda choice: _valid(prefill, start, searched, choice)) if cache is not None else None
    if kept is not None:
        return _planned(prefill, target, Candidate(**kept), remat, plan_dir, "kept", began)
    shortcut = margin if "auto" not in given.values() else None  # `auto` asks for the ranking itself
    choice = Search(prefill, target, start, searched, remat, shortcut, processes).run(workers)
    if plan_dir is not None:
        keep_plan(plan_dir, choice.built.graph, choice.memgraph.budget, choice.candidate.schedule, remat, choice.memgraph)
    if cache is not None:
        cache.write(key, asdict(choice.candidate), {"how": choice.how, "makespan": choice.makespan})
    choice.seconds = time.perf_counter() - began
    return choice


def choice_key(prefill: LlamaPrefill, target: PlanTarget, given: Mapping[str, object], remat: bool = False,
               margin: float = BIND_MARGIN) -> dict:
    """Everything a choice depends on, as JSON: the model and the prefill's shape (tokens, GPUs, placement),
    the target (budget, backend, attention provider, streams, arena), what was given, remat, the margin, the
    plan format and the cost model the sim ranks by."""
    return {"prefill": prefill.key(), "target": asdict(target), "given": {name: given[name] for name in sorted(given)},
            "remat": remat, "margin": margin, "plan_format": PLAN_FORMAT, "cost": asdict(CostModel())}


def _valid(prefill: LlamaPrefill, start: Candidate, searched: list[str], choice: Mapping) -> bool:
    """A kept choice is one the search could make: a value for each dimension, those given as given, the
    others among the candidates (a block up to the token count, a query group up to the blocks)."""
    if set(choice) != set(DIMENSIONS) or any(choice[name] != getattr(start, name) for name in DIMENSIONS if name not in searched):
        return False
    block = choice["block"]
    if not isinstance(block, int) or isinstance(block, bool) or not 0 < block <= prefill.tokens:
        return False
    group = choice["query_group"]
    if "query_group" in searched and (group not in QUERY_GROUPS or group > -(-prefill.tokens // block)):
        return False
    return choice["layer_order"] in llama.LAYER_ORDERS and choice["schedule"] in SCHEDULES


def _planned(prefill: LlamaPrefill, target: PlanTarget, candidate: Candidate, remat: bool, plan_dir: Path | None, how: str,
             began: float) -> LlamaChoice:
    """`candidate`'s graph and plan (from the plan folder, or compiled), chosen `how`: given, or kept."""
    built = prefill.build(candidate)
    arena = target.arena_of(built.graph)
    memgraph, read = kept_plan(plan_dir, built.graph, arena, candidate.schedule, remat,
                               lambda: compile_taskgraph(built.graph, arena, candidate.schedule, remat=remat))
    return LlamaChoice(candidate, built, memgraph, how, seconds=time.perf_counter() - began, plan_read=read)



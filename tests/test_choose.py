"""The plan chosen by default (turnip/choose.py) is the one the plain search chooses: each dimension ranked in
turn by compiling and simulating every candidate to its end, with no bound, deadline or fork. A dimension
given a value is kept; where the budget does not bind nothing is searched; the chosen plan is verified."""

from __future__ import annotations

import multiprocessing
from dataclasses import replace

import pytest

from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from runtime import sim_makespan
from turnip import choose, forks, search
from turnip.choose import Candidate, LlamaPrefill, PlanTarget, choose_llama_plan
from turnip_ir.errors import BudgetError
from turnip_ir.verifier import verify_memgraph

TINY = llama.load_config("tiny")
HALF = replace(TINY, dtype="float16", name="tiny-half")
WIDE = replace(llama.load_config("7b"), num_hidden_layers=2, intermediate_size=4096, name="wide")
"""7b's width and 4096-token blocks, two layers: small token blocks cost the loop more than the best plan
takes, so they are left out by the bound before they are built."""
KIB, MIB = 1 << 10, 1 << 20
CASES = [
    (LlamaPrefill(TINY, 256), PlanTarget(96 * KIB)),
    (LlamaPrefill(TINY, 256), PlanTarget(128 * KIB)),  # the dfs schedule wins
    (LlamaPrefill(TINY, 256), PlanTarget(384 * KIB)),
    (LlamaPrefill(HALF, 1024), PlanTarget(512 * KIB)),
    (LlamaPrefill(llama.load_config("tiny-gqa"), 200, gpus=2), PlanTarget(96 * KIB)),  # query groups of 4 win
    (LlamaPrefill(llama.load_config("tiny-gqa"), 200, gpus=2), PlanTarget(192 * KIB)),
    (LlamaPrefill(TINY, 256, kv_outputs=True), PlanTarget(1 << 30, arena=128 * KIB)),  # a session's form; blocks win
    # a session's packed prefill of four prompts (no hidden states): layers in halves win
    (LlamaPrefill(TINY, 256, kv_outputs=True, sequences=(60, 70, 30, 96), hidden=False), PlanTarget(1 << 30, arena=128 * KIB)),
    (LlamaPrefill(WIDE, 8192), PlanTarget(256 * MIB)),
    (LlamaPrefill(WIDE, 8192), PlanTarget(512 * MIB)),
]


def plain_search(prefill: LlamaPrefill, target: PlanTarget) -> tuple[Candidate, float]:
    """Layer order, block, query group, schedule: each ranked around the choices before it, every candidate
    compiled and simulated to its end, the fastest kept (the first of equals)."""
    path = Candidate("blocks", min(llama.default_block(prefill.config, prefill.tokens), prefill.tokens), 1, "given")
    small = {prefill.tokens // 4, prefill.tokens // 2} if prefill.tokens < 4096 else set()
    for dimension in ("layer_order", "block", "query_group", "schedule"):
        values = {"layer_order": ["blocks", "halves"],
                  "block": sorted({min(b, prefill.tokens) for b in (1024, 2048, 4096, 8192)} | small),
                  "query_group": [g for g in (1, 2, 4, 8) if g <= -(-prefill.tokens // path.block)],
                  "schedule": ["given", "dfs", "memory"]}[dimension]
        scored = []
        for value in values:
            candidate = replace(path, **{dimension: value})
            graph = prefill.build(candidate).graph
            try:
                memgraph = compile_taskgraph(graph, target.arena_of(graph), candidate.schedule)
            except BudgetError:
                continue
            scored.append((sim_makespan(memgraph), candidate))
        best, path = min(scored, key=lambda pair: pair[0])
    return path, best


@pytest.mark.parametrize("prefill, target, processes", [(*case, processes) for case in CASES for processes in (None, "fork")]
                         + [(*CASES[1], "forkserver"), (*CASES[7], "forkserver"), (*CASES[8], "forkserver")])
def test_the_default_choice_is_the_plain_searchs(prefill, target, processes, monkeypatch):
    """In process, in forked processes and in processes forked from a server (None: in process)."""
    if processes and not forks.available(processes):
        pytest.skip(f"{processes} is not available here")
    monkeypatch.setattr(search, "FORK_FROM", 0 if processes else search.FORK_FROM)
    here = []  # verifications in this process (a fork counts its own)
    real = search.verified
    monkeypatch.setattr(search, "verified", lambda memgraph, graph: here.append(graph) or real(memgraph, graph))
    choice = choose_llama_plan(prefill, target, workers=2 if processes else 1, processes=processes or "fork")
    expected, makespan = plain_search(prefill, target)
    assert choice.how == "searched" and (choice.candidate, choice.makespan) == (expected, makespan)
    # the winner was the best of its rank when it finished, so its fork verified it: the parent did not again
    assert len(here) == (0 if processes else 1)
    assert choice.workers == (2 if processes else 1)
    assert (choice.built.block, choice.built.layer_order, choice.built.query_group) == (
        expected.block, expected.layer_order, expected.query_group)
    verify_memgraph(choice.memgraph, choice.built.graph)
    assert choice.memgraph.budget == target.arena_of(choice.built.graph)
    assert sim_makespan(choice.memgraph) == makespan
    assert [step.dimension for step in choice.steps] == ["layer_order", "block", "query_group", "schedule"]


def test_the_search_saves_work_the_plain_search_does():
    """In every case above some candidate is left out by a bound or stopped at its deadline; both happen."""
    kinds: dict[str, int] = {}
    for prefill, target in CASES:
        counts = choose_llama_plan(prefill, target, workers=1).counts
        assert counts.get("bounded", 0) + counts.get("stopped", 0) >= 1, (prefill, target, counts)
        for kind, count in counts.items():
            kinds[kind] = kinds.get(kind, 0) + count
    assert kinds["bounded"] >= 1 and kinds["stopped"] >= 1 and kinds["no fit"] >= 1


def test_a_dimension_given_a_value_is_kept_and_not_searched():
    prefill, target = LlamaPrefill(TINY, 256), PlanTarget(128 * KIB)
    choice = choose_llama_plan(prefill, target, {"block": 32, "schedule": "memory"})
    assert (choice.candidate.block, choice.candidate.schedule, choice.built.block) == (32, "memory", 32)
    assert [step.dimension for step in choice.steps] == ["layer_order", "query_group"]
    every = {"block": 128, "layer_order": "halves", "query_group": 2, "schedule": "dfs"}
    choice = choose_llama_plan(prefill, PlanTarget(256 * KIB), every)
    assert choice.how == "given" and choice.candidate == Candidate("halves", 128, 2, "dfs") and not choice.steps
    verify_memgraph(choice.memgraph, choice.built.graph)
    defaults = choose_llama_plan(prefill, target, dict.fromkeys(every))  # None: the frontend's default
    assert defaults.how == "given" and defaults.candidate == Candidate("blocks", 64, 1, "given")


def test_where_the_budget_does_not_bind_nothing_is_searched_unless_auto_asks():
    prefill, target = LlamaPrefill(TINY, 256), PlanTarget(1 << 30)
    choice = choose_llama_plan(prefill, target)
    assert choice.how == "unbound" and choice.counts == {"ran": 1} and not choice.steps
    assert choice.candidate == Candidate("blocks", 64, 1, "given")
    assert choice.bound <= choice.makespan <= (1 + choose.BIND_MARGIN) * choice.bound
    asked = choose_llama_plan(prefill, target, {"block": "auto"})
    assert asked.how == "searched" and len(asked.steps) == 4


def test_remat_reaches_every_compile_of_the_search(monkeypatch):
    seen = []
    compile_real = search.compile_taskgraph
    monkeypatch.setattr(search, "compile_taskgraph", lambda *a, **k: (seen.append(k.get("remat")), compile_real(*a, **k))[1])
    choice = choose_llama_plan(LlamaPrefill(TINY, 256), PlanTarget(160 * KIB), remat=True, workers=1)
    assert choice.how == "searched" and len(seen) >= 4 and all(seen)


def test_a_cuda_target_names_its_attention_provider_before_any_fork():
    """`auto` is resolved in the parent (here numba's simulator: cublas); its workspace is the arena's."""
    target = PlanTarget(256 * MIB, "cuda").resolved()
    assert target.attention == "cublas"
    graph = LlamaPrefill(TINY, 64).build(Candidate("blocks", 16, 1, "given")).graph
    assert target.arena_of(graph) == PlanTarget(256 * MIB, "cuda", "auto").arena_of(graph) < 256 * MIB


class _ScriptedPool:
    """A stand-in for `forks.ForkPool` whose children finish one at a time in a random order, each running
    its work when it finishes (so it reads the deadlines as they are then)."""

    def __init__(self, slots: int, rng):
        self.slots, self.rng, self.children = slots, rng, {}
        self.context = multiprocessing.get_context("fork")

    @property
    def free(self) -> int:
        return self.slots - len(self.children)

    def start(self, key, work) -> None:
        assert self.free > 0 and key not in self.children
        self.children[key] = work

    def wait(self, timeout=None):
        if timeout == 0 and self.rng.random() < 0.5:  # none has finished yet
            return []
        key = self.rng.choice(sorted(self.children, key=repr))
        return [(key, self.children.pop(key)())]

    def stop(self, key) -> None:
        del self.children[key]

    def close(self) -> None:
        self.children.clear()


def _scripted_search(table: dict, prefill: LlamaPrefill) -> Candidate:
    """The plain search over `table`'s makespans (None: does not fit)."""
    path = prefill.start({})
    for dimension in choose.DIMENSIONS:
        scored = [(table[c], c) for c in prefill.candidates(dimension, path) if table[c] is not None]
        path = min(scored, key=lambda pair: pair[0])[1]
    return path


@pytest.mark.parametrize("seed", range(60))
def test_whatever_order_forked_candidates_finish_in_the_choice_is_the_plain_searchs(seed, monkeypatch):
    """Makespans drawn at random (ties and misfits among them), children finishing in a random order: the
    choice, and the plan that comes back with it, are the plain search's."""
    import random

    rng = random.Random(seed)
    prefill = LlamaPrefill(TINY, 256)
    orders = [replace(prefill.start({}), layer_order=o) for o in llama.LAYER_ORDERS]
    everything = {c2 for c in orders for b in choose.block_candidates(256) for c1 in [replace(c, block=b)]
                  for g in (1, 2, 4, 8) for s in ("given", "dfs", "memory") for c2 in [replace(c1, query_group=g, schedule=s)]}
    table = {c: rng.choice([None, 1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0]) for c in sorted(everything, key=repr)}
    table[prefill.start({})] = rng.choice([4.0, 5.0, 6.0])  # the default fits

    def scripted(prefill, target, candidate, deadline, remat=False, cost=None, built=None):
        score = table[candidate]
        if score is None:
            return search.Outcome("no fit", error=f"{candidate} does not fit")
        if score > deadline() * (1 + search.TIE):
            return search.Outcome("stopped", deadline(), 0.0)
        return search.Outcome("ran", score, 0.0, memgraph=f"the plan of {candidate}")

    monkeypatch.setattr(search, "evaluate", scripted)
    monkeypatch.setattr(search, "verified", lambda memgraph, graph: memgraph)
    monkeypatch.setattr(search, "FORK_FROM", 0)
    monkeypatch.setattr(forks, "available", lambda method: True)
    monkeypatch.setattr(forks, "ForkPool", lambda slots, method, preload: _ScriptedPool(slots, rng))
    monkeypatch.setenv(search.SPINE_VARIABLE, rng.choice("01"))  # each contender's schedules early, or not
    choice = choose_llama_plan(prefill, PlanTarget(1 << 30), workers=rng.choice([2, 3, 5, 9, 16]))
    expected = _scripted_search(table, prefill)
    assert choice.candidate == expected and choice.memgraph == f"the plan of {expected}"
    assert choice.makespan == table[expected]


def test_once_only_the_schedule_is_left_the_path_is_made_ready_while_forks_run(tmp_path):
    """`_ready_path`: when the dimensions left to rank do not change the taskgraph, the path's graph is built
    and its fork's kept plan read back while this process would only wait (not after the last fork);
    before that (a graph dimension still being ranked) nothing is done."""
    import pickle

    prefill = LlamaPrefill(TINY, 256)
    path = prefill.start({})
    kept = tmp_path / "plan.pickle"
    kept.write_bytes(pickle.dumps("the path's plan"))
    for dimensions, step, ready in ((["query_group", "schedule"], 0, False), (["query_group", "schedule"], 1, True), (["schedule"], 0, True)):
        state = search.Search(prefill, PlanTarget(1 << 30), path, dimensions, remat=False, margin=None)
        state.pool, state.step = object(), step  # forks run (none is asked anything here)
        state.results[path] = search.Outcome("ran", 1.0, 0.5, kept=str(kept), proved=True)
        state._ready_path()
        assert (search._graph_of(path) in state.graphs) == ready
        assert state.results[path].memgraph == ("the path's plan" if ready else None)

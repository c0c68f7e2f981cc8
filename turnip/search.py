"""The plan search for a llama prefill: one dimension at a time, each candidate built, bounded, compiled and
simulated, cheaply, with the choice the plain search would make.

State (`Search`): each candidate's outcome, the choices so far (`path`) and the dimension being ranked
(`step`). Ranking a dimension evaluates every candidate of it around the path and takes the fastest (the
first of equals) as the new path. A candidate's deadline is the best makespan so far among the candidates
it is ranked with (its own dimension's, around the same other choices), never a better plan found for
another dimension, so the choice is the plain search's candidate for candidate:
- a candidate whose lower bound (turnip/bounds.py) is above its deadline is not compiled, and a token
  block whose attention links alone keep the loop busier than that is not even built (`link_floor`); a
  plan whose copies alone take longer is not simulated (`plan_bound`);
- a candidate's sim run stops once its clock passes its deadline (the sim backend's `deadline`);
- candidates are compiled and simulated in forked processes (turnip/forks.py), one per core, reading
  their deadlines from shared memory as the parent lowers them. A core the dimension at hand leaves idle
  takes the later dimensions' candidates around each of its contenders (the best so far, then those not
  yet evaluated: each may win), level by level, the likeliest path first within a level (`_wanted`).
  Those a result makes obsolete (their contender lost) are stopped. With 16 cores, 7b at 128k / 2 GiB
  then has the winning layer order's later dimensions under way before the first dimension is ranked
  (docs/benchmarks.md). The default plan is forked too, first, building its own graph (this process
  builds its copy once the first forks run), so this process stays free to give each finished
  candidate's core to the next; graphs below `FORK_FROM` tasks (`LlamaPrefill.tasks`, from one layer's
  graph) are compiled here, the default plan first, and not forked (a fork and the plan's way back
  cost more than their compile). A
  forked candidate that is the best of its rank when it finishes leaves its plan pickled in a scratch
  folder; the path's taskgraph is held here, so the schedules' candidates (forked ones too) and the plan
  chosen use it;
- the plans are compiled without the verify stage; the one chosen is verified (`verified`): in its fork
  when it was kept there as the best of its rank (beside the other forks' work), else here at the end.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from frontend.partition import split_block, split_packed
from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from passes.schedules import SCHEDULES
from runtime import sim_makespan
from turnip import forks
from turnip.bounds import makespan_bound, plan_bound
from turnip.candidates import QUERY_GROUPS, Candidate, LlamaPrefill, PlanTarget
from turnip_ir.cost import CostModel
from turnip_ir.errors import BudgetError
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.verifier import verify_memgraph

SPINE_VARIABLE = "TURNIP_SEARCH_SPINE"
"""`0` turns the spine off (`Search._wanted`; on by default). On the H100 host (ninth session, 16 processes)
7b at 32k / 1 GiB chose in 1.9-2.0 s with it and 2.7-2.8 s without (three runs each); at 128k / 2 GiB,
where the plan that wins has another block than the default's and the spine's schedule candidates take
first-wave slots from the winner's path, 8.6 s against 8.2 s (one run each)."""
FORK_FROM = 2000
"""Tasks in the default graph from which candidates are compiled in forked processes."""
PRELOAD = (__name__,)
"""What a server forking the search's children imports first (turnip/forks.py)."""
TIE = 1e-9
"""Relative slack on every deadline and bound comparison: a candidate that may tie is run to its end."""


@dataclass
class Outcome:
    """What one candidate came to: `ran` (its makespan), `bounded` (its lower bound `seconds` was above the
    deadline, not compiled), `stopped` (its sim run passed the deadline `seconds`) or `no fit`."""

    kind: str
    seconds: float | None = None
    bound: float | None = None
    error: str = ""
    kept: str | None = None
    """The pickled plan of a forked candidate that was the best of its dimension when it finished."""
    proved: bool = False
    """Its kept plan was verified where it was made (in the fork, beside the other candidates' work), so the
    choice need not verify it again once the search is over."""
    memgraph: MemGraph | None = field(default=None, repr=False)
    built: llama.LlamaGraph | None = field(default=None, repr=False)
    """The taskgraph built for it in this process (`Search` keeps the best of a dimension's)."""

    @property
    def score(self) -> float:
        return self.seconds if self.kind == "ran" else math.inf

    def text(self) -> str:
        if self.kind == "no fit":
            return "does not fit"
        prefix = {"ran": "", "bounded": "at least ", "stopped": "over "}[self.kind]
        return prefix + _seconds(self.seconds)


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value >= 0.1 else f"{value * 1e3:.3f} ms"


@dataclass
class Step:
    """One dimension ranked: the value chosen and each candidate value's outcome, in ranking order."""

    dimension: str
    chosen: object
    outcomes: dict[object, Outcome]


@dataclass
class LlamaChoice:
    """The chosen candidate, its graph and plan, and how it was chosen: `searched`, `unbound` (the default
    plan is within `BIND_MARGIN` of its bound: no search), `given` (nothing to choose) or `kept` (read
    from the choice cache)."""

    candidate: Candidate
    built: llama.LlamaGraph
    memgraph: MemGraph
    how: str
    makespan: float | None = None
    bound: float | None = None
    steps: list[Step] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Candidates by outcome kind (`Outcome.kind`), searched ones."""
    workers: int = 1
    seconds: float = 0.0
    plan_read: bool = False
    """The plan was read from the plan folder, not compiled."""


def link_floor(prefill: LlamaPrefill, candidate: Candidate, cost: CostModel) -> float:
    """A lower bound on the makespan before the graph is built: the event loop's time for the attention
    links alone (`attention_links`; 0 under a sliding window, which leaves links out)."""
    config = prefill.config
    if config.sliding_window is not None:
        return 0.0
    operand = MemNode(0, "input", "q", 0, None, None, (), shape=(1,), dtype=config.dtype)
    link = MemNode(0, "kernel", "attention", 0, None, None, (), kernel="attention", shape=(1,), dtype=config.dtype)
    return attention_links(prefill, candidate.block) * cost.host_time(link, [operand])


def attention_links(prefill: LlamaPrefill, block: int) -> int:
    """The fewest attention vertices the prefill's graph has in blocks of `block`: per layer that attends
    (all of them, but the last of a prefill without hidden states), each query block's links to the key
    blocks up to it that hold a token of its sequences: n (n + 1) / 2 for one sequence in n blocks; a block
    of whole packed sequences links to itself alone (frontend/partition.py `split_packed`)."""
    lengths = prefill.sequences or (prefill.tokens,)
    sizes = split_packed(lengths, block) if prefill.sequences is not None else split_block(prefill.tokens, block)
    ends = list(itertools.accumulate(lengths))  # where each sequence ends
    first, last, start = [], [], 0
    for size in sizes:  # the sequences each block holds a token of
        first.append(bisect.bisect_right(ends, start))
        last.append(bisect.bisect_left(ends, start + size))
        start += size
    links = sum(i - bisect.bisect_left(last, first[i]) + 1 for i in range(len(sizes)))
    layers = prefill.config.num_hidden_layers - (0 if prefill.hidden else 1)
    return layers * links


def evaluate(prefill: LlamaPrefill, target: PlanTarget, candidate: Candidate, deadline: Callable[[], float],
             remat: bool = False, cost: CostModel | None = None, built: llama.LlamaGraph | None = None) -> Outcome:
    """Build (unless `built` is given), bound, compile and simulate one candidate, stopping as soon as it
    cannot come in under `deadline()` (read as it goes: it may fall meanwhile). The plan is not verified
    here: the search verifies the one it chooses (`verified`)."""
    cost = cost or CostModel()
    floor = link_floor(prefill, candidate, cost)
    if floor > deadline() * (1 + TIE):
        return Outcome("bounded", floor, floor)
    built = built or prefill.build(candidate)
    try:
        arena = target.arena_of(built.graph)
        bound = makespan_bound(built.graph, arena, cost).seconds
        if bound > deadline() * (1 + TIE):
            return Outcome("bounded", bound, bound)
        memgraph = compile_taskgraph(built.graph, arena, candidate.schedule, remat=remat, verify=False)
    except BudgetError as err:
        return Outcome("no fit", error=str(err))
    # its copies (a plan that reloads too much is not simulated), or the graph's bound against a deadline
    # that fell during the compile
    planned = max(plan_bound(memgraph, cost).seconds, bound)
    if planned > deadline() * (1 + TIE):
        return Outcome("bounded", planned, planned)
    makespan = sim_makespan(memgraph, target.streams, cost=cost, deadline=lambda: deadline() * (1 + TIE), compiled=True)
    if makespan == math.inf:
        return Outcome("stopped", deadline(), bound)
    return Outcome("ran", makespan, bound, memgraph=memgraph, built=built)


def evaluate_kept(prefill: LlamaPrefill, target: PlanTarget, candidate: Candidate, deadlines, index: int, remat: bool,
                  scratch: Path, built: llama.LlamaGraph | None = None) -> Outcome:
    """In a forked process: `evaluate` against `deadlines[index]` (shared memory the parent lowers), the plan
    verified and pickled into `scratch` for the parent when it is the best of its dimension as it finishes
    (verified here, while the other forks run, not by the parent after the last of them)."""
    outcome = evaluate(prefill, target, candidate, lambda: deadlines[index], remat, built=built)
    if outcome.kind == "ran" and outcome.seconds <= deadlines[index] * (1 + TIE):
        verified(outcome.memgraph, (outcome.built or built or prefill.build(candidate)).graph)
        outcome.proved = True
        path = scratch / f"{time.monotonic_ns()}-{os.getpid()}.pickle"
        path.write_bytes(pickle.dumps(outcome.memgraph, protocol=pickle.HIGHEST_PROTOCOL))
        outcome.kept = str(path)
    outcome.memgraph = outcome.built = None
    return outcome


def verified(memgraph: MemGraph, graph) -> MemGraph:
    """`memgraph`, proved to be a correct plan of `graph` (the pipeline's verify stage, condition (a) too)."""
    verify_memgraph(memgraph, place_devices(graph, graph.devices))
    return memgraph


def _capacity(prefill: LlamaPrefill, dimensions: list[str]) -> int:
    """How many candidates a search can evaluate at most: every combination of the values it ranks."""
    sizes = {"layer_order": len(llama.LAYER_ORDERS), "block": len(prefill.candidates("block", prefill.start({}))),
             "query_group": len(QUERY_GROUPS), "schedule": len(SCHEDULES)}
    return math.prod(sizes[name] for name in dimensions) + 1


def _graph_of(candidate: Candidate) -> tuple:
    """What a candidate's taskgraph depends on (not the schedule)."""
    return candidate.layer_order, candidate.block, candidate.query_group


class Search:
    """One search's state: each candidate's outcome, the choices so far (`path`) and the dimension being
    ranked (`step`). A candidate's deadline is the best makespan among the candidates it is ranked with
    (`ranked_with`), kept for each in `deadlines` (shared memory once forked candidates read it) under the
    index `slot` gives it. The path's taskgraph is held (`graphs`): the schedules' candidates and the plan
    chosen use it, forked ones too."""

    def __init__(self, prefill: LlamaPrefill, target: PlanTarget, start: Candidate, dimensions: list[str], remat: bool,
                 margin: float | None, processes: str = "fork"):
        self.prefill, self.target, self.remat, self.margin, self.processes = prefill, target, remat, margin, processes
        self.path, self.dimensions, self.step = start, dimensions, 0
        self.results: dict[Candidate, Outcome] = {}
        self.cost = CostModel()
        self.pool: forks.ForkPool | None = None
        self.scratch: Path | None = None
        self.step_of: dict[Candidate, int] = {start: 0}
        self.index: dict[Candidate, int] = {}
        self.deadlines = [math.inf] * _capacity(prefill, dimensions)
        self.graphs: dict[tuple, llama.LlamaGraph] = {}
        self.spine = os.environ.get(SPINE_VARIABLE, "1") != "0"

    def run(self, workers: int | None) -> LlamaChoice:
        try:
            first = self._evaluate_start(workers)
            if self.margin is not None and first.kind == "ran" and first.seconds <= (1 + self.margin) * first.bound:
                return self._choice("unbound", [])
            steps = [self._rank(step) for step in range(len(self.dimensions))]
            return self._choice("searched", steps)
        finally:
            self._close()

    def _evaluate_start(self, workers: int | None) -> Outcome:
        """The default plan's outcome. With forks, it is forked first and the other wanted candidates
        (`_wanted`) that are not more loop-bound than it take the other cores; the others wait for a
        deadline (one of those they are ranked with has finished: they may be bounded before they are
        compiled), not for the default, whose plan may be among the slowest to simulate (7b at 32k / 1 GiB:
        the block rank waited 1 s on the H100 host for a 2048 block held back until the default had
        finished). Each finished one's core is given to the next at once. Without forks, the default is
        compiled here."""
        slots = workers or forks.default_slots()
        if slots > 1 and self.prefill.tasks(self.path) >= FORK_FROM and forks.available(self.processes):
            self.pool = forks.ForkPool(slots, self.processes, preload=PRELOAD)
            self.scratch = Path(tempfile.mkdtemp(prefix="turnip-choose-"))
            self.deadlines = self.pool.context.RawArray("d", self.deadlines)
            floor = link_floor(self.prefill, self.path, self.cost)
            early = lambda: [c for c in self._wanted()
                             if c != self.path and (link_floor(self.prefill, c, self.cost) <= floor or self._deadline(c) < math.inf)]
            # the default's process builds its own graph, and so does every other fork but the path's
            # schedules, which inherit this process's copy: they start once it is built, while the rest run
            self._fill([self.path, *early()], build=False)
            self.graphs.setdefault(_graph_of(self.path), self.prefill.build(self.path))
            self._fill(early())
            while self.path not in self.results:
                self._collect()
                self._fill(early())
            return self.results[self.path]
        built = self.graphs[_graph_of(self.path)] = self.prefill.build(self.path)
        outcome = evaluate(self.prefill, self.target, self.path, lambda: math.inf, self.remat, self.cost, built)
        self._record(self.path, outcome)
        return outcome

    def _rank(self, step: int) -> Step:
        """Rank dimension `step` around the choices so far; its fastest candidate becomes the path."""
        self.step = step
        self._refresh()
        candidates = self.prefill.candidates(self.dimensions[step], self.path)
        while any(c not in self.results for c in candidates):
            self._collect(timeout=0)  # what finished meanwhile first: it changes what is wanted
            self._fill(self._wanted())
            self._ready_path()
            self._collect()
        ranked = [c for c in candidates if self.results[c].kind == "ran"]
        if not ranked:
            raise BudgetError(next(self.results[c].error for c in candidates if self.results[c].kind == "no fit"))
        self._move(min(ranked, key=lambda c: self.results[c].score))  # the first of equals
        dimension = self.dimensions[step]
        return Step(dimension, getattr(self.path, dimension), {getattr(c, dimension): self.results[c] for c in candidates})

    def _ready_path(self) -> None:
        """While forks run and this process would only wait: once the dimensions left to rank do not change
        the taskgraph (the schedule), the path's graph is the chosen plan's, so build it here now, and take
        the path's plan back from its fork's pickle (used if the path stays the choice), rather than after
        the last fork (7b at 32k: 0.12 s and 0.1 s)."""
        if self.pool is None or any(d != "schedule" for d in self.dimensions[self.step:]):
            return
        key = _graph_of(self.path)
        if key not in self.graphs:
            self.graphs[key] = self.prefill.build(self.path)
        outcome = self.results.get(self.path)
        if outcome is not None and outcome.memgraph is None and outcome.kept is not None:
            outcome.memgraph = pickle.loads(Path(outcome.kept).read_bytes())

    def _move(self, path: Candidate) -> None:
        """Take `path` as the choices so far: only its plan and taskgraph are kept."""
        self.path = path
        for candidate, outcome in self.results.items():
            if candidate != path:
                outcome.memgraph = None
        self.graphs = {key: graph for key, graph in self.graphs.items() if key == _graph_of(path)}

    def _wanted(self) -> list[Candidate]:
        """Candidates to evaluate, most needed first: the dimension at hand's around the path; then, level by
        level, each later dimension's around each contender of the dimension before it (`_contenders`: the
        best so far first), so that the cores a dimension leaves idle go to the next dimension around every
        candidate that may still win before they go deeper, the likeliest path first within a level.
        With the spine (`SPINE_VARIABLE`, on by default), and processes enough for it, the schedules around
        each contender of the dimension at hand come right after it: ranked last, they are evaluated around
        whatever plan wins (at 7b 32k / 1 GiB the winner's, forked once it was known, were the search's
        last 1-1.5 s on the H100 host without it)."""
        wanted: dict[Candidate, None] = {}

        def add(group: list[Candidate], step: int) -> None:
            for candidate in group:
                if candidate not in self.results and candidate not in wanted:
                    wanted[candidate] = None
                    self.step_of[candidate] = step

        frontier = [self.path]
        last = len(self.dimensions) - 1
        for step in range(self.step, len(self.dimensions)):
            contenders: dict[Candidate, None] = {}
            for around in frontier:
                group = self.prefill.candidates(self.dimensions[step], around)
                add(group, step)
                contenders.update(dict.fromkeys(self._contenders(group, around)))
            frontier = list(contenders)
            if self.spine and self.pool is not None and step == self.step < last and self.dimensions[last] == "schedule":
                spine = [c for around in frontier for c in self.prefill.candidates("schedule", around)]
                if len(wanted) + len(spine) <= self.pool.slots:
                    add(spine, last)
        return list(wanted)

    def _contenders(self, group: list[Candidate], around: Candidate) -> list[Candidate]:
        """Those of a ranking group that may still be its best: the best so far (the first of equals), then
        those not evaluated yet, `around` itself first (the path's own value is the likeliest)."""
        ran = [c for c in group if c in self.results and self.results[c].kind == "ran"]
        best = [min(ran, key=lambda c: self.results[c].score)] if ran else []
        pending = sorted((c for c in group if c not in self.results), key=lambda c: c != around)
        return best + pending

    def _ranked_with(self, candidate: Candidate) -> list[Candidate]:
        """The candidates `candidate` is ranked with: its dimension's, around what it assumes of the others."""
        return self.prefill.candidates(self.dimensions[self.step_of[candidate]], candidate)

    def _deadline(self, candidate: Candidate) -> float:
        return min((self.results[c].score for c in self._ranked_with(candidate) if c in self.results), default=math.inf)

    def _slot(self, candidate: Candidate) -> int:
        """The index of `candidate`'s deadline in `deadlines`, set now."""
        index = self.index.setdefault(candidate, len(self.index))
        self.deadlines[index] = self._deadline(candidate)
        return index

    def _fill(self, wanted: list[Candidate], build: bool = True) -> None:
        """Start candidates of `wanted` while there are free processes (here: evaluate the next one);
        `build=False` leaves out those that would wait for this process to build the path's graph."""
        for candidate in wanted:
            if self.pool is not None and self.pool.free <= 0:
                return
            if self.pool is not None and candidate in self.pool.children:
                continue
            if not build and self._builds_here(candidate):
                continue
            index = self._slot(candidate)
            floor = link_floor(self.prefill, candidate, self.cost)
            if floor > self.deadlines[index] * (1 + TIE):
                self._record(candidate, Outcome("bounded", floor, floor))
                continue
            built = self._graph(candidate)
            if self.pool is None:
                self._record(candidate, evaluate(self.prefill, self.target, candidate, lambda: self.deadlines[index],
                                                 self.remat, self.cost, built))
                return
            inherited = built if self.processes == "fork" else None  # a forked child shares it; a server's would unpickle it
            self.pool.start(candidate, partial(evaluate_kept, self.prefill, self.target, candidate, self.deadlines, index,
                                               self.remat, self.scratch, inherited))

    def _graph(self, candidate: Candidate) -> llama.LlamaGraph | None:
        """The taskgraph held for `candidate`: the path's is built here for a forked schedule candidate (it
        inherits it, and the plan chosen needs it), while other forks run; others, the default plan's at the
        start included, are built where evaluated."""
        key = _graph_of(candidate)
        if self._builds_here(candidate):
            self.graphs[key] = self.prefill.build(self.path)
        return self.graphs.get(key)

    def _builds_here(self, candidate: Candidate) -> bool:
        """Whether forking `candidate` makes this process build the path's graph first (`_graph`)."""
        key = _graph_of(candidate)
        return (key not in self.graphs and self.pool is not None and self.processes == "fork" and key == _graph_of(self.path)
                and candidate != self.path)

    def _collect(self, timeout: float | None = None) -> None:
        """Record the forked candidates that finish within `timeout` seconds (None: at least one)."""
        if self.pool is None or not self.pool.children:
            return
        for candidate, outcome in self.pool.wait(timeout):
            self._record(candidate, outcome)

    def _record(self, candidate: Candidate, outcome: Outcome) -> None:
        """Keep `outcome`; its plan, and its taskgraph where built here, only while it is the best of those
        it is ranked with (memory)."""
        self.results[candidate] = outcome
        self._refresh()
        if outcome.score > self._deadline(candidate) * (1 + TIE):
            outcome.memgraph = None
        elif outcome.built is not None:
            self.graphs[_graph_of(candidate)] = outcome.built
        outcome.built = None

    def _refresh(self) -> None:
        """Every running candidate's deadline; forked candidates no longer wanted are stopped."""
        if self.pool is None:
            return
        wanted = set(self._wanted())
        for candidate in list(self.pool.children):
            if candidate in wanted:
                self.deadlines[self.index[candidate]] = self._deadline(candidate)
            else:
                self.pool.stop(candidate)

    def _choice(self, how: str, steps: list[Step]) -> LlamaChoice:
        outcome = self.results[self.path]
        built = self.graphs.get(_graph_of(self.path)) or self.prefill.build(self.path)
        if outcome.memgraph is not None:
            memgraph = outcome.memgraph
        elif outcome.kept is not None:
            memgraph = pickle.loads(Path(outcome.kept).read_bytes())
        else:  # the default taken unbound after a faster candidate had finished: its fork kept no plan
            memgraph = compile_taskgraph(built.graph, self.target.arena_of(built.graph), self.path.schedule, remat=self.remat,
                                         verify=False)
        memgraph = memgraph if outcome.proved else verified(memgraph, built.graph)
        counts: dict[str, int] = {}
        for result in self.results.values():
            counts[result.kind] = counts.get(result.kind, 0) + 1
        slots = self.pool.slots if self.pool is not None else 1
        return LlamaChoice(self.path, built, memgraph, how, outcome.seconds, outcome.bound, steps, counts, slots)

    def _close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

"""How the commands get their plan: a memgraph file as it is, or a taskgraph compiled at `--memory` (sizes
such as 4GiB) under one schedule, or `auto` (each schedule, the sim's fastest).

`--schedule auto` compiles once per schedule (passes/schedules.py), predicts each plan's run with the
sim backend's H200 cost model and keeps the fastest; it prints one line with the choice and every
prediction. It costs a compile and a sim run per schedule, and pays off where memory is tight (figures in
docs/passes.md, on what the choice buys).

`turnip llama` (and `turnip build llama` with `--memory`) plan the prefill through `choose_llama`: the
layer order, token block, query group and schedule, each given a value or chosen by the sim
(turnip/choose.py: left out on the sim and cuda backends, or `auto` on any), each dimension ranked
printed on one line as `auto`'s always were, then one line on how the plan was chosen (searched, the
budget does not bind, or chosen before and kept in the cache or the plan folder).

`--remat` (turnip run, llama, explain, and build with `--block auto`) passes `remat=True` to every compile
here, so the schedules and blocks are ranked by plans that may recompute.

The commands' shared option readers live here too: `parse_size` for `--memory`, `block_argument`,
`check_positive_options` (a count of 0 or less is refused, never read as the default; `--gpus` at most
`MAX_GPUS`) and `check_seed`.
"""

from __future__ import annotations

import sys

import argparse
from pathlib import Path

from passes.pipeline import compile_best, compile_taskgraph
from passes.schedules import SCHEDULES
from runtime import arena_budget, sim_makespan
from runtime.api import AttentionChoice, plan_choosing_attention
from turnip.choice_cache import ChoiceCache, default_cache_dir
from turnip.choose import BIND_MARGIN, QUERY_GROUPS, LlamaChoice, LlamaPrefill, PlanTarget, choose_llama_plan
from turnip_ir.errors import InputError
from turnip_ir.io import load_graph
from turnip_ir.limits import INT_LIMIT, shorten
from turnip_ir.units import parse_size  # noqa: F401  (the commands read --memory through here)
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

SCHEDULE_CHOICES = (*SCHEDULES, "auto")

MAX_GPUS = 1024
"""`--gpus` at most: far more than one host holds (a plan's GPUs are one host's); 100000 simulated GPUs
took minutes and printed a line of 100000 figures."""

MAX_TOKENS = 1 << 24
"""A prompt's tokens at most (`--tokens`, `--prompt-tokens`): 16M, beyond every model's context (10M)."""

MAX_NEW_TOKENS = 1 << 20
"""`turnip generate --max-new-tokens` at most: a step per token, and 10^8 sim steps ran for ever."""

OPTION_MAXIMA = {"gpus": MAX_GPUS, "tokens": MAX_TOKENS, "prompt_tokens": MAX_TOKENS, "max_new_tokens": MAX_NEW_TOKENS,
                 "batch": 1 << 16}
"""Counts with a bound of their own; every other count stays below `INT_LIMIT`, as sizes in a plan do."""


def check_positive_options(args: argparse.Namespace, *names: str) -> None:
    """One line for a count given as 0 or less, which would otherwise read as "the default", or past its
    bound (`OPTION_MAXIMA`, else `INT_LIMIT`)."""
    for name in names:
        value = getattr(args, name)
        if not isinstance(value, int):  # `--block auto` is checked where it is read
            continue
        if value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        most = OPTION_MAXIMA.get(name, INT_LIMIT - 1)
        if value > most:
            raise InputError(f"--{name.replace('_', '-')} must be at most {most}, got {shorten(str(value))}")


def check_seed(seed: int) -> None:
    """`--seed` as numpy's generators take it: an integer from 0, below 2**62 (the bound of every integer here)."""
    if not 0 <= seed < INT_LIMIT:
        raise InputError(f"--seed must be an integer from 0 to 2**62 - 1, got {shorten(str(seed))}")


def add_schedule_argument(parser: argparse.ArgumentParser, chosen: bool = False) -> None:
    """`--schedule`; `chosen`: left out, it is chosen with the plan (`turnip llama`), else `given`."""
    default = "chosen with the plan where the backend is the sim's or cuda's, else given" if chosen else "given"
    parser.add_argument("--schedule", default=None if chosen else "given", choices=SCHEDULE_CHOICES,
                        help=f"the compiler's simulated schedule; auto: each one, keeping the plan the sim predicts fastest (default: {default})")


def add_remat_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remat", action="store_true",
                        help="let the planner recompute an evicted tensor at its next use instead of offloading and "
                        "reloading it, where the cost model says that is cheaper (docs/passes.md, Rematerialization)")


def add_layer_order_arguments(parser: argparse.ArgumentParser, orders: tuple[str, ...], chosen: bool = False) -> None:
    """`--layer-order` and `--query-group`; `chosen`: left out, each is chosen with the plan (`turnip llama`),
    else they default to the first order and 1."""
    default = "chosen with the plan where the backend is the sim's or cuda's, else blocks" if chosen else orders[0]
    parser.add_argument("--layer-order", default=None if chosen else orders[0], choices=(*orders, "auto"),
                        help="the order of tasks inside a layer: blocks (each token block through the whole layer) or "
                        "halves (every block through attention, then every block through the MLP: each weight crosses "
                        f"once a layer under a tight budget); auto: each, keeping the plan the sim predicts fastest (default: {default})")
    parser.add_argument("--query-group", type=block_argument, default=None if chosen else 1, metavar="N|auto",
                        help="run N token blocks together, their attention chains interleaved key block by key block, so "
                        "a k/v block reloaded under a tight budget serves N queries; auto: each of "
                        f"{', '.join(map(str, QUERY_GROUPS))} up to the number of blocks, keeping the sim's fastest (default: "
                        f"{'chosen with the plan, else 1' if chosen else 1})")


def block_argument(text: str) -> int | str:
    """`--block`'s (and `--query-group`'s) value: `auto` or an integer (checked positive by
    `check_positive_options`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or auto, got '{shorten(text)}'") from None


def choose_llama(prefill: LlamaPrefill, target: PlanTarget, given: dict, remat: bool = False,
                 plan_dir: Path | None = None) -> LlamaChoice:
    """`turnip.choose.choose_llama_plan` with the commands' report: each dimension it ranked on one line
    (`print_auto_choice`), then one line on how the plan was chosen. Choices are kept in the plan folder,
    or else in the user's cache (`default_cache_dir`)."""
    cache = ChoiceCache(plan_dir if plan_dir is not None else default_cache_dir() / "choices")
    choice = choose_llama_plan(prefill, target, given, remat=remat, cache=cache, plan_dir=plan_dir)
    for step in choice.steps:
        print_auto_choice(DIMENSION_LABELS[step.dimension], step.chosen,
                          {value: outcome.text() for value, outcome in step.outcomes.items()})
    line = _choice_line(choice, cache)
    if line:
        print(line)
    return choice


DIMENSION_LABELS = {"layer_order": "layer order", "block": "block", "query_group": "query group", "schedule": "schedule"}


def _choice_line(choice: LlamaChoice, cache: ChoiceCache) -> str:
    """How the plan was chosen, in one line ("" when nothing was chosen and no plan was read)."""
    read = "; its plan read from --plan-dir" if choice.plan_read else ""
    if choice.how == "searched":
        counts = choice.counts
        parts = [f"{counts.get('ran', 0)} run", f"{counts.get('stopped', 0)} stopped early",
                 f"{counts.get('bounded', 0)} left out by the bound"]
        parts += [f"{counts['no fit']} did not fit"] if counts.get("no fit") else []
        return (f"plan chosen in {choice.seconds:.1f} s: {choice.candidate.describe()} (sim {_seconds(choice.makespan)}; "
                f"{sum(counts.values())} candidates: {', '.join(parts)}; {choice.workers} process(es))")
    if choice.how == "unbound":
        return (f"plan: {choice.candidate.describe()} (the budget does not bind: sim {_seconds(choice.makespan)}, within "
                f"{BIND_MARGIN:.0%} of its bound {_seconds(choice.bound)}; nothing else ranked)")
    if choice.how == "kept":
        return f"plan: {choice.candidate.describe()} (chosen before, kept in {cache.folder}{read})"
    return "plan read from --plan-dir" if choice.plan_read else ""


def compile_choosing_schedule(graph: TaskGraph, budget: int, schedule: str, streams: int = 2, **options) -> tuple[MemGraph, str, dict[str, float]]:
    """`compile_taskgraph` under `schedule`, or for `auto` the sim-fastest of every schedule; returns the
    choice to the caller: the plan, the schedule it was compiled under and the sim's predictions (empty
    unless `auto`). For callers that report the choice themselves (bench/run.py)."""
    if schedule != "auto":
        return compile_taskgraph(graph, budget, schedule, **options), schedule, {}
    return compile_best(graph, budget, lambda m: sim_makespan(m, streams), **options)


def compile_printing_choice(graph: TaskGraph, budget: int, schedule: str, streams: int = 2, **options) -> MemGraph:
    """`compile_choosing_schedule`'s plan alone; for `auto` it prints the choice and every prediction on
    one line, as the commands report it."""
    memgraph, chosen, scores = compile_choosing_schedule(graph, budget, schedule, streams, **options)
    if schedule == "auto":
        print_auto_choice("schedule", chosen, scores)
    return memgraph


def print_auto_choice(what: str, chosen, scores: dict) -> None:
    """The one line every `auto` choice prints: `what auto: chosen (sim predictions: ...)`, each candidate
    with its predicted makespan (None: it did not fit; a string: as it is, `Outcome.text`)."""
    predicted = ", ".join(f"{value} {_prediction(s)}" for value, s in scores.items())
    print(f"{what} auto: {chosen} (sim predictions: {predicted})")


def _prediction(score: float | str | None) -> str:
    if isinstance(score, str):
        return score
    return "does not fit" if score is None else _seconds(score)


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value >= 0.1 else f"{value * 1e3:.3f} ms"


ATTENTION_HELP = ("the cuda backend's attention provider; auto: torch-cudnn, or triton where both can run and the sim "
                  "predicts its plan 1%% faster (its workspace is smaller)")
"""`--attention`'s help in the commands that plan for the cuda backend (`runtime.api.PROVIDER_MARGIN`)."""


def load_plan(path: str, memory: str | None, backend: str, streams: int, attention: str = "auto", schedule: str = "given",
              remat: bool = False) -> tuple[MemGraph, bool, str]:
    """The memgraph to run, whether it was compiled here (and so verified) from a taskgraph, and the
    attention provider it was planned for ("" where the plan came as a file or the backend has none).

    The budget is everything a run may take per GPU: the cuda backend's workspace comes out of it first,
    and for `auto` the provider is chosen with the plan (`print_attention_choice`). `remat` applies to a
    taskgraph compiled here; a memgraph file is run as it was planned."""
    graph = load_graph(path)
    budget = parse_size(memory) if memory is not None else None
    if isinstance(graph, MemGraph):
        if budget is not None and graph.budget > arena_budget(graph, budget, backend, streams, attention):
            raise InputError(f"{path}: the memgraph was planned for {graph.budget} bytes per GPU, more than --memory {budget} allows the {backend} backend's arena")
        return graph, False, ""
    if budget is None:
        raise InputError(f"{path}: a taskgraph needs --memory to be compiled")
    choice = plan_choosing_attention(graph, budget, lambda arena: compile_printing_choice(graph, arena, schedule, streams, remat=remat),
                                     backend, streams, attention)
    print_attention_choice(choice)
    return choice.memgraph, True, choice.provider


def warn_ignored_attention(attention: str, backend: str) -> None:
    """One warning line on stderr when `--attention` names a provider for a backend without providers."""
    if attention != "auto" and backend != "cuda":
        print(f"warning: --attention {attention} is ignored: it picks the cuda backend's attention provider, "
              f"and the {backend} backend has one", file=sys.stderr)


def print_attention_choice(choice: AttentionChoice) -> None:
    """The line the commands print when `auto` ranked attention providers by the sim (nothing otherwise)."""
    if choice.scores:
        print_auto_choice("attention", choice.provider, choice.scores)

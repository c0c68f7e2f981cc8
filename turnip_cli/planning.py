"""How the commands get their plan: a memgraph file as it is, or a taskgraph compiled at `--memory` (sizes
such as 4GiB) under one schedule, or `auto` (each schedule, the sim's fastest).

`--schedule auto` compiles once per schedule (passes/schedules.py), predicts each plan's run with the
sim backend's H200 cost model and keeps the fastest; it prints one line with the choice and every
prediction. It costs a compile and a sim run per schedule, and pays off where memory is tight (figures in
docs/passes.md, on what the choice buys).

`--block auto` (turnip llama, turnip build llama) does the same for the token block size: it builds the
graph at each of `block_candidates`, compiles each under one schedule (the named one, or `given` when
`--schedule auto`), leaves out those that do not fit and keeps the sim's fastest. With `--schedule auto`
too, the schedules are ranked for the chosen block only: blocks + schedules compiles, not their product.

`--layer-order auto` and `--query-group auto` (the same two commands) rank the llama frontend's task
orders inside a layer and its query groups the same way: the layer order first, then the block, then the
query group, then the schedule, each for the choices made before it (`choose_llama_build`): a few
compiles, not their product.

`--remat` (turnip run, llama, explain, and build with `--block auto`) passes `remat=True` to every compile
here, so the schedules and blocks are ranked by plans that may recompute.

The commands' shared option readers live here too: `parse_size` for `--memory`, `block_argument`,
`check_positive_options` (a count of 0 or less is refused, never read as the default; `--gpus` at most
`MAX_GPUS`) and `check_seed`.
"""

from __future__ import annotations

import sys

import argparse
from collections.abc import Callable
from typing import Any

from passes.pipeline import compile_best, compile_taskgraph
from passes.schedules import SCHEDULES
from runtime import arena_budget, sim_makespan
from runtime.api import AttentionChoice, plan_choosing_attention
from turnip_ir.errors import BudgetError, InputError
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


def add_schedule_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedule", default="given", choices=SCHEDULE_CHOICES,
                        help="the compiler's simulated schedule; auto: each one, keeping the plan the sim predicts fastest")


def add_remat_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remat", action="store_true",
                        help="let the planner recompute an evicted tensor at its next use instead of offloading and "
                        "reloading it, where the cost model says that is cheaper (docs/passes.md, Rematerialization)")


BLOCKS = (1024, 2048, 4096, 8192)
"""The token blocks `--block auto` tries, each clamped to the token count."""


QUERY_GROUPS = (1, 2, 4, 8)
"""The query groups `--query-group auto` tries, those up to the number of token blocks."""


def add_layer_order_arguments(parser: argparse.ArgumentParser, orders: tuple[str, ...]) -> None:
    parser.add_argument("--layer-order", default=orders[0], choices=(*orders, "auto"),
                        help="the order of tasks inside a layer: blocks (each token block through the whole layer) or "
                        "halves (every block through attention, then every block through the MLP: each weight crosses "
                        "once a layer under a tight budget); auto: each, keeping the plan the sim predicts fastest")
    parser.add_argument("--query-group", type=block_argument, default=1, metavar="N|auto",
                        help="run N token blocks together, their attention chains interleaved key block by key block, so "
                        "a k/v block reloaded under a tight budget serves N queries (default 1); auto: each of "
                        f"{', '.join(map(str, QUERY_GROUPS))} up to the number of blocks, keeping the sim's fastest")


def block_argument(text: str) -> int | str:
    """`--block`'s (and `--query-group`'s) value: `auto` or an integer (checked positive by
    `check_positive_options`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or auto, got '{shorten(text)}'") from None


def block_candidates(tokens: int) -> list[int]:
    """`BLOCKS` clamped to `tokens`; below 4096 tokens also T/4 and T/2 (small models' blocks)."""
    small = {max(1, tokens // 4), max(1, tokens // 2)} if tokens < 4096 else set()
    return sorted({min(block, tokens) for block in BLOCKS} | small)


def choose_build(build: Callable[[Any], Any], candidates: list, budget_of: Callable[[TaskGraph], int],
                 schedule: str = "given", streams: int = 2, **options) -> tuple[Any, MemGraph, dict[Any, float | None]]:
    """Build (`build(candidate)`, an object with a `.graph`) and compile at each candidate (a block, a
    layer order, a query group) and keep the sim-fastest: returns that build, its plan and each
    candidate's prediction (None: it did not fit). Ties go to the earlier candidate; when none fits, the
    first one's `BudgetError` is raised. `options` are `compile_taskgraph`'s (`remat`)."""
    best, scores, first_error = None, {}, None
    for candidate in candidates:
        built = build(candidate)
        try:
            memgraph = compile_taskgraph(built.graph, budget_of(built.graph), schedule, **options)
        except BudgetError as err:
            scores[candidate], first_error = None, first_error or err
            continue
        scores[candidate] = sim_makespan(memgraph, streams)
        if best is None or scores[candidate] < best[0]:
            best = (scores[candidate], built, memgraph)
    if best is None:
        raise first_error
    return best[1], best[2], scores


def choose_llama_build(build: Callable[..., Any], tokens: int, budget_of: Callable[[TaskGraph], int], block: int | str | None,
                       layer_order: str, query_group: int | str, orders: tuple[str, ...], schedule: str = "given",
                       streams: int = 2, **options) -> tuple[Any, MemGraph]:
    """The llama build (`build(block, layer_order, query_group)`, an object with `.graph`, `.block` and
    `.tokens`) and its plan, each `auto` among layer order (one of `orders`), block and query group chosen
    in that order by the sim for the choices before it, each printed on one line; then the schedule
    (`compile_printing_choice`). A choice not `auto` stays as given (block None: the frontend's default,
    which an `auto` block is ranked from; `auto` layer order starts from `orders[0]`, query group from 1).
    The layer order goes first: it changes what a budget holds most, and the best block differs with it
    (7b at 32k and 1 GiB: 8192 tokens in `blocks`, 4096 in `halves`)."""
    choice = {"block": None if block == "auto" else block, "layer_order": orders[0] if layer_order == "auto" else layer_order,
              "query_group": 1 if query_group == "auto" else query_group}
    steps = [("layer_order", list(orders))] if layer_order == "auto" else []
    steps += [("block", block_candidates(tokens))] if block == "auto" else []
    steps += [("query_group", None)] if query_group == "auto" else []
    fixed = "given" if schedule == "auto" else schedule
    built, memgraph = None, None
    for name, candidates in steps:
        if candidates is None:  # query groups: up to the chosen block's count of token blocks
            blocks = -(-tokens // (built or build(**choice)).block)
            candidates = [group for group in QUERY_GROUPS if group <= blocks]
        built, memgraph, scores = choose_build(lambda value: build(**(choice | {name: value})), candidates, budget_of,
                                               fixed, streams, **options)
        choice[name] = built.block if name == "block" else getattr(built, name)
        print_auto_choice(name.replace("_", " "), choice[name], scores)
    if built is None:
        built = build(**choice)
    if memgraph is None or schedule == "auto":
        memgraph = compile_printing_choice(built.graph, budget_of(built.graph), schedule, streams, **options)
    return built, memgraph


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
    with its predicted makespan (None: it did not fit)."""
    predicted = ", ".join(f"{value} {'does not fit' if s is None else _seconds(s)}" for value, s in scores.items())
    print(f"{what} auto: {chosen} (sim predictions: {predicted})")


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

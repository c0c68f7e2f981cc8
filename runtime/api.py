"""`execute`: run a memgraph on a backend under a policy, and return its outputs and summary.

This is the runtime's public entry point; the CLI and the tests call it. It builds the ExecGraph,
prepares the backend (the run's only allocation), runs the Executor, reads the outputs, and closes the
backend, so worker threads are joined after a failure or Ctrl-C too.

Prepare once, run many: with `close=False` and a Backend instance, a successful run leaves the backend
prepared, and the next `execute` on it loads another memgraph onto the same arenas, streams and workers
(the cuda backend's phases, docs/runtime.md); the caller closes it. A run that fails closes the backend
all the same (what is still queued on it is unknown): the caller makes a new one.
"""

from __future__ import annotations

import math
import time
from weakref import WeakKeyDictionary
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime.backends import Backend, make_backend, resolve_backend
from runtime.backends.base import OutputTarget, rows_contiguous
from runtime.backends.sim import DeadlinePassed, SimBackend
from runtime.callbacks import Callback, Recorder
from turnip_ir.cost import CostModel
from runtime.executor import Executor
from runtime.graph import build_exec_graph
from runtime.inputs import input_specs, make_inputs
from runtime.policies import make_policy
from runtime.residency import copy_limits, input_bytes, input_rows, partial_placements, placed_bytes
from runtime.summary import RunSummary, summarize
from turnip_ir.errors import BudgetError, InputError
from turnip_ir.memgraph import MemGraph
from turnip_ir.kernels import numpy_dtype
from turnip_ir.memgraph_types import check_types, infer_types
from turnip_ir.verifier import verify_memgraph


def arena_budget(graph, budget: int, backend: str = "cpu", streams: int = 2, attention: str = "auto",
                 pinned: int | None = None, remat: bool = False) -> int:
    """The bytes per GPU the planner may give tensors when a run may take `budget` bytes per GPU in all.

    The cuda backend holds back a workspace (per-lane scratch and library memory, which depend on the
    `attention` provider it will use) inside the budget, and the GPU page tables that map its pinned host
    memory: `pinned` bytes, by default a memgraph's storage or, before planning, a taskgraph's inputs and an
    eighth more (what a plan pins beyond that is `refit_arena`'s to find); a taskgraph planned with `remat`
    (a training step) at least `_remat_pinned_estimate`'s. Other backends take nothing beside their arena.
    `graph` is the taskgraph (or memgraph) to run."""
    if resolve_backend(backend) != "cuda":
        return budget
    reserve = _cuda_reserve(graph, streams, attention)
    if isinstance(graph, MemGraph) and pinned is None:
        return _cuda_arena(budget, reserve, graph.storage_bytes)
    return _cuda_arena(budget, reserve, _pinned_before_planning(graph, budget, reserve, pinned, remat))


def refit_arena(memgraph: MemGraph, graph, budget: int, backend: str = "cpu", streams: int = 2, attention: str = "auto") -> int | None:
    """The smaller arena to plan `graph` again with when `memgraph` (planned from `arena_budget`'s estimate)
    pins more host memory than the estimate and the GPU page tables for it leave its arena over `budget`;
    None when it fits. The new arena leaves room for an eighth more pinned bytes: a smaller arena offloads
    a little more."""
    if resolve_backend(backend) != "cuda":
        return None
    return _cuda_refit(memgraph, budget, _cuda_reserve(graph, streams, attention))


def plan_within(graph, budget: int, compile, backend: str = "cpu", streams: int = 2, attention: str = "auto",
                remat: bool = False):
    """`compile(arena)`'s memgraph of `graph` for a run that may take `budget` bytes per GPU in all: at
    `arena_budget`'s arena (`remat`: `compile` recomputes, as a training step's plan does), and once more
    at `refit_arena`'s when the first plan pins more host memory than the estimate left page tables for.
    Returns (memgraph, whether it was planned again)."""
    if resolve_backend(backend) != "cuda":
        return compile(budget), False
    reserve = _cuda_reserve(graph, streams, attention)  # one pass over the nodes (about 1.5 s at 7b's 128k graph)
    memgraph = compile(_cuda_arena(budget, reserve, _pinned_before_planning(graph, budget, reserve, None, remat)))
    smaller = _cuda_refit(memgraph, budget, reserve)
    return (memgraph, False) if smaller is None else (compile(smaller), True)


PROVIDER_MARGIN = 0.01
"""How much faster (relative) the sim must predict a later attention candidate than the first for `auto` to
take it: where the budget does not bind, the plans are alike and the sim's difference is noise (7b at 8k /
4 GiB: 1e-15 s). In six pairs measured in one call each (docs/runtime.md, "Choosing the provider"), the
measured difference between the providers was within 1.2% of the sim's where the sim put them within
10% of each other, or larger in triton's favour; 2% (2026-12-03g) kept torch-cudnn at 8k / 1 GiB, where
the sim said triton 1.8% faster and it measured 2.6% faster."""


@dataclass
class AttentionChoice:
    """`plan_choosing_attention`'s answer: the plan, the provider it was planned for, whether it was planned
    again (`plan_within`), and each candidate's sim makespan (empty when there was one candidate)."""

    memgraph: MemGraph
    provider: str
    replanned: bool
    scores: dict[str, float] = field(default_factory=dict)


def plan_choosing_attention(graph, budget: int, compile, backend: str = "cpu", streams: int = 2, attention: str = "auto",
                            planned: tuple[MemGraph, bool] | None = None, order: str = "nondet",
                            candidates: Sequence[str] | None = None, remat: bool = False) -> AttentionChoice:
    """`plan_within`'s plan of `graph`, and for the cuda backend's `auto` the attention provider to run it
    with: each of `CudaBackend.attention_candidates` (torch-cudnn and triton where both can run) planned at
    its own arena and ranked by the sim at its own attention rate (`CostModel.for_attention`); another
    candidate replaces the first only when the sim predicts it `PROVIDER_MARGIN` faster. `planned` is the
    first candidate's plan where the caller has it already (`turnip llama`'s choosers compile with
    `auto`'s reserve, which is the first candidate's). `provider` is `attention` as
    given for a provider named outright, and "" for backends without providers. `candidates` replaces
    `auto`'s (tests rank torch-cudnn against triton where neither can run); `remat` is `plan_within`'s."""
    if resolve_backend(backend) != "cuda":
        memgraph, replanned = planned or plan_within(graph, budget, compile, backend, streams, attention, remat)
        return AttentionChoice(memgraph, "", replanned)
    if candidates is None:
        from runtime.backends.cuda import CudaBackend

        candidates = CudaBackend.attention_candidates(attention)
    plans, first_error = {}, None
    for k, provider in enumerate(candidates):
        try:  # a workspace larger than the budget leaves the other candidates
            plans[provider] = planned if k == 0 and planned is not None else plan_within(graph, budget, compile, backend, streams, provider, remat)
        except BudgetError as err:
            first_error = first_error or err
    if not plans:
        raise first_error
    if len(plans) == 1:
        (provider, (memgraph, replanned)), = plans.items()
        return AttentionChoice(memgraph, provider, replanned)
    scores = {provider: sim_makespan(plan[0], streams, order, CostModel().for_attention(provider), compiled=True) for provider, plan in plans.items()}
    first = next(iter(plans))
    best = min(plans, key=lambda provider: scores[provider] * (1.0 if provider == first else 1.0 + PROVIDER_MARGIN))
    memgraph, replanned = plans[best]
    return AttentionChoice(memgraph, best, replanned, scores)


def _pinned_estimate(graph) -> int:
    """A taskgraph's pinned host bytes before planning: its inputs, and an eighth more for offloads (most
    plans then need no second planning)."""
    return _with_offload_margin(sum(node.nbytes for node in graph.nodes.values() if node.op == "input"))


def _pinned_before_planning(graph, budget: int, reserve: int, pinned: int | None, remat: bool) -> int:
    """The pinned host bytes a taskgraph's arena is sized for: `pinned` where known, else its inputs' estimate;
    with `remat`, at least `_remat_pinned_estimate` at the arena those leave."""
    pinned = _pinned_estimate(graph) if pinned is None else pinned
    if remat:
        pinned = max(pinned, _remat_pinned_estimate(graph, _cuda_arena(budget, reserve, pinned)))
    return pinned


def _remat_pinned_estimate(graph, arena: int) -> int:
    """A plan with recompute's pinned host bytes, before planning: the inputs and an eighth more, and half
    of what a run in the graph's own order keeps live beyond `arena` (the planner offloads about half of
    that excess and recomputes the rest). `arena`: the bytes the plan will give tensors, `_cuda_arena`'s
    for the inputs' estimate (a little more than the final arena). 7b's LoRA step at 4k and 16k tokens
    under 4 and 8 GiB stores 0.91-0.97x this estimate; the inputs' estimate was 0.36-0.84x what they store,
    and every such plan was compiled twice (`refit_arena`: 1.2-9.4 s on the development VM)."""
    last: dict[str, int] = {}
    nodes = list(graph.nodes.values())
    for i, node in enumerate(nodes):
        for source in node.inputs:
            last[source] = i
    live = peak = 0
    ending: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node.op != "input":
            live += node.nbytes
            peak = max(peak, live)
            end = last.get(node.id, i)
            ending[end] = ending.get(end, 0) + node.nbytes
        live -= ending.pop(i, 0)
    return _pinned_estimate(graph) + max(0, peak - arena) // 2


def _with_offload_margin(pinned: int) -> int:
    """`pinned` bytes and an eighth more: room for the page tables of what a plan (or a smaller arena's
    plan) offloads beyond them."""
    return pinned + pinned // 8


def _cuda_reserve(graph, streams: int, attention: str) -> int:
    """The cuda backend's reserve for `graph` beside the page tables (`devices.reserve_bytes` with nothing
    pinned: the tables add to it, `_cuda_arena`); one pass over the nodes, made once per graph, streams and
    provider (`_RESERVES`: a session sizes its arena, compiles and refits with the same graph)."""
    reserves = _RESERVES.setdefault(graph, {})
    key = (streams, attention)
    if key not in reserves:
        from runtime.backends.cuda import CudaBackend

        nodes = graph.nodes.values() if isinstance(graph.nodes, dict) else graph.nodes
        reserves[key] = CudaBackend.reserve_bytes(list(nodes), streams, attention)
    return reserves[key]


_RESERVES: WeakKeyDictionary = WeakKeyDictionary()
"""Graph -> {(streams, provider): `_cuda_reserve`} (graphs are not edited once planned)."""


def _cuda_arena(budget: int, reserve: int, pinned: int) -> int:
    """`budget` less `reserve` and the page tables of `pinned` host bytes; a BudgetError when nothing is left."""
    from runtime.backends.cuda.devices import page_table_bytes

    workspace = reserve + page_table_bytes(pinned)
    if workspace >= budget:
        raise BudgetError(f"a budget of {budget} bytes per GPU leaves nothing for tensors after the cuda workspace of {workspace} bytes")
    return budget - workspace


def _cuda_refit(memgraph: MemGraph, budget: int, reserve: int) -> int | None:
    storage = memgraph.storage_bytes
    if memgraph.budget <= _cuda_arena(budget, reserve, storage):
        return None
    return _cuda_arena(budget, reserve, _with_offload_margin(storage))


@dataclass
class RunResult:
    """Outputs by taskgraph id (empty for sim), the summary, and the recorder holding the trace. An output
    that `execute(outputs_into=)` wrote in pieces is not among the outputs: its values are in the views."""

    outputs: dict[str, np.ndarray]
    summary: RunSummary
    recorder: Recorder


def execute(
    memgraph: MemGraph,
    backend: str | Backend = "cpu",
    order: str = "nondet",
    seed: int = 0,
    inputs: dict[str, np.ndarray] | None = None,
    jitter: float = 0.0,
    streams: int = 2,
    callbacks: Sequence[Callback] = (),
    cost: CostModel | None = None,
    verify: bool = True,
    close: bool = True,
    unchanged: Collection[str] = (),
    refresh: Mapping[str, list[tuple[int, int]]] | None = None,
    partial: Mapping[str, int] | None = None,
    copy_outputs: bool = True,
    outputs_into: Mapping[str, OutputTarget] | None = None,
    check_shapes: bool = True,
) -> RunResult:
    """Run `memgraph` once. `seed` seeds the random policy, missing inputs and jitter.

    `backend` is a name ("cpu", "sim") built with `jitter` and `seed`, or a Backend instance used as is.
    `cost` (a CostModel; None: the H200 defaults) ranks vertices for the `nondet` policy and, with
    backend="sim", is the sim's clock. Declared shapes are always checked against the kernels; `verify` (on by default) also proves the
    plan race-free first (`VerifyError` otherwise); pass False to skip that for a plan verified already.
    `check_shapes=False` skips the shape check too, for a plan the compiler has just made from a taskgraph
    (whose shapes were inferred as it was built): the plan search's simulations.
    `close=False` keeps a Backend instance prepared after a successful run (module docstring).
    `unchanged`: inputs (by taskgraph id) whose values are those the Backend instance had in its last
    run; one still in place is not copied again (runtime/residency.py; `summary.bytes_placed` counts
    what was). `refresh`: inputs unchanged but for some rows, (start, stop) ranges of the input seen as
    rows of its last axis ([-1, last]; a cache column a step wrote into): when still in place, only
    those are copied. The caller
    vouches for the values: a changed array named here would go unnoticed. `partial`: inputs of which
    the run reads only the leading rows (task -> rows of the first axis; a decode step's last cache
    column, filled only so far): they are placed and reloaded only that far (`summary.bytes_reloaded`
    counts what moved). The caller vouches that no kernel reads past them; the rest of the tensor's
    memory holds whatever was there. `copy_outputs=False` (with `close=False`): the outputs are the
    backend's own memory, valid until its next run, for a caller that uses them at once (a decode step's
    new cache rows and logits); no copy is made of them. `outputs_into`: outputs (by task) to be written
    into the caller's memory: an array of the output's shape and dtype (a decode step's new cache rows,
    into the cache), which the result holds in the output's place; or a list of pieces (start, stop,
    view), rows [start, stop) of the output's first axis into `view` (runtime.backends.base.Piece: a
    batched prefill's k and v rows of each sequence, into the token-major cache), pieces of one output
    not overlapping, rows no piece names written nowhere; such an output is left out of the result.
    The cuda backend copies them straight from the GPU (they should be page-locked: a pageable one is
    written all the same, but its copy holds the loop): an array whose rows are contiguous in one copy
    right after the vertex that holds the output at the end; pieces in one 2-D copy each, those of an
    output the plan offloads by its first offload, within that vertex's work (its storage copy then
    made only where a reload reads it: else the pieces are the only copy), those of one never
    offloaded right after the vertex that holds it. The rest (an array whose output is in host
    storage at the end, the cpu backend's) is copied on the host after the run.
    `summary.bytes_written_straight` and `summary.bytes_copied_after` count the two.
    """
    called = time.perf_counter()
    facts = _PLAN_FACTS.get(memgraph) if not close else None  # a plan run again: what it is read once
    if facts is None and inputs and any(node.shape is None or node.dtype is None for node in memgraph.nodes):
        known = {task: (tuple(array.shape), array.dtype.name) for task, array in inputs.items()}
        infer_types(memgraph, known)  # a hand-written memgraph without types: learn them from the inputs
    if facts is None and not close:
        facts = _PLAN_FACTS[memgraph] = _PlanFacts.of(memgraph)
    if close:
        if check_shapes:
            check_types(memgraph)
        graph = build_exec_graph(memgraph, streams, cost)
    else:  # a prepared backend that runs plan after plan: a plan run again reuses its checks and ExecGraph
        graph = _exec_graph(memgraph, streams, cost)
    if verify:
        verify_memgraph(memgraph)
    policy = make_policy(order, graph, seed)
    machine = make_backend(backend, jitter, seed, cost=cost) if isinstance(backend, str) else backend
    specs = facts.specs if facts is not None else input_specs(memgraph)
    # a plan run again remembers the arrays that passed (weakly: a caller's arrays are not kept alive by
    # the plan), so the same objects next run need no check
    arrays = make_inputs(specs, inputs, seed, facts.checked if facts is not None else None) if machine.needs_data else {}
    if outputs_into:
        _check_targets(facts.outputs if facts is not None else output_specs(memgraph), outputs_into)
    recorder = Recorder()
    checked = time.perf_counter()
    keep = not close and not isinstance(backend, str)
    held = machine.held()
    refresh = refresh or {}
    input_nodes = facts.inputs if facts is not None else None
    kept = {}
    if keep:
        kept = dict.fromkeys(held.kept(memgraph, [*unchanged, *refresh], input_nodes))
        kept.update((name, ranges) for name, ranges in refresh.items() if name in kept)
    valid = held.rows if keep else {}
    rows_of = facts.rows_of if facts is not None else None
    placing, rows_after = partial_placements(memgraph, partial or {}, kept, valid, input_nodes, rows_of) if partial or valid else (kept, {})
    limits = copy_limits(graph, partial) if partial else {}
    held.forget()  # until this run has finished, what the memory holds is unknown
    try:
        prepare_began = time.perf_counter()
        machine.pieces_ahead(frozenset(task for task, target in (outputs_into or {}).items() if not isinstance(target, np.ndarray)))
        machine.prepare(graph, arrays, placing) if placing else machine.prepare(graph, arrays)
        machine.limit_copies(limits)
        if outputs_into:
            machine.output_targets(outputs_into)
        prepare_time = time.perf_counter() - prepare_began
        external = machine.external_inputs()
        began = time.perf_counter()
        Executor(graph, machine, policy, [recorder, *callbacks]).run()
        ended = time.perf_counter()
        wall = ended - began
        outputs = machine.read_outputs() if copy_outputs or close else machine.read_outputs(copy=False)
        written = _write_targets(outputs, outputs_into, machine.needs_data) if outputs_into else (0, 0)
        read = time.perf_counter()
    except BaseException:
        machine.close()
        raise
    if keep:
        held.ran(memgraph, facts.survivors if facts is not None else None, rows_after)
    else:
        machine.close()
    summary = summarize(graph, recorder.completions, machine.name, order, wall, limits)
    in_place = {**placing, **dict.fromkeys(external)}  # read where the caller holds them: nothing copied
    ranged = {*refresh, *(partial or ()), *valid} if keep else None  # the only inputs whose placing names rows
    summary.bytes_placed, summary.bytes_staged = placed_bytes(memgraph, in_place, input_nodes, ranged, facts.sizes if facts is not None else None)
    summary.notes = machine.notes()
    summary.bytes_written_straight, summary.bytes_copied_after = written
    summary.prepare_time, summary.inputs_time = prepare_time, machine.inputs_time
    summary.host_seconds = {"checks": checked - called, "residency": prepare_began - checked, "prepare": began - prepare_began,
                            "outputs": read - ended, "summary": time.perf_counter() - read}
    return RunResult(outputs, summary, recorder)


_PREPARED: WeakKeyDictionary = WeakKeyDictionary()
"""memgraph -> {(streams, cost): ExecGraph}: a plan run again on a prepared backend (a session's decode
step) is checked and turned into its ExecGraph once (the ExecGraph is read-only to the executor and the
backends; such plans are not edited between runs)."""


@dataclass
class _PlanFacts:
    """What a run reads of a plan run again and again (`execute(..., close=False)`), read once: its input
    specs and nodes and the inputs its runs leave in place (such plans are not edited between runs)."""

    specs: dict
    inputs: list
    survivors: dict
    checked: dict = field(default_factory=dict)
    """Weak references to the arrays the runs were given (they passed `make_inputs`' checks)."""
    rows_of: dict = field(default_factory=dict)
    """`residency.input_rows` of its inputs."""
    sizes: dict = field(default_factory=dict)
    """`residency.input_bytes` of its inputs."""
    outputs: dict = field(default_factory=dict)
    """`output_specs` of the plan."""

    @classmethod
    def of(cls, memgraph: MemGraph) -> _PlanFacts:
        inputs = [node for node in memgraph.nodes if node.op == "input"]
        return cls(input_specs(memgraph), inputs, memgraph.surviving_inputs(), rows_of=input_rows(inputs), sizes=input_bytes(inputs),
                   outputs=output_specs(memgraph))


def output_specs(memgraph: MemGraph) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Output task -> (shape, numpy dtype) of the node that holds it."""
    nodes = memgraph.by_id()
    return {task: (tuple(nodes[node_id].shape), numpy_dtype(nodes[node_id].dtype)) for task, node_id in memgraph.outputs.items()}


def _check_targets(specs: Mapping[str, tuple[tuple[int, ...], np.dtype]], into: Mapping[str, OutputTarget]) -> None:
    """`execute(outputs_into=)`'s arrays and pieces against the outputs, or a one-line InputError naming
    the task (and the piece) of the first misfit."""
    for task, target in into.items():
        spec = specs.get(task)
        if spec is None:
            raise InputError(f"outputs_into names '{task}', which is not an output of the graph")
        if isinstance(target, (list, tuple)) and spec[0]:
            _check_pieces(task, *spec, target)
        elif not isinstance(target, np.ndarray) or target.shape != spec[0] or target.dtype != spec[1]:
            got = f"{target.dtype.name} {list(target.shape)}" if isinstance(target, np.ndarray) else type(target).__name__
            raise InputError(f"outputs_into['{task}'] must be a {spec[1].name} array of shape {list(spec[0])}"
                             f"{' or a list of (start, stop, view) pieces' if spec[0] else ''}, got {got}")


def _check_pieces(task: str, shape: tuple[int, ...], dtype: np.dtype, pieces) -> None:
    """Each piece names rows of the output and a view that holds them (rows contiguous); none overlap."""
    spans = []
    for k, piece in enumerate(pieces):
        name = f"outputs_into['{task}'] piece {k}"
        if not isinstance(piece, (list, tuple)) or len(piece) != 3:
            raise InputError(f"{name} must be (start, stop, view), got {type(piece).__name__}")
        start, stop, view = piece
        if not all(isinstance(row, (int, np.integer)) and not isinstance(row, bool) for row in (start, stop)) \
                or not 0 <= start <= stop <= shape[0]:
            raise InputError(f"{name}: rows [{start}, {stop}) do not lie within the output's {shape[0]} rows")
        want = (stop - start, *shape[1:])
        if not isinstance(view, np.ndarray) or view.shape != want or view.dtype != dtype:
            got = f"{view.dtype.name} {list(view.shape)}" if isinstance(view, np.ndarray) else type(view).__name__
            raise InputError(f"{name} must be a {dtype.name} view of shape {list(want)}, got {got}")
        if not view.flags.writeable or not rows_contiguous(view):
            raise InputError(f"{name}: the view must be writeable, each row contiguous and the rows a row or more apart"
                             f" (strides {list(view.strides)})")
        if stop > start:
            spans.append((start, stop, k))
    spans.sort()
    for (_, end, k), (start, stop, j) in zip(spans, spans[1:]):
        if start < end:
            raise InputError(f"outputs_into['{task}'] pieces {min(k, j)} and {max(k, j)} overlap: rows [{start}, {min(stop, end)}) are in both")


def _write_targets(outputs: dict[str, np.ndarray], into: Mapping[str, OutputTarget], has_data: bool) -> tuple[int, int]:
    """Copy into the caller's arrays and pieces what the backend did not write there itself (what
    `read_outputs` returned in their place, Backend.output_targets), leaving pieced outputs out of
    `outputs`; (bytes the backend wrote straight, bytes copied here). A backend without data writes none."""
    straight = after = 0
    for task, target in into.items():
        values = outputs.get(task)
        if values is target:  # first: a decode step's rows, every step
            straight += target.nbytes
            continue
        pieces = not isinstance(target, np.ndarray)
        if values is None:
            straight += sum(view.nbytes for _, _, view in target) if pieces and has_data else 0
        elif pieces:
            for start, stop, view in target:
                view[...] = values[start:stop]
                after += view.nbytes
            del outputs[task]
        else:
            target[...] = values
            outputs[task] = target
            after += target.nbytes
    return straight, after


_PLAN_FACTS: WeakKeyDictionary = WeakKeyDictionary()
"""memgraph -> _PlanFacts, for plans run on a prepared backend."""


def _exec_graph(memgraph: MemGraph, streams: int, cost: CostModel | None):
    """`check_types` and `build_exec_graph`, once per memgraph, streams and cost model."""
    graphs = _PREPARED.get(memgraph)
    key = (streams, cost)
    if graphs is None or key not in graphs:
        check_types(memgraph)
        graphs = _PREPARED.setdefault(memgraph, {})
        graphs[key] = build_exec_graph(memgraph, streams, cost)
    return graphs[key]


def sim_makespan(memgraph: MemGraph, streams: int = 2, order: str = "nondet", cost: CostModel | None = None,
                 deadline: Callable[[], float] | None = None, compiled: bool = False) -> float:
    """Seconds the sim backend predicts for one run of `memgraph` (the H200 cost model unless `cost`);
    what `passes.pipeline.compile_best` ranks schedules by in `turnip run --schedule auto`. With a
    `deadline` (a callable giving seconds, read as the run goes: runtime/backends/sim.py), a run that
    goes on longer is stopped and `math.inf` returned: its makespan is larger than the deadline.
    `compiled`: the memgraph is `compile_taskgraph`'s, whose shapes come from a taskgraph that checked
    them as it was built: they are not checked again (`execute(check_shapes=False)`)."""
    backend = SimBackend(cost=cost, deadline=deadline) if deadline is not None else "sim"
    try:
        return execute(memgraph, backend=backend, order=order, streams=streams, cost=cost, verify=False,
                       check_shapes=not compiled).summary.makespan
    except DeadlinePassed:
        return math.inf

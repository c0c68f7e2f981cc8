"""Offload insertion: the pass that turns a placed taskgraph into a memgraph under a per-GPU budget.

It checks the budget, picks the alignment and runs the offload planner (passes/planner.py) in the
chosen schedule (passes/schedules.py). Alignment: offsets are multiples of 256 bytes while every op's working set still fits
so padded; a budget tighter than that packs at element alignment, so any budget that holds the
largest working set (`minimum_budget`) works. A smaller one fails naming the op, its GPU and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


from passes.compilation import Compilation
from passes.compile_stats import timed
from passes.graph_pass import GraphPass, check_budget_option, taskgraph_of
from passes.allocator import ALIGN, PLACEMENTS, aligned
from passes.compact import TaskView
from passes.schedules import scheduled_tasks
from passes.planner import Planner
from turnip_ir.cost import CostModel
from turnip_ir.errors import BudgetError, InputError
from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.units import format_size


INPUTS_START = ("gpu", "host", "recur")
"""Where inputs start: `gpu` (on their GPU while they fit, the rest in CPU storage), `host` (all in
CPU storage, as weights loaded into host memory do; the plan reloads them) or `recur` (the plan runs
again and again, as a decode step does: inputs stay on the GPU after their last read while their room
is not needed, and only those that survive the run start there, so a prepared backend keeps them)."""

RECUR_ROUNDS = 4
"""At most this many plans for `inputs="recur"`: each round lets only the previous round's survivors start on the GPU."""


def insert_offload(
    graph: TaskGraph, budget: int, schedule: str = "given", placement: str = "loosest", inputs: str = "gpu",
    remat: CostModel | None = None,
    kept: dict | None = None,
    spread: bool = True,
    start_on_gpu: frozenset[str] = frozenset(),
) -> MemGraph:
    """The memgraph of one simulated run of the placed `graph` in `schedule` under a per-GPU `budget`.

    `placement` chooses among free regions that fit: `loosest` (freed longest ago) or `first-fit`;
    `inputs` says where inputs start (INPUTS_START); `remat`, a cost model (turnip_ir/cost.py),
    lets the planner recompute an evicted tensor at its next use instead of offloading and reloading
    it, where that model says recomputing is cheaper; None never recomputes. `spread` (inputs="recur"
    only): the inputs that stay on the GPU are spread over the run (`plan_recurring`); False keeps the
    first-used ones, for comparison. `start_on_gpu` (inputs="host" only) names inputs that start on
    their GPU all the same, in first-use order while they fit: the activations a run is fed from GPU
    work before it, where only the weights live in host memory.
    """
    if inputs not in INPUTS_START:
        raise InputError(f"unknown inputs start '{inputs}' (known: {', '.join(INPUTS_START)})")
    if start_on_gpu:
        _check_start_on_gpu(graph, inputs, start_on_gpu)
    for node in graph.nodes.values():
        if node.device is None:
            raise InputError(f"op '{node.id}' ({node.op}) has no device: run turnip-place-devices first")
    view = TaskView.build(graph)
    if placement not in PLACEMENTS:
        raise InputError(f"unknown placement '{placement}' (known: {', '.join(PLACEMENTS)})")
    align = alignment(graph, view, budget)
    order = scheduled_tasks(view, schedule)
    if inputs != "recur":
        named = set(start_on_gpu) if start_on_gpu else None
        return Planner(graph, view, budget, order, placement, align, inputs_on_gpu=inputs == "gpu" or named is not None,
                       gpu_start=named, remat=remat).run()
    first_used = _inputs_by_first_use(graph, view, order) if spread else None
    return plan_recurring(lambda allowed: Planner(graph, view, budget, order, placement, align, recur=True, gpu_start=allowed,
                                                  remat=remat, preferred=kept).run(), first_used)


def _check_start_on_gpu(graph: TaskGraph, inputs: str, names: frozenset[str]) -> None:
    if inputs != "host":
        raise InputError(f"inputs named to start on the GPU need inputs=host, not '{inputs}'")
    for name in sorted(names):
        node = graph.nodes.get(name)
        if node is None or node.op != "input":
            raise InputError(f"'{name}', named to start on the GPU, is not an input of the taskgraph")


def plan_recurring(plan, first_used: list[tuple[str, int, int]] | None = None) -> MemGraph:
    """The plan of a recurring run: `plan(allowed)` plans with only the inputs in `allowed` (None: any)
    starting on the GPU. An input that starts there but is overwritten during the run would be put back
    before every run (a copy nothing overlaps), so the next round starts only the survivors there,
    until every input that starts on the GPU survives (or `RECUR_ROUNDS`; the last plan is kept: what
    does not survive is put back before each run, and counted).

    Spread (`first_used`: the inputs as (task, GPU, bytes) in first-use order). Left to itself the planner
    starts the first-used inputs on the GPU while they fit: a decode step keeps its first layers whole
    and streams the rest into the little room left, so the host link fills that room at once and then
    waits until the resident layers are computed before anything is freed (16.6 ms of a 271 ms step on
    the H200 at 16 GiB). With `first_used`, the plan keeps about as many bytes (those of the first plan's
    survivors, per GPU) spread over the run instead: an input starts on the GPU while the bytes kept so far
    on its GPU stay within that share of its GPU's input bytes seen so far, so every part of the run streams a little and
    the link starts with the first layer (sim, 7b B = 16 at 16 GiB: 265.2 -> 250.2 ms)."""
    memgraph = _survivors(plan, None)
    if not first_used:
        return memgraph
    kept: dict[int, int] = {}
    for node in memgraph.nodes:
        if node.op == "input" and node.loc is not None:
            kept[node.device] = kept.get(node.device, 0) + node.nbytes
    total: dict[int, int] = {}
    for _, device, nbytes in first_used:
        total[device] = total.get(device, 0) + nbytes
    if not kept or all(kept.get(device, 0) >= count for device, count in total.items()):
        return memgraph  # nothing stays, or everything does: nothing to spread
    allowed: set[str] = set()
    seen: dict[int, int] = {}
    taken: dict[int, int] = {}
    for task, device, nbytes in first_used:  # per GPU: its share of the bytes seen so far
        seen[device] = seen.get(device, 0) + nbytes
        if (taken.get(device, 0) + nbytes) * total[device] <= kept.get(device, 0) * seen[device]:
            allowed.add(task)
            taken[device] = taken.get(device, 0) + nbytes
    return _survivors(plan, allowed)


def _survivors(plan, allowed: set[str] | None) -> MemGraph:
    """`plan(allowed)` until every input that starts on the GPU survives the run (`plan_recurring`)."""
    for _ in range(RECUR_ROUNDS):
        memgraph = plan(allowed)
        started = {node.task for node in memgraph.nodes if node.op == "input" and node.loc is not None}
        kept = set(memgraph.surviving_inputs())
        if started <= kept:
            break
        allowed = started & kept
    return memgraph


def _inputs_by_first_use(graph: TaskGraph, view: TaskView, order: list[int]) -> list[tuple[str, int, int]]:
    """(task, GPU, bytes) of every input the scheduled tasks read, in the order they are first read."""
    tasks = list(graph.nodes.values())
    seen: set[int] = set()
    first: list[tuple[str, int, int]] = []
    for i in order:
        for o in view.inputs[i]:
            if view.ops[o] == "input" and o not in seen:
                seen.add(o)
                first.append((tasks[o].id, view.devices[o], view.nbytes[o]))
    return first


def fine_alignment(graph: TaskGraph) -> int:
    """The element alignment: the largest element size in the graph (sizes are multiples of it)."""
    return max((DTYPE_BYTES[node.dtype] for node in graph.nodes.values()), default=1)


def alignment(graph: TaskGraph, view: TaskView, budget: int) -> int:
    """256 bytes when every working set still fits the budget so aligned, else the element alignment.

    Aligned offsets are what GPU kernels like; but a budget that holds the largest working set must
    never fail, so a tight budget packs tensors at element alignment instead."""
    if _largest_working_set(view, ALIGN) <= budget // ALIGN * ALIGN:
        return ALIGN
    fine = fine_alignment(graph)
    check_budget(graph, view, budget, fine)
    return fine


def minimum_budget(graph: TaskGraph) -> int:
    """The smallest budget that can work: the largest working set of one op on one GPU (element-aligned)."""
    return _largest_working_set(TaskView.build(graph), fine_alignment(graph))


def _largest_working_set(view: TaskView, align: int) -> int:
    return max((total for _, _, total in _working_sets(view, align)), default=align)


def _working_sets(view: TaskView, align: int):
    """(task, device, aligned bytes) of every op's operands plus output on each GPU it touches."""
    sizes = [aligned(nbytes, align) for nbytes in view.nbytes]
    devices = view.devices
    for i, operands in enumerate(view.inputs):
        if view.ops[i] == "input":
            continue  # an input may start in storage; the ops that read it are checked
        d = devices[i]
        distinct = set(operands)
        if all(devices[o] == d for o in distinct):
            yield i, d, sizes[i] + sum(sizes[o] for o in distinct)
            continue
        need: dict[int, int] = {d: sizes[i]}
        for o in distinct:
            need[devices[o]] = need.get(devices[o], 0) + sizes[o]
        for device, total in need.items():
            yield i, device, total


def check_budget(graph: TaskGraph, view: TaskView, budget: int, align: int) -> None:
    """Raise `BudgetError` naming the first op whose working set on one GPU exceeds the budget, and the
    smallest budget that compiles (`minimum_budget`: the largest working set at `align`)."""
    capacity = budget // align * align
    for i, device, total in _working_sets(view, align):
        if total > capacity:
            floor = _largest_working_set(view, align)
            raise BudgetError(
                f"op '{view.ids[i]}' ({view.ops[i]} on GPU {device}) needs {total} bytes but the budget is {budget} bytes"
                f"; the smallest budget that compiles is {floor} ({format_size(floor)})"
            )


@dataclass(frozen=True)
class InsertOffloadPass(GraphPass):
    """Turn a placed taskgraph into a memgraph by simulating one run under a per-GPU budget.

    The simulation runs the tasks in the chosen schedule with an allocator per GPU, gives every
    tensor a location, evicts the tensors cheapest to move per step until they are needed
    (offloading only what is needed again or is an output), reloads before the next use into a fresh
    location, and starts the inputs that do not fit in CPU storage. Offloads wait for nothing but
    their tensor. Offsets are 256-byte aligned while every op's working set fits the budget so
    padded, else element-aligned; a budget below an op's working set fails naming the op, its GPU
    and the bytes it needs. With `remat`, an evicted kernel output may be recomputed at its next use
    (a second kernel node of its task) instead of offloaded and reloaded. It adds no reuse edges:
    run turnip-insert-memory-deps next.
    """

    name = "turnip-insert-offload"
    reads = ("graph", "cost", "kept", "start_on_gpu")
    adds = ("graph", "source")
    budget: int
    """Bytes per GPU, a positive number."""
    schedule: str = "given"
    """The order of the simulated run: `given` (the taskgraph's node order), `dfs` (a depth-first
    post-order from the outputs) or `memory` (the ready task that grows live memory least)."""
    placement: str = "loosest"
    """Which free region that fits takes a tensor: `loosest` (the one freed longest ago, for the
    loosest memory edges) or `first-fit` (the lowest offset, for ablations)."""
    inputs: str = "gpu"
    """Where inputs start: `gpu` (on their GPU, in first-use order, while they fit), `host` (all in
    CPU storage, as weights loaded into host memory; the plan reloads them where they are read) or
    `recur` (a plan run again and again: inputs stay on the GPU after their last read while their room
    is not needed, and only the ones that survive the run start there; the runtime keeps them)."""
    remat: bool = False
    """Recompute an evicted tensor at its next use instead of offloading and reloading it, where the
    cost model's kernel time is below the transfer time and its operands are on the GPU or in
    storage (docs/passes.md, "Rematerialization")."""

    def run(self, state: Compilation) -> None:
        check_budget_option(self.budget, self.name)
        graph = taskgraph_of(state.graph, self.name)
        with timed(state.stats, "simulate"):
            remat = state.cost if self.remat else None
            memgraph = insert_offload(graph, self.budget, self.schedule, self.placement, self.inputs, remat, state.kept,
                                      start_on_gpu=state.start_on_gpu)
        state.stats.record_graph(memgraph, state.cost)  # the later passes add and drop edges only: these counts stay
        state.replace_graph(memgraph)
        state.source = graph

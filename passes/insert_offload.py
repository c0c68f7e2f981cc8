"""Offload insertion by simulation: run the taskgraph once in a chosen order and write the memgraph it implies.

State: one `DeviceMemory` per GPU, and per tensor its GPU copy (a memgraph node or -1), its storage copy
(an offload or a storage input, or -1), and its remaining uses in the order.
Per task: make every operand resident (a reload into a fresh location when it is in storage), pin them,
allocate the output (evicting by farthest next use when there is no room), emit the node, then free the
tensors nobody reads again. Eviction offloads a tensor only when it has no storage copy yet and is still
needed (a later use, or a graph output); inputs are read-only, so their storage copy never goes stale.
When pinned operands fragment a GPU so that nothing fits, the GPU is flushed (everything offloaded) and
the operands are reloaded packed from offset 0: this cannot fail once the working set fits the budget.
Inputs start on their GPU in first-use order while they fit; one evicted before anyone read it is
rewritten to start in CPU storage (it never needed the GPU), so unused room is the only cost.
Storage is a bump allocator, never reused, so storage needs no edges.
Alignment: offsets are multiples of 256 bytes while every working set still fits so padded; a budget
tighter than that packs at element alignment, so any budget that holds the largest working set works.
`loc` and `storage` sizes are the tensors' exact byte sizes (the allocator reserves the padded size).
"""

from __future__ import annotations

from dataclasses import dataclass


from passes.ir import GraphPass, check_budget_option, taskgraph_of
from passes.stats import collected, timed
from passes.allocator import ALIGN, NEVER, PLACEMENTS, DeviceMemory, aligned
from passes.compact import TaskView
from passes.orders import execution_order
from turnip_ir.errors import BudgetError, InputError
from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.taskgraph import TaskGraph


INPUTS_START = ("gpu", "host")
"""Where inputs start: `gpu` (on their GPU while they fit, the rest in CPU storage) or `host` (all in
CPU storage, as weights loaded into host memory do; the plan reloads them)."""


def insert_offload(graph: TaskGraph, budget: int, order: str = "given", placement: str = "loosest", inputs: str = "gpu") -> MemGraph:
    """The memgraph of one simulated run of the placed `graph` in `order` under a per-GPU `budget`.

    `placement` chooses among free regions that fit: `loosest` (freed longest ago) or `first-fit`;
    `inputs` says where inputs start (INPUTS_START).
    """
    if inputs not in INPUTS_START:
        raise InputError(f"unknown inputs start '{inputs}' (known: {', '.join(INPUTS_START)})")
    for node in graph.nodes.values():
        if node.device is None:
            raise InputError(f"op '{node.id}' ({node.op}) has no device: run turnip-place-devices first")
    view = TaskView.build(graph)
    if placement not in PLACEMENTS:
        raise InputError(f"unknown placement '{placement}' (known: {', '.join(PLACEMENTS)})")
    align = alignment(graph, view, budget)
    planner = Planner(graph, view, budget, execution_order(view, order), placement, align)
    planner.inputs_on_gpu = inputs == "gpu"
    return planner.run()


def offload_waits(memgraph: MemGraph) -> int:
    """The memory edges the simulation itself adds: each offload waits for the readers before it."""
    return sum(len(node.mem_deps) for node in memgraph.nodes if node.op == "offload")


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
    for i, operands in enumerate(view.inputs):
        if view.ops[i] == "input":
            continue  # an input may start in storage; the ops that read it are checked
        need: dict[int, int] = {view.devices[i]: aligned(view.nbytes[i], align)}
        for o in set(operands):
            need[view.devices[o]] = need.get(view.devices[o], 0) + aligned(view.nbytes[o], align)
        for device, total in need.items():
            yield i, device, total


def check_budget(graph: TaskGraph, view: TaskView, budget: int, align: int) -> None:
    """Raise `BudgetError` naming the first op whose working set on one GPU exceeds the budget."""
    capacity = budget // align * align
    for i, device, total in _working_sets(view, align):
        if total > capacity:
            raise BudgetError(
                f"op '{view.ids[i]}' ({view.ops[i]} on GPU {device}) needs {total} bytes but the budget is {budget} bytes"
            )


class Planner:
    """One simulation; `run()` returns the memgraph."""

    def __init__(
        self, graph: TaskGraph, view: TaskView, budget: int, order: list[int], placement: str = "loosest", align: int = ALIGN
    ) -> None:
        check_budget(graph, view, budget, align)
        self.graph, self.view, self.order, self.align = graph, view, order, align
        self.out = MemGraph(graph.devices, budget)
        self.memory = [DeviceMemory(budget // align * align, placement) for _ in range(graph.devices)]
        n = len(view)
        self.gpu = [-1] * n
        self.store = [-1] * n
        self.readers: dict[int, list[int]] = {}
        self.uses: list[list[int]] = [[] for _ in range(n)]
        for step, i in enumerate(order):
            for o in dict.fromkeys(view.inputs[i]):
                self.uses[o].append(step)
        self.next = [0] * n
        self.is_output = [False] * n
        for o in view.outputs:
            self.is_output[o] = True
        self.storage_top = 0
        self.inputs_on_gpu = True
        self.unread: set[int] = set()
        """Input nodes placed on a GPU that nobody has read yet."""

    def run(self) -> MemGraph:
        self._place_inputs()
        for step, i in enumerate(self.order):
            self._run_task(step, i)
        for o in self.view.outputs:
            holder = self.gpu[o] if self.gpu[o] >= 0 else self.store[o]
            self.out.outputs[self.view.ids[o]] = holder
        return self.out

    def _place_inputs(self) -> None:
        view = self.view
        inputs = [i for i, op in enumerate(view.ops) if op == "input"]
        inputs.sort(key=lambda i: self.uses[i][0] if self.uses[i] else NEVER)
        for i in inputs:
            d, size = view.devices[i], aligned(view.nbytes[i], self.align)
            wanted = self.inputs_on_gpu and (self.uses[i] or self.is_output[i])
            start = self.memory[d].place_free(size) if wanted else None
            if start is not None:
                self.memory[d].take(start, size, i)
                self.gpu[i] = self._emit("input", i, d, loc=(start, view.nbytes[i]), inputs=())
                self.unread.add(self.gpu[i])
            else:
                self.store[i] = self._emit("input", i, None, storage=self._storage(i), inputs=())

    def _run_task(self, step: int, i: int) -> None:
        view = self.view
        operands = list(dict.fromkeys(view.inputs[i]))
        pinned = set(operands)
        for o in operands:
            if self.gpu[o] < 0 and not self._reload(o, step, pinned):
                self._flush(view.devices[o], step, pinned, operands)
        d, size = view.devices[i], aligned(view.nbytes[i], self.align)
        start = self._allocate(d, size, step, pinned)
        if start is None:
            self._flush(d, step, pinned, operands)
            start = self._allocate(d, size, step, pinned)
        self.memory[d].take(start, size, i)
        kind = "move" if view.ops[i] == "move" else "kernel"
        node = self._emit(kind, i, d, loc=(start, view.nbytes[i]), inputs=tuple(self.gpu[o] for o in view.inputs[i]))
        self.gpu[i] = node
        for o in operands:
            self.unread.discard(self.gpu[o])
            self.readers.setdefault(self.gpu[o], []).append(node)
            self.next[o] += 1
            self._drop_if_dead(o, step)
        self._drop_if_dead(i, step)

    def _drop_if_dead(self, t: int, step: int) -> None:
        if self.next[t] == len(self.uses[t]) and not self.is_output[t] and self.gpu[t] >= 0:
            self.memory[self.view.devices[t]].release(t, step)
            self.gpu[t] = -1

    def _next_use(self, t: int) -> int:
        return self.uses[t][self.next[t]] if self.next[t] < len(self.uses[t]) else NEVER

    def _allocate(self, d: int, size: int, step: int, pinned: set[int]) -> int | None:
        """A start for `size` bytes on GPU `d`, evicting unpinned tensors if needed; None if fragmented."""
        memory = self.memory[d]
        start = memory.place_free(size)
        if start is not None:
            return start
        start = memory.best_window(size, pinned, self._victim_score)
        if start is None:
            return None
        for victim in memory.holders(start, size):
            self._evict(victim, step)
        return start

    def _victim_score(self, t: int) -> tuple[int, int]:
        """(next use, bytes to offload); an unread input is free to drop, as if it had started in storage."""
        if self.gpu[t] in self.unread:
            return NEVER, 0
        return self._next_use(t), 0 if self.store[t] >= 0 else self.view.nbytes[t]

    def _evict(self, t: int, step: int) -> None:
        """Take tensor `t` off its GPU, offloading it first unless storage already holds it."""
        d = self.view.devices[t]
        if self.gpu[t] in self.unread:
            self._start_in_storage(t)
        elif self.store[t] < 0:
            copy = self.gpu[t]
            deps = tuple(r for r in self.readers.get(copy, ()))
            self.store[t] = self._emit("offload", t, d, storage=self._storage(t), inputs=(copy,), mem_deps=deps)
        self.memory[d].release(t, step)
        self.gpu[t] = -1

    def _start_in_storage(self, t: int) -> None:
        """An input evicted before anyone read it never needed the GPU: it starts in CPU storage instead."""
        node = self.out.nodes[self.gpu[t]]
        self.unread.discard(node.id)
        node.device, node.loc, node.storage = None, None, self._storage(t)
        self.store[t] = node.id

    def _reload(self, t: int, step: int, pinned: set[int]) -> bool:
        d, size = self.view.devices[t], aligned(self.view.nbytes[t], self.align)
        start = self._allocate(d, size, step, pinned)
        if start is None:
            return False
        self.memory[d].take(start, size, t)
        self.gpu[t] = self._emit("reload", t, d, loc=(start, self.view.nbytes[t]), inputs=(self.store[t],))
        return True

    def _flush(self, d: int, step: int, pinned: set[int], operands: list[int]) -> None:
        """Evict everything on GPU `d`, then reload this task's operands that live there, packed from 0."""
        for t in list(self.memory[d].where):
            self._evict(t, step)
        for o in operands:
            if self.view.devices[o] == d:
                placed = self._reload(o, step, pinned)
                assert placed, "a flushed GPU holds any working set within the budget"

    def _storage(self, t: int) -> tuple[int, int]:
        start = self.storage_top
        self.storage_top += aligned(self.view.nbytes[t], self.align)
        return (start, self.view.nbytes[t])

    def _emit(self, op: str, t: int, device, loc=None, storage=None, inputs=(), mem_deps=()) -> int:
        task = self.graph.nodes[self.view.ids[t]]
        node_id = len(self.out.nodes)
        kernel = task.op if op == "kernel" else None
        attrs = dict(task.attrs) if op == "kernel" else {}
        self.out.add(MemNode(node_id, op, task.id, device, loc, storage, tuple(inputs), tuple(mem_deps), kernel, task.shape, task.dtype, attrs))
        return node_id


@dataclass(frozen=True)
class InsertOffloadPass(GraphPass):
    """Turn a placed taskgraph into a memgraph by simulating one run under a per-GPU budget.

    The simulation runs the tasks in `order` (given, dfs, memory) with a 256-byte-aligned allocator per
    GPU, gives every tensor a location, evicts by farthest next use (offloading only what is needed
    again or is an output), reloads before the next use into a fresh location, and starts the inputs
    that do not fit in CPU storage. It adds no reuse edges: run turnip-insert-memory-deps next.
    """

    name = "turnip-insert-offload"
    budget: int = 0
    order: str = "given"
    placement: str = "loosest"

    def transform(self, graph: TaskGraph) -> MemGraph:
        check_budget_option(self.budget, self.name)
        graph = taskgraph_of(graph, self.name)
        stats = collected.get()
        with timed(stats, "simulate"):
            memgraph = insert_offload(graph, self.budget, self.order, self.placement)
        if stats is not None:
            stats.edges_added += offload_waits(memgraph)
            stats.record_graph(memgraph)
        return memgraph

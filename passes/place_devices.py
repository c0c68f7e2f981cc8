"""Device placement: give a GPU to every kernel that has none, balancing load along the critical path.

Kernels are visited in topological order (a list-scheduling pass, as in HEFT). For each unplaced kernel
and each GPU the pass estimates when the kernel would finish there: its operands' finish times, plus a
copy time for operands on another GPU, then the GPU's busy-until time plus the kernel's FLOPs. It takes
the GPU with the earliest estimated finish, so the longest chain stays on the fastest path while
parallel branches spread out. Placed nodes keep their device.
When an operand lives on another GPU the pass inserts a `move` (id `'<operand>.to<gpu>'`, shared by every
reader on that GPU) rather than moving the kernel, so a placed producer is never second-guessed.
The cost model is unit-free: FLOPS_PER_BYTE says how many FLOPs cost as much time as one copied byte.
"""

from __future__ import annotations

from dataclasses import dataclass


from passes.compilation import Compilation
from passes.compile_stats import timed
from passes.graph_pass import GraphPass, taskgraph_of
from turnip_ir.errors import InputError
from turnip_ir.kernels import KERNELS
from turnip_ir.taskgraph import TaskGraph, TaskNode

FLOPS_PER_BYTE = 50.0
"""A GPU does about this many FLOPs in the time a peer link moves one byte."""


def place_devices(graph: TaskGraph, devices: int = 0) -> TaskGraph:
    """A copy of `graph` with every kernel placed and the moves its placement needs; `devices=0` keeps the count."""
    count = devices or graph.devices
    if count < graph.devices:
        raise InputError(f"place-devices: devices={count} is fewer than the taskgraph's {graph.devices}")
    placed = TaskGraph(count)
    choosing = any(node.device is None for node in graph.nodes.values())
    finish: dict[str, float] | None = {} if choosing else None  # finish times matter only to a choice
    busy = [0.0] * count
    for node in graph.nodes.values():
        cost = _cost(graph, node) if choosing else 0.0
        device = node.device if node.device is not None else _best_device(placed, node, cost, finish, busy)
        inputs = tuple(_local(placed, graph, src, device, finish) for src in node.inputs) if node.op != "move" else node.inputs
        placed.nodes[node.id] = TaskNode(node.id, node.op, inputs, node.shape, node.dtype, device, dict(node.attrs))
        if choosing:
            start = max([busy[device]] + [finish[i] for i in inputs])
            finish[node.id] = start + cost
            busy[device] = finish[node.id]
    placed.outputs = list(graph.outputs)
    return placed


def _cost(graph: TaskGraph, node: TaskNode) -> float:
    if node.op == "input":
        return 0.0
    if node.op == "move":
        return float(node.nbytes)
    shapes = [graph.nodes[i].shape for i in node.inputs]
    return KERNELS[node.op].flops(shapes, node.shape, node.attrs) / FLOPS_PER_BYTE


def _best_device(placed: TaskGraph, node: TaskNode, cost: float, finish: dict[str, float], busy: list[float]) -> int:
    best = None
    for device in range(len(busy)):
        ready = busy[device]
        for src in node.inputs:
            operand = placed.nodes[src]
            copy = 0.0 if operand.device == device else float(operand.nbytes)
            ready = max(ready, finish.get(src, 0.0) + copy)
        key = (ready + cost, device)
        best = key if best is None or key < best else best
    return best[1]


def _local(placed: TaskGraph, graph: TaskGraph, src: str, device: int, finish: dict[str, float] | None) -> str:
    """The id of `src` on `device`: itself, or a move to there (made once and shared)."""
    operand = placed.nodes[src]
    if operand.device == device:
        return src
    name = f"{src}.to{device}"
    while name in graph.nodes and not _is_move(graph.nodes[name], src, device):
        name += "'"
    if name not in placed.nodes:
        placed.nodes[name] = TaskNode(name, "move", (src,), operand.shape, operand.dtype, device)
        if finish is not None:
            finish[name] = finish[src] + float(operand.nbytes)
    return name


def _is_move(node: TaskNode, src: str, device: int) -> bool:
    return node.op == "move" and node.inputs == (src,) and node.device == device


@dataclass(frozen=True)
class PlaceDevicesPass(GraphPass):
    """Give a GPU to every kernel without one, balancing load along the critical path.

    List scheduling in topological order (as in HEFT): each unplaced kernel goes to the GPU where it
    would finish earliest, counting its operands' finish times, a copy time for operands on another
    GPU and the GPU's busy time, so the longest chain stays together and parallel branches spread
    out. Kernels that already have a device keep it. When an operand lives on another GPU the pass
    inserts a `move` named `'<operand>.to<gpu>'` (as the model generators name theirs), shared by
    every reader on that GPU: the data moves, a placed producer is never second-guessed.
    """

    name = "turnip-place-devices"
    adds = ("graph",)
    devices: int = 0
    """How many GPUs to place on; 0 keeps the module's count, and fewer than it is an error."""

    def run(self, state: Compilation) -> None:
        with timed(state.stats, "place"):
            state.replace_graph(place_devices(taskgraph_of(state.graph, self.name), self.devices))

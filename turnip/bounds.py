"""Lower bounds on the sim's makespan of any plan of a taskgraph under a budget, from the taskgraph alone.

A search over plans (turnip/choose.py) skips a candidate whose bound cannot beat the best plan found,
before compiling it. Three floors, each what the sim backend (runtime/backends/sim.py) must spend
whatever the planner does, and the bound is the largest:
- compute: per GPU, the sum of its kernels' durations in the cost model. The sim drains k kernels
  sharing a GPU at `overlap_efficiency` together, so a GPU does at most that much work per second;
  recomputation (remat) only adds kernels.
- host: the event loop's time per vertex (`CostModel.host_time`), serial over every GPU: the last vertex
  cannot start before the loop has submitted every kernel and move (reloads and offloads add more).
  The first vertex's own host time is left out, since the makespan starts at the first start.
- link: per GPU, the input bytes placed there beyond the arena start in host storage and must cross
  the host link at least once, at no more than `h2d_bw` (with inputs="host", all of them).
The bounds are exact sums over the taskgraph (kernel durations memoised per signature), a pass over
the nodes: about 40 ms for llama 7b at 32k tokens. Once a plan is compiled, `plan_bound` counts its own
vertices and copies: the bytes each GPU reloads and offloads, each direction at its rate and both at
the duplex rate (a plan that reloads every weight per token block is bound by its link).
"""

from __future__ import annotations

from dataclasses import dataclass

from turnip_ir.cost import CostModel, durations
from turnip_ir.memgraph import MemNode
from turnip_ir.taskgraph import TaskGraph, TaskNode, attrs_key


@dataclass(frozen=True)
class MakespanBound:
    """Seconds no plan's sim makespan can go below, by floor: compute and link on the busiest GPU, host overall."""

    compute: float
    host: float
    link: float

    @property
    def seconds(self) -> float:
        return max(self.compute, self.host, self.link)


def makespan_bound(graph: TaskGraph, arena: int, cost: CostModel | None = None, inputs: str = "gpu") -> MakespanBound:
    """The bound of any plan of `graph` at `arena` bytes per GPU that the sim runs with `cost` (None: the
    H200 defaults); `inputs` is where the plan starts its inputs (`gpu`: while they fit, or `host`)."""
    cost = cost or CostModel()
    compute = [0.0] * graph.devices
    held = [0] * graph.devices
    host, largest = 0.0, 0.0
    memo: dict[tuple, tuple[float, float]] = {}
    for node in graph.nodes.values():
        if node.op == "input":
            held[node.device] += node.nbytes
            continue
        seconds, loop = _costs(graph, node, cost, memo)
        if node.op != "move":
            compute[node.device] += seconds
        host += loop
        largest = max(largest, loop)
    spill = [held_bytes if inputs == "host" else max(0, held_bytes - arena) for held_bytes in held]
    rate = max(cost.overlap_efficiency, 1.0)
    return MakespanBound(max(compute) / rate, host - largest, max(spill) / cost.h2d_bw)


def _costs(graph: TaskGraph, node: TaskNode, cost: CostModel, memo: dict) -> tuple[float, float]:
    """A kernel's or move's (duration, host time) in the cost model, memoised per signature."""
    operands = [graph.nodes[i] for i in node.inputs]
    try:
        key = (node.op, node.shape, node.dtype, tuple((o.shape, o.dtype) for o in operands),
               attrs_key(node.attrs))
        known = memo.get(key)
    except TypeError:  # an unhashable attribute: no memo
        key, known = None, None
    if known is None:
        mem = _mem_node(node, "move" if node.op == "move" else "kernel")
        sources = [_mem_node(o, "input") for o in operands]
        known = (cost.duration(mem, sources), cost.host_time(mem, sources))
        if key is not None:
            memo[key] = known
    return known


def _mem_node(node: TaskNode, op: str) -> MemNode:
    """The memgraph vertex the cost model prices for a taskgraph node (location and storage do not matter)."""
    kernel = node.op if op == "kernel" else None
    return MemNode(0, op, node.id, node.device, None, None, (), kernel=kernel, shape=node.shape, dtype=node.dtype,
                   attrs=node.attrs)


def plan_bound(memgraph, cost: CostModel | None = None) -> MakespanBound:
    """The bound of one compiled plan: as `makespan_bound`, with the plan's own vertices (recomputes, reloads
    and offloads in the loop's time) and its copies: per GPU, the bytes it reloads at `h2d_bw`, offloads at
    `d2h_bw`, and both over the duplex link at `duplex_bw`."""
    cost = cost or CostModel()
    nodes = memgraph.by_id()
    seconds = durations(memgraph, cost)  # the sim that follows prices the vertices with these same figures
    compute = [0.0] * memgraph.devices
    up, down = [0] * memgraph.devices, [0] * memgraph.devices
    host, largest = 0.0, 0.0
    for k, node in enumerate(memgraph.nodes):
        if node.op == "input":
            continue
        loop = cost.host_time(node, [nodes[i] for i in node.inputs])
        host, largest = host + loop, max(largest, loop)
        if node.op == "kernel":
            compute[node.device] += seconds[k]
        elif node.op == "reload":
            up[node.device] += node.nbytes
        elif node.op == "offload":
            down[nodes[node.inputs[0]].device] += node.nbytes
    link = max(max(u / cost.h2d_bw, d / cost.d2h_bw, (u + d) / cost.duplex_bw) for u, d in zip(up, down))
    return MakespanBound(max(compute) / max(cost.overlap_efficiency, 1.0), host - largest, link)

"""ExecGraph: the flat, integer-indexed view of a memgraph that the executor runs on.

Built once per run: vertex i is `memgraph.nodes[i]`. It holds the dependency counts, the dependents
lists, the resource class each vertex needs, its priority (critical-path cost) and its trace name, so
the event loop touches only lists of ints and never the IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnip_ir.cost import CostModel, durations
from turnip_ir.errors import InputError, KernelError
from turnip_ir.kernels import kernel
from turnip_ir.memgraph import MemGraph, MemNode

KINDS = ("compute", "h2d", "d2h", "peer")
"""Resource kinds per GPU: compute streams, the host-to-device engine (reloads), the device-to-host
engine (offloads), and the peer-in engine (moves into this GPU)."""
KIND_OF_OP = {"kernel": "compute", "reload": "h2d", "offload": "d2h", "move": "peer"}
NO_RESOURCE = -1
"""Input vertices need no resource: their data is in place before the loop starts."""


@dataclass(frozen=True)
class Lane:
    """One unit of a resource: a compute stream or a copy engine of one GPU. One vertex at a time."""

    index: int
    resource: int
    device: int
    kind: str
    slot: int

    @property
    def name(self) -> str:
        suffix = str(self.slot) if self.kind == "compute" else ""
        return f"gpu{self.device} {self.kind}{suffix}"


@dataclass
class ExecGraph:
    """Per-vertex arrays indexed by position in the memgraph's node list."""

    memgraph: MemGraph
    dep_count: list[int]
    dependents: list[list[int]]
    sources: list[list[int]]
    """Data inputs, as vertex indices."""
    resource: list[int]
    """Resource class index (device * len(KINDS) + kind), or NO_RESOURCE."""
    priority: list[float]
    """Critical-path cost from the vertex to the end of the graph, in cost-model seconds."""
    lanes: list[Lane]
    lanes_of: list[list[int]]
    """Resource class -> lane indices."""
    deps: list[list[int]] = field(default_factory=list)
    """Dependencies (data and memory) of each vertex, as vertex indices in increasing order: what a
    device backend makes a vertex wait for."""
    moves_host_data: bool = True
    """Whether the plan copies between host and GPUs during its run (any reload or offload)."""
    input_reloads: dict[str, list[int]] = field(default_factory=dict)
    """Input task -> the reload vertices that copy it from its host home (`residency.copy_limits`)."""
    durations: list[float] = field(default_factory=list, repr=False, compare=False)
    """Per vertex, `duration_cost.duration(node, sources)`: what the priorities summed, kept for the sim
    backend, which prices each vertex so under the same cost model (0.0 for inputs)."""
    duration_cost: CostModel | None = field(default=None, repr=False, compare=False)
    facts: dict = field(default_factory=dict, repr=False, compare=False)
    """What a summary reads of the plan alone (its arenas' high water, its recomputed ids), worked out
    at the first run and kept: a plan run again (a decode step) is not walked again for them."""

    def __len__(self) -> int:
        return len(self.dep_count)

    def node(self, vertex: int) -> MemNode:
        return self.memgraph.nodes[vertex]

    def name(self, vertex: int) -> str:
        """How traces and errors name a vertex: its taskgraph id plus its op."""
        node = self.memgraph.nodes[vertex]
        what = node.kernel if node.op == "kernel" else node.op
        return f"{node.task} {what}"

    def describe(self, vertex: int) -> str:
        """How errors name a vertex, the compiler's way too: `node 6 (relu 'v')` (MemNode.label)."""
        return self.memgraph.nodes[vertex].label()


def build_exec_graph(memgraph: MemGraph, streams: int = 2, cost: CostModel | None = None) -> ExecGraph:
    """Flatten `memgraph` for execution with `streams` compute streams per GPU."""
    if streams < 1:
        raise InputError(f"streams must be at least 1, got {streams}")
    index = {node.id: i for i, node in enumerate(memgraph.nodes)}
    count = len(memgraph.nodes)
    dependents: list[list[int]] = [[] for _ in range(count)]
    dep_count = [0] * count
    sources: list[list[int]] = []
    all_deps: list[list[int]] = []
    input_reloads: dict[str, list[int]] = {}
    for i, node in enumerate(memgraph.nodes):
        if node.shape is None or node.dtype is None:
            raise InputError(
                f"node {node.id} ({node.task}): no shape or dtype; give them in the memgraph, or give the inputs (--inputs)"
            )
        if node.op == "kernel":
            _check_kernel(node)
        deps = sorted({index[d] for d in node.deps()})
        if node.op == "input" and deps:
            raise InputError(f"node {node.id} ({node.task}): an input cannot have dependencies, it is in place before the run")
        assert all(d < i for d in deps), f"memgraph node {node.id} comes before one of its dependencies"
        dep_count[i] = len(deps)
        all_deps.append(deps)
        for d in deps:
            dependents[d].append(i)
        sources.append([index[d] for d in node.inputs])
        if node.op == "reload" and memgraph.nodes[sources[i][0]].op == "input":
            input_reloads.setdefault(memgraph.nodes[sources[i][0]].task, []).append(i)
    lanes, lanes_of = _lanes(memgraph.devices, streams)
    resource = [_resource_of(node, memgraph.devices) for node in memgraph.nodes]
    moves = any(node.op in ("reload", "offload") for node in memgraph.nodes)
    graph = ExecGraph(memgraph, dep_count, dependents, sources, resource, [0.0] * count, lanes, lanes_of, all_deps, moves, input_reloads)
    graph.duration_cost = cost or CostModel()
    graph.durations = durations(memgraph, graph.duration_cost)
    graph.priority = _critical_path(graph)
    return graph


def _check_kernel(node: MemNode) -> None:
    try:
        kernel(node.kernel)
    except KernelError as err:
        raise KernelError(f"node {node.id} ({node.task}): {err}") from None


def _lanes(devices: int, streams: int) -> tuple[list[Lane], list[list[int]]]:
    lanes: list[Lane] = []
    lanes_of: list[list[int]] = []
    for device in range(devices):
        for kind in KINDS:
            resource = len(lanes_of)
            slots = streams if kind == "compute" else 1
            base = len(lanes)
            lanes_of.append([base + s for s in range(slots)])
            lanes.extend([Lane(base + s, resource, device, kind, s) for s in range(slots)])
    return lanes, lanes_of


def _resource_of(node: MemNode, devices: int) -> int:
    if node.op == "input":
        return NO_RESOURCE
    if node.device is None or not 0 <= node.device < devices:
        raise InputError(f"node {node.id}: device {node.device!r} is not in [0, {devices})")
    return node.device * len(KINDS) + KINDS.index(KIND_OF_OP[node.op])


def _critical_path(graph: ExecGraph) -> list[float]:
    """Longest duration-weighted path from each vertex to a sink, computed backwards over the topological order."""
    longest = [0.0] * len(graph.durations)
    for i in range(len(longest) - 1, -1, -1):
        longest[i] = graph.durations[i] + max((longest[d] for d in graph.dependents[i]), default=0.0)
    return longest

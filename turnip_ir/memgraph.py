"""The memgraph: a taskgraph whose every tensor has a planned location, plus offloads, reloads and memory edges.

This is what the compiler writes and the runtime reads. Nodes are kept in a topological order of all
edges (data `inputs` and memory `mem_deps`). `to_json` writes the `turnip.memgraph/1` document; beyond
the contract's fields each node also carries `shape`, `dtype`, optional kernel `attrs`, and
`redundant_deps`: memory edges that a data path already implies, kept only so pictures can dash them
(the runtime ignores them). Reading and the other formats sit above this module and import it, never
the reverse: `turnip_ir.json_memgraph` (JSON), `turnip_ir.convert` (IR), `turnip_ir.io` (files).
"""

from __future__ import annotations

from bisect import bisect_left

import json
import json.encoder
from dataclasses import dataclass, field

from turnip_ir.kernels import Shape, nbytes

MEMGRAPH_FORMAT = "turnip.memgraph/1"
MEMGRAPH_OPS = ("input", "kernel", "move", "offload", "reload")


@dataclass
class MemNode:
    """One memgraph vertex."""

    id: int
    op: str
    """One of MEMGRAPH_OPS."""
    task: str
    """The taskgraph id of the tensor this node produces, or moves (offload, reload)."""
    device: int | None
    """The GPU it runs on; None only for an input that starts in CPU storage."""
    loc: tuple[int, int] | None
    """(offset, size) in its GPU's budget, written by this node; None for offload and storage inputs."""
    storage: tuple[int, int] | None
    """(offset, size) in CPU storage: written by an offload, held by a storage-resident input."""
    inputs: tuple[int, ...]
    mem_deps: tuple[int, ...] = ()
    kernel: str | None = None
    shape: Shape | None = None
    dtype: str | None = None
    attrs: dict = field(default_factory=dict)
    redundant_deps: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        if self.shape is not None and self.dtype is not None:
            return nbytes(self.shape, self.dtype)
        region = self.loc or self.storage
        return region[1] if region else 0

    def deps(self) -> tuple[int, ...]:
        """Every node that must finish before this one starts."""
        return self.inputs + self.mem_deps

    def label(self) -> str:
        """How diagnostics name the node: `node 6 (relu 'v')`."""
        return f"node {self.id} ({self.kernel or self.op} '{self.task}')"


class MemGraph:
    """A planned graph: `nodes` in topological order, a per-GPU `budget`, and the outputs' final holders."""

    def __init__(self, devices: int, budget: int):
        self.devices = devices
        self.budget = budget
        self.nodes: list[MemNode] = []
        self.outputs: dict[str, int] = {}

    def add(self, node: MemNode) -> MemNode:
        self.nodes.append(node)
        return node

    def __len__(self) -> int:
        return len(self.nodes)

    def by_id(self) -> dict[int, MemNode]:
        return {node.id: node for node in self.nodes}

    @property
    def storage_bytes(self) -> int:
        """Size of the CPU storage buffer: the end of the highest storage region."""
        return max((node.storage[0] + node.storage[1] for node in self.nodes if node.storage), default=0)

    def count(self, op: str) -> int:
        return sum(1 for node in self.nodes if node.op == op)

    def surviving_inputs(self) -> dict[str, tuple[int, int, int]]:
        """The inputs that start on a GPU and are still there, untouched, when a run ends: task ->
        (device, offset, bytes). An input survives when no other node's location overlaps its own, so
        nothing the run writes can reach it; a prepared backend may keep it for the next run (docs/runtime.md,
        "Inputs kept across runs")."""
        placed = [[] for _ in range(self.devices)]
        for node in self.nodes:
            if node.loc is not None and node.device is not None and node.op != "input" and node.loc[1] > 0:
                placed[node.device].append(node.loc)
        ends_by_device = []
        for regions in placed:
            regions.sort()
            starts, reach, top = [], [], 0
            for start, size in regions:
                top = max(top, start + size)
                starts.append(start)
                reach.append(top)  # the furthest end of any region starting at or before this one
            ends_by_device.append((starts, reach))
        kept = {}
        for node in self.nodes:
            if node.op != "input" or node.loc is None or node.device is None:
                continue
            start, size = node.loc
            starts, reach = ends_by_device[node.device]
            below = bisect_left(starts, start + size)  # regions starting before this input ends
            if below == 0 or reach[below - 1] <= start:
                kept[node.task] = (node.device, start, size)
        return kept
    def recomputes(self) -> list[MemNode]:
        """The kernel nodes that compute a task again (rematerialization): every kernel node of a task
        after its first, in node order. The compiler's `remat` writes them; a plan without it has none."""
        seen: set[str] = set()
        again = []
        for node in self.nodes:
            if node.op == "kernel":
                if node.task in seen:
                    again.append(node)
                seen.add(node.task)
        return again

    # ----- formats ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": MEMGRAPH_FORMAT,
            "devices": self.devices,
            "budget": self.budget,
            "nodes": [_node_json(node) for node in self.nodes],
            "outputs": dict(self.outputs),
        }

    def dumps(self) -> str:
        """Compact JSON, one node per line, so that big graphs stay diffable and fast to write."""
        doc = self.to_json()
        nodes = ",\n  ".join(map(_encode_compact, doc["nodes"]))
        head = {k: v for k, v in doc.items() if k not in ("nodes", "outputs")}
        text = json.dumps(head)[:-1]
        return f'{text}, "nodes": [\n  {nodes}],\n "outputs": {json.dumps(doc["outputs"])}}}\n'


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _compact_encoder():
    """`_COMPACT.encode` with json's C encoder made once. `JSONEncoder.encode` makes a new one per call,
    which for the hundreds of thousands of small nodes of a large memgraph cost as much as the encoding
    itself (docs/benchmarks.md, "Compile time", on writing the memgraph JSON).
    The nodes are trees of dicts, lists and scalars, so the circular-reference check is left out."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the C accelerator
        return _COMPACT.encode
    encoder = make(None, _COMPACT.default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda obj: "".join(encoder(obj, 0))


_encode_compact = _compact_encoder()


def _node_json(node: MemNode) -> dict:
    entry: dict = {"id": node.id, "op": node.op}
    if node.kernel is not None:
        entry["kernel"] = node.kernel
    entry["task"] = node.task
    if node.device is not None:
        entry["device"] = node.device
    if node.loc is not None:
        entry["loc"] = list(node.loc)
    if node.storage is not None:
        entry["storage"] = list(node.storage)
    entry["inputs"] = list(node.inputs)
    entry["mem_deps"] = list(node.mem_deps)
    if node.redundant_deps:
        entry["redundant_deps"] = list(node.redundant_deps)
    if node.shape is not None:
        entry["shape"] = list(node.shape)
    if node.dtype is not None:
        entry["dtype"] = node.dtype
    if node.attrs:
        entry["attrs"] = dict(node.attrs)
    return entry

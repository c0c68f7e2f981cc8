"""Device set-up: per GPU its context, arena, workspace and streams, made once and kept across runs.

`DeviceSet.open(driver, graph, scratch)` takes, per GPU, one arena of `memgraph.budget` bytes and one
workspace (`scratch` bytes per compute lane), makes one numba stream per lane of runtime/graph.py
(compute lanes, H2D, D2H and peer-in per GPU) and enables peer access between GPUs. A later memgraph runs
on the same set when `misfit` finds nothing against it: same GPUs and lanes, a budget within the arena;
one that needs more scratch grows the workspaces (`grow_scratch`: the caller keeps the arena plus the
workspace within its per-GPU budget, as `turnip.Session` does by planning every graph under one arena). The sizing rules live here too: `scratch_per_lane` (what one compute lane's workspace slice
needs) and `reserve_bytes` (what the planner must leave out of a per-GPU budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime import process_memory
from runtime.backends.cuda import attention, builders
from runtime.backends.cuda.compat import cuda
from runtime.backends.cuda.driver import GpuDriver
from runtime.backends.cuda.memory import Workspace, device_bytes, give_back
from runtime.graph import ExecGraph
from turnip_ir.memgraph import MemNode
from turnip_ir.taskgraph import attrs_key

LIBRARY_RESERVE = 4 << 20
"""Bytes per compute lane the libraries take for the lane's stream (cuBLAS's workspace on it, torch's
stream): on the H200 each lane beyond the first added at most 2 MiB with the triton provider
(docs/benchmarks.md, "What the GPU holds beside the arena"); torch's attention blocks are added per
graph, once per GPU: torch's attention runs on the GPU's one attention stream (attention.py)."""
LIBRARY_BASE = 80 << 20
"""Bytes per GPU the libraries take once, whatever the lanes (cuBLAS's handles and pool, torch's start,
module loads): on the H200 a process's first plan took 72 MiB with one lane and the triton provider,
beside the page tables (the same section)."""
PAGE_TABLE_ENTRY = 8
HOST_PAGE = 4096
"""The GPU maps page-locked host memory with an 8-byte entry per 4 KiB page, in GPU memory: 2 MiB per
GiB pinned (measured on the H200, 12-103 GiB pinned on transparent huge pages: 2.00 MiB per GiB)."""


def page_table_bytes(pinned: int) -> int:
    """GPU memory the driver's page tables take per GPU to map `pinned` bytes of page-locked host memory."""
    return -(-max(pinned, 0) // HOST_PAGE) * PAGE_TABLE_ENTRY


class DeviceSet:
    """The GPUs of a prepared backend: contexts, arenas, workspaces, streams, and lane -> GPU and slot."""

    def __init__(self, driver: GpuDriver, devices: int, budget: int, scratch: int, lanes: list):
        self.driver = driver
        self.budget = budget
        self.scratch_bytes = scratch
        self.lane_kinds = [(lane.device, lane.kind) for lane in lanes]
        self.lane_device = [lane.device for lane in lanes]
        self.slot_of = [lane.slot if lane.kind == "compute" else -1 for lane in lanes]
        self.compute = compute = sum(1 for lane in lanes if lane.device == 0 and lane.kind == "compute")
        self.contexts, self.arenas, self.workspaces, self.free_at_start = [], [], [], []
        self.streams: list = [None] * len(lanes)
        for device in range(devices):
            with driver.on(device):
                self.contexts.append(cuda.current_context())
        self.process_memory = process_memory.monitor(devices)  # before the first arena: its first reading is the contexts
        for device in range(devices):
            with driver.on(device):
                context = self.contexts[device]
                self.free_at_start.append(driver.free_memory(context))
                self.arenas.append(device_bytes(budget))
                self.workspaces.append(Workspace(compute, scratch))
                for lane in lanes:
                    if lane.device == device:
                        self.streams[lane.index] = cuda.stream()
        self.launch_streams = [driver.launch_stream(stream) for stream in self.streams]
        """What kernel launches take: cuda.core streams made once from the handles (numba's under the simulator)."""
        driver.enable_peers(self.contexts)

    @classmethod
    def open(cls, driver: GpuDriver, graph: ExecGraph, scratch: int) -> "DeviceSet":
        memgraph = graph.memgraph
        return cls(driver, memgraph.devices, memgraph.budget, scratch, graph.lanes)

    @property
    def devices(self) -> int:
        return len(self.contexts)

    def misfit(self, graph: ExecGraph) -> str | None:
        """Why `graph` cannot run on this set (a phrase), or None when it can."""
        memgraph = graph.memgraph
        if memgraph.devices != self.devices:
            return f"it uses {memgraph.devices} GPUs, the prepared backend {self.devices}"
        if [(lane.device, lane.kind) for lane in graph.lanes] != self.lane_kinds:
            return "its lanes differ from the prepared backend's (another --streams)"
        if memgraph.budget > self.budget:
            return f"its budget of {memgraph.budget} bytes exceeds the prepared arena of {self.budget}"
        return None

    def grow_scratch(self, scratch: int) -> None:
        """Make every workspace hold `scratch` bytes per compute lane when it holds less (the streams must
        be idle: the old workspace is dropped first)."""
        if scratch <= self.scratch_bytes:
            return
        for workspace in self.workspaces:  # freed before the larger ones are made: the budget holds throughout
            give_back(workspace.buffer)
        self.workspaces = []
        self.driver.collect(self.contexts)
        for device in range(self.devices):
            with self.driver.on(device):
                self.workspaces.append(Workspace(self.compute, scratch))
        self.scratch_bytes = scratch

    def scratch(self, lane: int):
        return self.workspaces[self.lane_device[lane]].slice(self.slot_of[lane])

    def synchronize(self) -> None:
        for stream in self.streams:
            if stream is not None:
                stream.synchronize()

    def library_bytes(self) -> int:
        """What the libraries took on the worst GPU beyond our two allocations since the set was made (never
        below 0: under the simulator, where the free memory is the host's, the difference can be)."""
        library = []
        for device, context in enumerate(self.contexts):
            with self.driver.on(device):
                used = self.free_at_start[device] - self.driver.free_memory(context)
            library.append(used - self.arenas[device].nbytes - self.workspaces[device].nbytes)
        return max(0, max(library, default=0))

    def drop_memory(self) -> None:
        """Give the arenas and workspaces back (`memory.give_back`): the backend is closed, its views unused."""
        for array in [*self.arenas, *(workspace.buffer for workspace in self.workspaces)]:
            give_back(array)
        self.arenas, self.workspaces = [], []

    def release(self) -> None:
        """Drop the streams too, and have the driver free what was dropped now, while every context is alive."""
        self.launch_streams = []
        self.streams = []
        self.driver.collect(self.contexts)


def scratch_per_lane(nodes, provider: str, rule=None) -> int:
    """Scratch bytes one compute lane needs: the most any kernel vertex needs (256-byte granules).

    `nodes` are memgraph nodes, or taskgraph nodes (so the budget can be split before planning);
    `provider` is a resolved attention provider; `rule` (default `builders.scratch_bytes`) says what one
    vertex needs, asked once per distinct vertex (kernel, shape, dtype, attributes and its operands': a 7b
    call's graphs repeat a few einsums thousands of times, each a GEMM plan to work out)."""
    rule = rule or builders.scratch_bytes
    nodes = [_as_op(node) for node in nodes]
    by_id = {node.id: node for node in nodes}
    need, seen = 0, set()
    for node in nodes:
        if node.kernel is None:
            continue
        sources = [by_id[s] for s in node.inputs]
        key = (_signature(node), *map(_signature, sources))
        try:
            if key in seen:
                continue
            seen.add(key)
        except TypeError:  # an unhashable attribute: asked every time
            pass
        need = max(need, rule(node, sources, provider))
    return (need + 255) // 256 * 256


def _signature(op: _Op) -> tuple:
    """What a scratch rule may read of a vertex or an operand: all but its id and its operands' ids."""
    return op.kernel, op.shape, op.dtype, op.nbytes, attrs_key(op.attrs)


def reserve_bytes(nodes, streams: int, provider: str, pinned: int = 0) -> int:
    """What to hold back from a per-GPU budget before planning the arena: per compute lane, the scratch and
    cuBLAS's pool; per GPU, what torch's attention keeps cached on its one stream (`provider` resolved),
    the libraries' base and the page tables for `pinned` bytes of page-locked host memory."""
    nodes = list(nodes)
    return streams * scratch_per_lane(nodes, provider) + library_allowance(nodes, streams, provider, pinned)


def library_allowance(nodes, streams: int, provider: str, pinned: int = 0) -> int:
    """The part of `reserve_bytes` held back for memory the backend does not allocate itself (cuBLAS's
    pools, torch's cached attention blocks, module loads, the page tables of `pinned` host bytes): what
    `DeviceSet.library_bytes` measures should stay below it."""
    blocks = scratch_per_lane(nodes, provider, rule=builders.library_bytes)  # torch's attention blocks, on one stream
    blocks *= 1 if attention.shared_stream() else streams
    torch = attention.TORCH_BASE if blocks else 0
    return LIBRARY_BASE + torch + blocks + streams * LIBRARY_RESERVE + page_table_bytes(pinned)


@dataclass(frozen=True)
class _Op:
    """What scratch rules read of a vertex, from a memgraph node or a taskgraph node alike."""

    id: object
    kernel: str | None
    inputs: tuple
    attrs: dict
    shape: tuple
    dtype: str
    nbytes: int


def _as_op(node) -> _Op:
    if isinstance(node, MemNode):
        kernel = node.kernel if node.op == "kernel" else None
    else:
        kernel = None if node.op in ("input", "move") else node.op
    return _Op(node.id, kernel, tuple(node.inputs), dict(node.attrs), tuple(node.shape), node.dtype, node.nbytes)

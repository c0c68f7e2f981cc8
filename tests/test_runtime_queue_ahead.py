"""The executor's queue-ahead mode (device backends): a fake device that enforces dependencies itself.

`FakeDevice` models what CUDA streams and events do: each lane is a FIFO; the head of a lane starts
when the lane is idle, it was submitted, and every dependency has finished on the device. The loop
may hand it a vertex whose dependencies are only submitted; the device must never run it early.
"""

from __future__ import annotations

from collections import deque

import pytest

from runtime.backends.base import Backend, Completion
from runtime.executor import Executor
from runtime.graph import build_exec_graph
from runtime.policies import make_policy
from tools.synthetic import random_memgraph
from turnip_ir.errors import KernelError
from tests.test_runtime_executor import CHAIN, _graph


class FakeDevice(Backend):
    """Virtual clock; `durations[task]` seconds per vertex (default 1)."""

    name = "fake-device"
    device_deps = True

    def __init__(self, depth=2, durations=None, fail=None, copy_depth=None):
        self.queue_depth = depth
        self.copy_depth = depth if copy_depth is None else copy_depth
        self.kind_of: dict[int, str] = {}
        self.durations = durations or {}
        self.fail = fail
        self.clock = 0.0
        self.submitted_at: dict[int, float] = {}
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.log: list[tuple[str, int]] = []

    def prepare(self, graph, inputs):
        self.graph = graph
        self.deps = [[] for _ in range(len(graph))]
        for vertex, users in enumerate(graph.dependents):
            for user in users:
                self.deps[user].append(vertex)
        self.lanes = [deque() for _ in graph.lanes]
        self.idle_at = [0.0] * len(graph.lanes)
        self.ended = {v: 0.0 for v in range(len(graph)) if graph.resource[v] < 0}

    def now(self):
        return self.clock

    def lane_depth(self, lane):
        return self.queue_depth if lane.kind == "compute" else self.copy_depth

    def submit(self, vertex, lane):
        for dep in self.deps[vertex]:  # what the executor promises a device backend
            assert dep in self.submitted_at or dep in self.ended, f"vertex {vertex} submitted before dependency {dep}"
        self.submitted_at[vertex] = self.clock
        self.kind_of[vertex] = lane.kind
        self.lanes[lane.index].append(vertex)
        self.log.append(("submit", vertex))

    def _schedule(self, lane: int) -> float | None:
        """When the head of `lane` ends, if it can start at all yet."""
        head = self.lanes[lane][0]
        if head not in self.started:
            if any(dep not in self.ended for dep in self.deps[head]):
                return None
            begin = max([self.idle_at[lane], self.submitted_at[head]] + [self.ended[d] for d in self.deps[head]])
            self.started[head] = begin
        task = self.graph.node(head).task
        return self.started[head] + self.durations.get(task, 1.0)

    def wait(self):
        ends = {lane: self._schedule(lane) for lane in range(len(self.lanes)) if self.lanes[lane]}
        ends = {lane: end for lane, end in ends.items() if end is not None}
        assert ends, "device deadlock: queued vertices wait for work that was never submitted"
        lane = min(ends, key=lambda index: (ends[index], index))
        vertex = self.lanes[lane].popleft()
        self.clock = self.idle_at[lane] = self.ended[vertex] = ends[lane]
        self.log.append(("complete", vertex))
        error = RuntimeError("boom") if self.graph.node(vertex).task == self.fail else None
        return [Completion(vertex, lane, self.started[vertex], self.clock, error)]

    def read_outputs(self):
        return {}


def _run(memgraph, order="nondet", streams=1, seed=0, **device):
    graph = build_exec_graph(memgraph, streams)
    backend = FakeDevice(**device)
    backend.prepare(graph, {})
    Executor(graph, backend, make_policy(order, graph, seed)).run()
    return backend


def _check_device_order(backend):
    for vertex, start in backend.started.items():
        for dep in backend.deps[vertex]:
            assert backend.ended[dep] <= start, f"vertex {vertex} ran before dependency {dep} finished"


@pytest.mark.parametrize("order", ["nondet", "fixed", "random"])
def test_a_dependent_chain_is_queued_before_its_head_finishes_and_runs_without_gaps(order):
    backend = _run(_graph(CHAIN), order=order, streams=2)
    _check_device_order(backend)
    position = {event: i for i, event in enumerate(backend.log)}
    assert position[("submit", 2)] < position[("complete", 1)]  # b queued while a runs
    assert backend.started[2] == backend.ended[1] and backend.started[3] == backend.ended[2]
    assert backend.clock == 3.0


def test_queue_depth_bounds_what_a_lane_holds():
    spec = [("x", "input", 0, [], [])] + [(f"k{i}", "kernel", 0, [0], []) for i in range(6)]
    backend = _run(_graph(spec), depth=2)
    holding, most = 0, 0
    for kind, _ in backend.log:
        holding += 1 if kind == "submit" else -1
        most = max(most, holding)
    assert most == 2
    assert backend.clock == 6.0


def test_copy_lanes_may_queue_deeper_than_compute_lanes():
    """Eight reloads of one stored tensor, each read by a kernel: the h2d lane holds up to its own depth."""
    spec = [("x", "input", None, [], [])]
    spec += [(f"r{i}", "reload", 0, [0], []) for i in range(8)]
    spec += [(f"k{i}", "kernel", 0, [1 + i], []) for i in range(8)]
    backend = _run(_graph(spec), depth=2, copy_depth=4)
    holding, most = {"h2d": 0, "compute": 0}, {"h2d": 0, "compute": 0}
    for event, vertex in backend.log:
        kind = backend.kind_of[vertex]
        holding[kind] += 1 if event == "submit" else -1
        most[kind] = max(most[kind], holding[kind])
    assert most == {"h2d": 4, "compute": 2}
    _check_device_order(backend)


def test_host_backends_keep_one_vertex_per_lane_and_wait_for_completion():
    class HostFake(FakeDevice):
        device_deps = False

    graph = build_exec_graph(_graph(CHAIN), 2)
    backend = HostFake(depth=4)
    backend.prepare(graph, {})
    Executor(graph, backend, make_policy("nondet", graph)).run()
    position = {event: i for i, event in enumerate(backend.log)}
    assert position[("complete", 1)] < position[("submit", 2)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("order", ["nondet", "fixed", "random"])
def test_random_memgraphs_never_run_a_vertex_before_its_dependencies(order, seed):
    memgraph = random_memgraph(seed, vertices=120, devices=2)
    backend = _run(memgraph, order=order, seed=seed, streams=2, depth=1 + seed % 3, copy_depth=1 + seed % 4)
    assert len(backend.ended) == len(memgraph.nodes)
    _check_device_order(backend)


def test_a_failure_on_a_device_lane_names_the_vertex():
    with pytest.raises(KernelError, match=r"node 2 \(relu 'b'\) failed"):
        _run(_graph(CHAIN), fail="b")


def test_the_sim_queues_compute_lanes_deeper_only_for_plans_that_move_nothing():
    """RESIDENT_QUEUE_DEPTH: a plan with no reload or offload queues its compute lanes that deep; a
    streaming plan keeps `queue_depth`; without lookahead every lane holds one vertex."""
    from passes.pipeline import compile_taskgraph
    from runtime.backends.base import RESIDENT_QUEUE_DEPTH, STREAMING_QUEUE_DEPTH
    from runtime.backends.sim import SimBackend
    from turnip_ir.taskgraph import TaskGraph

    g = TaskGraph()
    x = g.input((64, 64), "float32", id="x")
    w = [g.input((64, 64), "float32", id=f"w{i}") for i in range(4)]
    for i in range(4):
        x = g.kernel("matmul", x, w[i], id=f"y{i}")
    g.output(x)
    roomy, tight = (compile_taskgraph(g, budget) for budget in (1 << 20, 3 * 64 * 64 * 4))
    assert not any(n.op == "reload" for n in roomy.nodes) and any(n.op == "reload" for n in tight.nodes)
    for plan, depth in ((roomy, RESIDENT_QUEUE_DEPTH), (tight, STREAMING_QUEUE_DEPTH)):
        sim = SimBackend()
        graph = build_exec_graph(plan)
        sim.prepare(graph, {})
        assert {sim.lane_depth(lane) for lane in graph.lanes if lane.kind == "compute"} == {depth}
        assert {sim.lane_depth(lane) for lane in graph.lanes if lane.kind != "compute"} <= {4}
    flat = SimBackend(lookahead=False)
    flat.prepare(build_exec_graph(roomy), {})
    assert {flat.lane_depth(lane) for lane in build_exec_graph(roomy).lanes} == {1}

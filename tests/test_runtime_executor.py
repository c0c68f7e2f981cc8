"""Unit tests of the event loop's state transitions, with a synchronous fake backend on a virtual clock."""

from __future__ import annotations

import heapq

import pytest

from runtime.backends.base import Backend, Completion
from runtime.callbacks import Callback
from runtime.executor import Executor
from runtime.graph import build_exec_graph
from runtime.policies import make_policy
from turnip_ir.errors import KernelError
from turnip_ir.memgraph import MemGraph, MemNode


class FakeBackend(Backend):
    """Each vertex takes `durations[task]` virtual seconds (default 1); `wait` returns the earliest end."""

    name = "fake"

    def __init__(self, durations=None, fail=None):
        self.durations = durations or {}
        self.fail = fail
        self.clock = 0.0
        self.heap = []
        self.log = []

    def prepare(self, graph, inputs):
        self.graph = graph

    def now(self):
        return self.clock

    def submit(self, vertex, lane):
        task = self.graph.node(vertex).task
        self.log.append(("submit", task, self.clock))
        end = self.clock + self.durations.get(task, 1.0)
        heapq.heappush(self.heap, (end, vertex, lane.index, self.clock))

    def wait(self):
        end, vertex, lane, start = heapq.heappop(self.heap)
        self.clock = end
        task = self.graph.node(vertex).task
        self.log.append(("complete", task, end))
        error = RuntimeError("boom") if task == self.fail else None
        return [Completion(vertex, lane, start, end, error)]

    def read_outputs(self):
        return {}

    def started(self, task):
        return next(t for kind, name, t in self.log if kind == "submit" and name == task)


def _graph(spec, devices=2) -> MemGraph:
    """spec: (task, op, device, inputs, mem_deps) rows; ids are row numbers, every tensor 4 floats."""
    graph = MemGraph(devices, 4096)
    for i, (task, op, device, inputs, mem_deps) in enumerate(spec):
        storage = (0, 16) if op == "input" and device is None else None
        loc = None if storage else (i * 64 % 4096, 16)
        kernel = "relu" if op == "kernel" else None
        graph.add(MemNode(i, op, task, device, loc, storage, tuple(inputs), tuple(mem_deps), kernel=kernel, shape=(4,), dtype="float32"))
    return graph


def _run(memgraph, order="nondet", streams=1, seed=0, callbacks=(), **fake):
    graph = build_exec_graph(memgraph, streams)
    backend = FakeBackend(**fake)
    backend.prepare(graph, {})
    Executor(graph, backend, make_policy(order, graph, seed), callbacks).run()
    return backend


CHAIN = [("x", "input", 0, [], []), ("a", "kernel", 0, [0], []), ("b", "kernel", 0, [1], []), ("c", "kernel", 0, [0], [2])]


@pytest.mark.parametrize("order", ["nondet", "fixed", "random"])
def test_vertex_starts_only_after_data_and_memory_dependencies(order):
    backend = _run(_graph(CHAIN), order=order, streams=2)
    position = {(kind, task): i for i, (kind, task, _) in enumerate(backend.log)}
    assert position[("complete", "a")] < position[("submit", "b")]
    assert position[("complete", "b")] < position[("submit", "c")]  # c's memory dependency on b
    assert backend.clock == 3.0


def test_a_lane_runs_one_vertex_at_a_time():
    spec = [("x", "input", 0, [], []), ("a", "kernel", 0, [0], []), ("b", "kernel", 0, [0], [])]
    one = _run(_graph(spec), streams=1)
    two = _run(_graph(spec), streams=2)
    assert sorted([one.started("a"), one.started("b")]) == [0.0, 1.0]
    assert two.started("a") == two.started("b") == 0.0


def test_reload_and_offload_do_not_wait_behind_an_unrelated_kernel():
    spec = [
        ("x", "input", 0, [], []),
        ("s", "input", None, [], []),
        ("long", "kernel", 0, [0], []),
        ("r", "reload", 0, [1], []),
        ("o", "offload", 0, [0], []),
        ("use", "kernel", 0, [3], []),
    ]
    memgraph = _graph(spec)
    memgraph.nodes[4].loc, memgraph.nodes[4].storage = None, (64, 16)
    backend = _run(memgraph, order="fixed", durations={"long": 10.0})
    assert backend.started("r") == 0.0
    assert backend.started("o") == 0.0
    assert backend.started("use") == 10.0  # its only stream is busy with "long"


# The seed's example: "ka" needs a slow move, "kb" a local tensor, and the memgraph lists ka first.
LATE_INPUT = [
    ("x", "input", 1, [], []),
    ("m", "move", 0, [0], []),
    ("y", "input", 0, [], []),
    ("ka", "kernel", 0, [1], []),
    ("kb", "kernel", 0, [2], []),
]


def test_fixed_waits_for_the_head_of_its_resource_and_nondet_does_not():
    fixed = _run(_graph(LATE_INPUT), order="fixed", durations={"m": 5.0})
    nondet = _run(_graph(LATE_INPUT), order="nondet", durations={"m": 5.0})
    assert (fixed.started("ka"), fixed.started("kb"), fixed.clock) == (5.0, 6.0, 7.0)
    assert (nondet.started("kb"), nondet.started("ka"), nondet.clock) == (0.0, 5.0, 6.0)


# Two reloads ready at once: "ra" for the kernel the plan runs first, "rb" for one that heads a long
# chain (the longer critical path). Issue 26: the critical path sent the chain's reload first and held
# the plan's first kernel back behind it.
FIRST_NEEDED = [
    ("sa", "input", None, [], []),
    ("sb", "input", None, [], []),
    ("ra", "reload", 0, [0], []),
    ("rb", "reload", 0, [1], []),
    ("ka", "kernel", 0, [2], []),
    ("kb", "kernel", 0, [3], []),
    ("kc", "kernel", 0, [5], []),
    ("kd", "kernel", 0, [6], []),
]


def test_nondet_sends_first_the_copy_the_earliest_kernel_needs():
    graph = build_exec_graph(_graph(FIRST_NEEDED), streams=2)
    assert graph.priority[3] > graph.priority[2]  # the chain's reload has the longer critical path
    nondet = _run(_graph(FIRST_NEEDED), order="nondet", streams=2)
    assert (nondet.started("ra"), nondet.started("rb"), nondet.started("ka"), nondet.started("kb")) == (0.0, 1.0, 1.0, 2.0)
    assert nondet.clock == 5.0


def test_nondet_keeps_a_free_copy_engine_busy_with_whatever_copy_is_ready():
    spec = [FIRST_NEEDED[1], FIRST_NEEDED[0], ("ka", "kernel", 0, [], []), ("ra", "reload", 0, [1], [2]), ("rb", "reload", 0, [0], []),
            ("kb", "kernel", 0, [3, 4], [])]
    nondet = _run(_graph(spec), order="nondet", streams=1, durations={"ka": 3.0})
    fixed = _run(_graph(spec), order="fixed", streams=1, durations={"ka": 3.0})
    assert nondet.started("rb") == 0.0 and nondet.started("ra") == 3.0  # "ra" waits for "ka" (a memory edge); "rb" does not wait for "ra"
    assert fixed.started("rb") == 4.0


def test_random_order_depends_on_its_seed():
    spec = [("x", "input", 0, [], [])] + [(f"k{i}", "kernel", 0, [0], []) for i in range(8)]
    orders = {tuple(t for kind, t, _ in _run(_graph(spec), order="random", seed=s).log if kind == "submit") for s in range(6)}
    assert len(orders) > 1


class Hooks(Callback):
    def __init__(self):
        self.events = []

    def start(self, graph):
        self.events.append("start")

    def vertex_start(self, vertex, lane, time):
        self.events.append(("start", vertex))

    def vertex_end(self, completion):
        self.events.append(("end", completion.vertex))

    def finish(self, graph, failed):
        self.events.append(("finish", failed))


def test_callbacks_see_every_running_vertex_but_not_inputs():
    hooks = Hooks()
    _run(_graph(CHAIN), callbacks=[hooks])
    assert hooks.events[0] == "start" and hooks.events[-1] == ("finish", False)
    assert [e for e in hooks.events if e[0] == "start" and e != "start"] == [("start", 1), ("start", 2), ("start", 3)]
    assert ("start", 0) not in hooks.events


def test_a_failing_vertex_stops_the_run_and_is_named():
    hooks = Hooks()
    with pytest.raises(KernelError, match=r"node 1 \(relu 'a'\) failed: RuntimeError: boom"):
        _run(_graph(CHAIN), callbacks=[hooks], fail="a")
    assert hooks.events[-1] == ("finish", True)
    assert ("start", 2) not in hooks.events


def test_cpu_arenas_are_sized_by_the_plans_peak_not_the_budget():
    """Issue 27 item 8: a 1 TiB budget must not allocate 1 TiB; each arena ends at its highest location."""
    import numpy as np
    from runtime_plans import naive_memgraph

    from runtime.api import execute
    from runtime.backends.cpu import CpuBackend
    from runtime.host_memory import arena_peaks
    from tools.random_graphs import random_taskgraph

    memgraph = naive_memgraph(random_taskgraph(2, tasks=20))
    memgraph.budget = 1 << 40
    backend = CpuBackend()
    execute(memgraph, backend)
    peaks = arena_peaks(memgraph)
    assert [len(arena) for arena in backend.arenas] == peaks
    assert peaks == [max(n.loc[0] + n.loc[1] for n in memgraph.nodes if n.loc and n.device == d) for d in range(2)]
    assert all(isinstance(arena, np.ndarray) for arena in backend.arenas)


def test_host_memory_past_what_is_available_is_refused_naming_the_bytes():
    from runtime.host_memory import check_host_memory, zeros
    from turnip_ir.errors import InputError

    check_host_memory(1000, "the arenas", "fix it", available=1000)
    with pytest.raises(InputError, match=r"^the run needs 1001 bytes \(1001 B\) of host memory for the arenas, but only 1000 bytes .*: fix it$"):
        check_host_memory(1001, "the arenas", "fix it", available=1000)
    with pytest.raises(InputError, match=r"^cannot allocate 4611686018427387904 bytes \(4294967296.00 GiB\) of host memory for the storage$"):
        zeros(1 << 62, "the storage")


def test_drawing_inputs_past_host_memory_is_refused_before_drawing():
    """Issue 27 item 9: the inputs a run draws count too (a 4 TiB input failed inside numpy)."""
    from runtime.inputs import make_inputs
    from turnip_ir.errors import InputError

    with pytest.raises(InputError, match=r"^the run needs 13194139533312 bytes \(.*\) of host memory for drawing the missing inputs"):
        make_inputs({"x": ((1 << 20, 1 << 20), "float32")}, None, 0)
    assert make_inputs({"x": ((2, 3), "float32")}, None, 0)["x"].shape == (2, 3)


def test_execute_with_close_false_runs_several_memgraphs_on_one_cpu_backend():
    """Prepare once, run many: the workers are kept, an arena grows only when a later plan needs more,
    outputs equal a fresh backend's."""
    import numpy as np

    from passes.insert_offload import minimum_budget
    from passes.pipeline import compile_taskgraph
    from passes.place_devices import place_devices
    from runtime import execute
    from runtime.backends.cpu import CpuBackend
    from tools.random_graphs import random_taskgraph

    graphs = [random_taskgraph(seed, tasks=10, devices=1, sizes=sizes) for seed, sizes in ((4, (8, 16)), (5, (4, 8)), (6, (16, 32)))]
    backend = CpuBackend()
    threads, sizes = [], []
    try:
        for graph in graphs:
            memgraph = compile_taskgraph(graph, int(minimum_budget(place_devices(graph, 0)) * 1.3) // 256 * 256 + 256)
            got = execute(memgraph, backend=backend, order="random", inputs=None, close=False).outputs
            want = execute(memgraph, backend="cpu", order="random", inputs=None).outputs
            for task in want:
                np.testing.assert_allclose(got[task], want[task], rtol=1e-6)
            threads.append(list(backend.threads))
            sizes.append(len(backend.arenas[0]))
    finally:
        backend.close()
    assert threads[0] == threads[1] == threads[2] and all(t.is_alive() is False for t in threads[0])
    assert sizes[1] == sizes[0] and sizes[2] > sizes[0]  # the small plan reuses the arena, the large one grows it


def test_every_run_starts_with_the_backends_run_starts_prepared_or_not():
    """A prepared backend runs its graph again without `prepare` (bench/cuda_common.py's loops): the
    executor tells it each run's start (`Backend.run_starts`), where the cuda backend drops what it kept
    from the last run's values."""

    class Counting(FakeBackend):
        starts = 0

        def run_starts(self):
            self.starts += 1
            self.log.append(("run starts", None, self.clock))

    graph = build_exec_graph(_graph(CHAIN), 1)
    backend = Counting()
    backend.prepare(graph, {})
    for run in range(3):
        Executor(graph, backend, make_policy("nondet", graph, run), []).run()
    assert backend.starts == 3
    assert [entry[0] for entry in backend.log][:2] == ["run starts", "submit"]
    assert [entry[0] for entry in backend.log].count("run starts") == 3

"""The sim backend's deadline: a run that cannot end within it stops early, one that can is exact."""

from __future__ import annotations

import math

import pytest

from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from runtime import execute, sim_makespan
from runtime.backends.sim import DeadlinePassed, SimBackend


@pytest.fixture(scope="module")
def plan():
    """A tiny llama prefill that offloads and reloads (about 230 vertices), with its full makespan."""
    memgraph = compile_taskgraph(llama.build_llama(llama.load_config("tiny"), 256).graph, 192 << 10)
    assert memgraph.count("reload") > 0
    return memgraph, sim_makespan(memgraph)


def test_a_run_past_its_deadline_stops_and_one_within_it_is_exact(plan):
    memgraph, full = plan
    assert sim_makespan(memgraph, deadline=lambda: full / 2) == math.inf
    assert sim_makespan(memgraph, deadline=lambda: full * 0.99) in (math.inf, full)  # near the end it may run out
    for deadline in (full, full * 1.5, math.inf):
        assert sim_makespan(memgraph, deadline=lambda: deadline) == full


def test_a_stopped_run_does_less_work_and_says_which_deadline_it_passed(plan):
    memgraph, full = plan
    reads = {"full": 0, "half": 0}

    def deadline(name: str, seconds: float):
        def read() -> float:
            reads[name] += 1
            return seconds
        return read

    assert sim_makespan(memgraph, deadline=deadline("full", math.inf)) == full
    assert sim_makespan(memgraph, deadline=deadline("half", full / 10)) == math.inf
    assert 0 < reads["half"] < reads["full"] / 4  # read once per wait: the run stopped near a tenth of the way
    with pytest.raises(DeadlinePassed) as stopped:
        execute(memgraph, backend=SimBackend(deadline=lambda: full / 3), verify=False)
    assert stopped.value.deadline == full / 3


def test_the_deadline_is_read_as_the_run_goes(plan):
    """A deadline another process lowers mid-run (a better plan found meanwhile) stops the run."""
    memgraph, full = plan
    reads = []

    def falling() -> float:
        reads.append(1)
        return math.inf if len(reads) < 20 else full / 2

    assert sim_makespan(memgraph, deadline=falling) == math.inf

"""`makespan_bound` (of a taskgraph) and `plan_bound` (of its plan) never exceed the sim's makespan of a plan,
whatever the budget, order, block or GPUs, and are near it where nothing binds; `link_floor` (before any
build) never exceeds the built graph's bound."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontend.workloads import llama
from frontend.program import Program
from passes.pipeline import compile_taskgraph
from runtime import sim_makespan
from turnip.bounds import makespan_bound, plan_bound
from turnip.candidates import Candidate, LlamaPrefill
from turnip.search import attention_links, link_floor
from turnip_ir.cost import CostModel, durations
from turnip_ir.errors import BudgetError

TINY = llama.load_config("tiny")
HALF = replace(TINY, dtype="float16", name="tiny-half")  # attention links priced with the loop's torch launch
CASES = [
    (LlamaPrefill(TINY, 256), Candidate("blocks", 64, 1, "given")),
    (LlamaPrefill(TINY, 256), Candidate("halves", 128, 2, "memory")),
    (LlamaPrefill(HALF, 512), Candidate("blocks", 128, 1, "dfs")),
    (LlamaPrefill(HALF, 512), Candidate("halves", 64, 4, "given")),
    (LlamaPrefill(llama.load_config("tiny-gqa"), 200, gpus=2, placement="heads"), Candidate("blocks", 50, 1, "given")),
    (LlamaPrefill(HALF, 384, gpus=2, placement="zigzag"), Candidate("halves", 96, 2, "given")),
]


@pytest.mark.parametrize("prefill, candidate", CASES)
@pytest.mark.parametrize("budget, remat", [(96 << 10, False), (160 << 10, True), (1 << 20, False), (1 << 30, False)])
def test_no_plan_runs_faster_than_its_bound(prefill, candidate, budget, remat):
    graph = prefill.build(candidate).graph
    try:
        memgraph = compile_taskgraph(graph, budget, candidate.schedule, remat=remat)
    except BudgetError:
        pytest.skip("does not fit")
    bound, makespan = makespan_bound(graph, budget), sim_makespan(memgraph)
    assert bound.seconds <= makespan * (1 + 1e-9)
    assert makespan_bound(graph, budget, inputs="host").link >= bound.link
    planned = plan_bound(memgraph)
    assert planned.seconds <= makespan * (1 + 1e-9)
    assert planned.compute >= bound.compute * (1 - 1e-9) and planned.host >= bound.host * (1 - 1e-9)
    assert planned.link >= bound.link * (1 - 1e-9)


def test_where_nothing_binds_the_bound_is_near_the_makespan():
    """At 1 GiB every tensor of these graphs fits: the plan moves nothing and the loop or the kernels set
    the pace, each of which the bound counts."""
    for prefill, candidate in CASES:
        graph = prefill.build(candidate).graph
        memgraph = compile_taskgraph(graph, 1 << 30, candidate.schedule)
        assert memgraph.count("reload") + memgraph.count("offload") == 0
        assert sim_makespan(memgraph) <= 1.05 * makespan_bound(graph, 1 << 30).seconds, (prefill.config.name, candidate)


def test_the_link_floor_counts_inputs_beyond_the_arena():
    cost = CostModel()
    graph = LlamaPrefill(TINY, 256).build(Candidate("blocks", 64, 1, "given")).graph
    inputs = sum(node.nbytes for node in graph.nodes.values() if node.op == "input")
    assert makespan_bound(graph, inputs).link == 0.0
    assert makespan_bound(graph, inputs - 55_400).link == pytest.approx(55_400 / cost.h2d_bw)


@pytest.mark.parametrize("prefill, candidate", CASES)
def test_the_attention_floor_before_the_build_is_below_the_built_graphs_loop_time(prefill, candidate):
    cost = CostModel()
    floor = link_floor(prefill, candidate, cost)
    blocks = -(-prefill.tokens // candidate.block)
    links = sum(1 for node in prefill.build(candidate).graph.nodes.values() if node.op == "attention")
    assert links >= prefill.config.num_hidden_layers * blocks * (blocks + 1) // 2
    assert 0 < floor <= makespan_bound(prefill.build(candidate).graph, 1 << 30, cost).host * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 48), st.booleans(), st.booleans())
def test_the_attention_links_counted_before_the_build_are_the_built_graphs(lengths, block, packed, hidden):
    """Packed prompts (a session's prefill: a block of whole prompts links to itself alone), or one sequence,
    with or without the last layer's attention."""
    config = replace(TINY, num_hidden_layers=2)
    prefill = LlamaPrefill(config, sum(lengths), kv_outputs=True, sequences=tuple(lengths) if packed else None, hidden=hidden)
    graph = prefill.build(Candidate("blocks", block, 1, "given")).graph
    assert attention_links(prefill, block) == sum(1 for node in graph.nodes.values() if node.op == "attention")


def test_a_sliding_window_has_no_attention_floor():
    windowed = LlamaPrefill(replace(TINY, sliding_window=16), 256)
    assert link_floor(windowed, Candidate("blocks", 32, 1, "given"), CostModel()) == 0.0


def test_a_plan_that_copies_much_is_bound_by_its_link():
    """Weights reloaded per token block under a tight budget: the plan's copies bound it, its taskgraph's do not."""
    prefill, candidate = LlamaPrefill(HALF, 512), Candidate("blocks", 64, 1, "dfs")
    graph = prefill.build(candidate).graph
    memgraph = compile_taskgraph(graph, 96 << 10, candidate.schedule)
    planned, makespan = plan_bound(memgraph), sim_makespan(memgraph)
    assert planned.link > makespan_bound(graph, 96 << 10).link
    assert planned.link <= makespan * (1 + 1e-9)


@pytest.mark.parametrize("prefill, candidate", CASES[:3])
def test_the_search_shortcuts_change_no_figure(prefill, candidate):
    """What a search candidate skips (the shape check of the compiler's own plan, the vertices priced twice)
    leaves the sim's makespan and the plan's bound as they were."""
    graph = prefill.build(candidate).graph
    memgraph = compile_taskgraph(graph, 1 << 20, candidate.schedule)
    cost = CostModel()
    assert sim_makespan(memgraph, cost=cost, compiled=True) == sim_makespan(memgraph, cost=cost)
    by_id = memgraph.by_id()
    compute = sum(cost.kernel_time(n, [by_id[i] for i in n.inputs]) for n in memgraph.nodes if n.op == "kernel")
    assert plan_bound(memgraph, cost).compute == pytest.approx(compute / max(cost.overlap_efficiency, 1.0))
    slower = replace(cost, launch=cost.launch * 10)  # another cost model: priced anew, not read from the first
    assert durations(memgraph, slower) != durations(memgraph, cost)
    assert durations(memgraph, CostModel()) is durations(memgraph, cost)


def test_a_one_gpu_program_does_not_ask_its_placement():
    def refuse(site):
        raise AssertionError(f"asked where {site.op} goes")

    def product(gpus: int) -> None:
        prog = Program(gpus, placement=refuse)
        x, w = prog.input("x", (64, 32), "float32", (2,)), prog.input("w", (32, 16), "float32")
        prog.einsum("ik,kj->ij", x, w, name="y")

    product(1)  # one GPU: nothing to ask
    with pytest.raises(AssertionError, match="asked where y goes"):
        product(2)

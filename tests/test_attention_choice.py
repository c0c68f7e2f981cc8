"""`--attention auto` chooses the provider with the plan: each candidate (torch-cudnn, triton) is planned at
its own arena (its workspace differs) and ranked by the sim at its own attention rate
(`CostModel.for_attention`); a later candidate wins only by `PROVIDER_MARGIN`, and one whose workspace
leaves no arena drops out (runtime.api, `plan_choosing_attention`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from runtime import sim_makespan
from runtime.api import PROVIDER_MARGIN, arena_budget, plan_choosing_attention, plan_within
from turnip_ir.cost import CostModel
from turnip_ir.errors import BudgetError
from turnip_ir.verifier import verify_memgraph

MIB = 1 << 20
CANDIDATES = ("torch-cudnn", "triton")


@pytest.fixture(scope="module")
def graph():
    """A fp16 llama small enough to plan in a fraction of a second and large enough that triton's smaller
    workspace (80 MiB less at this block) is a fifth of the arena at the tight budgets below."""
    config = replace(llama.load_config("7b"), num_hidden_layers=4, hidden_size=2048, intermediate_size=5504,
                     num_attention_heads=16, num_key_value_heads=16)
    return llama.build_llama(config, 8192, 2048, gpus=1, placement="sequence", layer_order="halves").graph


def choose(graph, budget_mib: int, **options):
    return plan_choosing_attention(graph, budget_mib * MIB, lambda arena: compile_taskgraph(graph, arena, inputs="host"), "cuda",
                                   candidates=CANDIDATES, **options)


def test_triton_costs_its_own_attention_rate_and_nothing_else_changes():
    cost = CostModel()
    triton = cost.for_attention("triton")
    assert triton.attention_flops == cost.triton_attention_flops < cost.attention_flops
    assert triton.causal_attention_flops == cost.triton_causal_attention_flops < cost.causal_attention_flops
    assert cost.batched_segments and not triton.batched_segments  # its kernel takes one sequence at a time
    assert replace(triton, attention_flops=cost.attention_flops, causal_attention_flops=cost.causal_attention_flops,
                   batched_segments=True) == cost
    assert cost.for_attention("torch-cudnn") is cost and cost.for_attention("cublas") is cost


@pytest.mark.parametrize("budget_mib", [250, 300])
def test_a_tight_budget_takes_triton_whose_smaller_workspace_leaves_a_larger_arena(graph, budget_mib):
    choice = choose(graph, budget_mib)
    assert choice.provider == "triton" and set(choice.scores) == set(CANDIDATES)
    assert choice.scores["triton"] * (1 + PROVIDER_MARGIN) < choice.scores["torch-cudnn"]
    assert choice.memgraph.budget == arena_budget(graph, budget_mib * MIB, "cuda", attention="triton")
    assert choice.memgraph.budget > arena_budget(graph, budget_mib * MIB, "cuda", attention="torch-cudnn")
    verify_memgraph(choice.memgraph)
    # the score is the sim of the plan returned at triton's rate, whose attention links take longer
    triton = CostModel().for_attention("triton")
    assert choice.scores["triton"] == sim_makespan(choice.memgraph, cost=triton)
    nodes = choice.memgraph.nodes
    link = next(n for n in nodes if n.op == "kernel" and n.kernel == "attention")
    sources = [nodes[i] for i in link.inputs]
    assert triton.kernel_time(link, sources) > CostModel().kernel_time(link, sources)


@pytest.mark.parametrize("budget_mib", [500, 1024])
def test_a_loose_budget_keeps_torch_cudnn_unless_triton_wins_by_the_margin(graph, budget_mib):
    choice = choose(graph, budget_mib)
    assert choice.provider == "torch-cudnn"
    assert choice.scores["triton"] * (1 + PROVIDER_MARGIN) >= choice.scores["torch-cudnn"]
    assert choice.memgraph.budget == arena_budget(graph, budget_mib * MIB, "cuda", attention="torch-cudnn")


def test_a_candidate_that_does_not_fit_drops_out(graph):
    with pytest.raises(BudgetError):  # torch-cudnn's arena is too small for the largest step's operands
        plan_within(graph, 170 * MIB, lambda arena: compile_taskgraph(graph, arena, inputs="host"), "cuda", attention="torch-cudnn")
    choice = choose(graph, 170)
    assert choice.provider == "triton" and choice.scores == {}
    with pytest.raises(BudgetError, match="cuda workspace"):  # none fits: the first candidate's error
        choose(graph, 20)


def test_the_first_candidates_plan_given_is_not_planned_again(graph):
    arena = arena_budget(graph, 1024 * MIB, "cuda", attention="torch-cudnn")
    given = compile_taskgraph(graph, arena, inputs="host")
    choice = choose(graph, 1024, planned=(given, False))
    assert choice.provider == "torch-cudnn" and choice.memgraph is given


def test_a_named_provider_or_another_backend_is_planned_once_without_ranking(graph):
    named = plan_choosing_attention(graph, 300 * MIB, lambda arena: compile_taskgraph(graph, arena, inputs="host"), "cuda",
                                    attention="torch-cudnn")
    assert named.provider == "torch-cudnn" and named.scores == {}
    assert named.memgraph.budget == arena_budget(graph, 300 * MIB, "cuda", attention="torch-cudnn")
    cpu = plan_choosing_attention(graph, 300 * MIB, lambda arena: compile_taskgraph(graph, arena, inputs="host"), "cpu")
    assert cpu.provider == "" and cpu.scores == {} and cpu.memgraph.budget == 300 * MIB


@pytest.mark.skipif("not __import__('runtime.backends.cuda', fromlist=['simulated']).simulated()")
@pytest.mark.parametrize("command", ["llama", "run"])
def test_the_commands_print_autos_choice_and_run_with_it(tmp_path, capsys, monkeypatch, command):
    """Under numba's simulator `auto` has one candidate (cublas); with a second one given, `turnip llama` and
    `turnip run` rank both, print the choice on one line, and the backend runs with the provider chosen."""
    from runtime.backends.cuda import CudaBackend
    from turnip_cli.main import main as turnip

    monkeypatch.setattr(CudaBackend, "attention_candidates", staticmethod(lambda provider="auto": ("cublas", "torch-cudnn")))
    chosen = []
    choose_attention = CudaBackend.choose_attention
    monkeypatch.setattr(CudaBackend, "choose_attention", lambda self, provider: (chosen.append(provider), choose_attention(self, provider)))
    if command == "llama":
        args = ["llama", "--config", "tiny", "--tokens", "24", "--memory", "96MiB", "--backend", "cuda"]
    else:
        assert turnip(["build", "llama", "--config", "tiny", "--tokens", "24", "-o", str(tmp_path / "g.json")]) == 0
        args = ["run", str(tmp_path / "g.json"), "--memory", "96MiB", "--backend", "cuda"]
    capsys.readouterr()
    assert turnip(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("attention auto:"))
    assert line.startswith("attention auto: cublas (sim predictions: cublas ") and ", torch-cudnn " in line
    assert chosen == ["cublas"] and "attention cublas" in out


def test_triton_is_found_without_importing_it_and_one_that_does_not_import_fails_in_one_line(monkeypatch):
    """`auto` ranks triton's plan where triton is installed (`have_triton`, a spec lookup: the run that takes
    torch-cudnn pays no import); an install that does not import is a KernelError when its kernel is asked."""
    import importlib.util
    import sys

    from runtime.backends.cuda import attention, attention_triton
    from turnip_ir.errors import KernelError

    assert attention.have_triton() == (importlib.util.find_spec("triton") is not None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else object())
    assert not attention.have_triton()
    monkeypatch.setitem(sys.modules, "runtime.backends.cuda.attention_triton_kernel", None)  # its import fails
    attention_triton.kernel.cache_clear()
    try:
        with pytest.raises(KernelError, match="attention provider 'triton': triton is installed but does not import"):
            attention_triton.kernel()
    finally:
        attention_triton.kernel.cache_clear()

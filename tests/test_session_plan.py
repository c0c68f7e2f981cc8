"""A session's prefills get the plan turnip/choose.py chooses for them at the session's arena (layer order,
token block, query group and schedule), once per arena and shape, kept on disk across sessions; a
`prefill_plan` forces dimensions or keeps the frontend's defaults, and the cpu backend keeps them unless
asked. A chosen plan computes what the default plan computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from frontend.workloads import llama
from runtime import arena_budget
from turnip import Session
from turnip.candidates import Candidate, LlamaPrefill, PlanTarget
from turnip.choose import choose_llama_plan
from turnip_ir.errors import BudgetError
from turnip_ir.verifier import verify_memgraph

sys.path.insert(0, str(Path(__file__).parent))
from test_choose import plain_search  # noqa: E402

TINY = llama.load_config("tiny")
KIB = 1 << 10
LENGTHS = (61, 71, 31, 97)
"""Prompts whose packed prefill (60, 70, 30 and 96 tokens) the budget below binds: layers in halves and
blocks of 128 win, 1.9x faster in the sim than the defaults."""
MEMORY = 320 * KIB
DEFAULT = {"layer_order": None, "block": None, "query_group": None, "schedule": None}


def prompts(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, TINY.vocab_size, n) for n in lengths]


def packed(lengths=LENGTHS) -> LlamaPrefill:
    sequences = tuple(n - 1 for n in lengths)
    return LlamaPrefill(TINY, sum(sequences), kv_outputs=True, sequences=sequences, hidden=False)


def test_a_sessions_packed_prefill_gets_the_plain_searchs_plan():
    expected, makespan = plain_search(packed(), PlanTarget(MEMORY, arena=MEMORY))
    default = choose_llama_plan(packed(), PlanTarget(MEMORY, arena=MEMORY), DEFAULT).candidate
    assert expected != default  # the budget binds: the choice is not the defaults
    with Session(config="tiny", memory=MEMORY, backend="sim") as session:
        result = session.generate(prompts(), 2)
        [chosen] = result.prefill_plans
        assert (chosen.candidate, chosen.how, chosen.makespan) == (expected, "searched", makespan)
        assert chosen.seconds <= result.compile_seconds  # the search is the call's set-up
        built = session._prefill_graph(packed())
        assert (built.block, built.layer_order, built.query_group) == (expected.block, expected.layer_order, expected.query_group)
        memgraph = next(plan for key, plan in session.cache.items() if key[0] == "prefill")
        verify_memgraph(memgraph, built.graph)
        assert memgraph.budget == session.arena
        # the same prompts again: neither chosen nor compiled again
        again = session.generate(prompts(seed=1), 2)
        assert again.prefill_plans == [] and again.compiles == 0
        assert session.prefill_plans == [chosen]
        # prompts alike (as many tokens and as long a prompt, to within a power of two): the choice taken
        [alike] = session.generate(prompts((60, 70, 33, 95)), 2).prefill_plans
        assert (alike.candidate, alike.how, alike.tokens) == (expected, "alike", 254)
        # others: chosen for themselves
        [other] = session.generate(prompts((200, 40)), 2).prefill_plans
        assert other.how in ("searched", "unbound") and other.tokens == 238


def test_a_choice_is_kept_across_sessions_and_a_plan_folder_keeps_the_plan(tmp_path, monkeypatch):
    """In the user's cache, and with a plan folder there too, beside the plan."""
    with Session(config="tiny", memory=MEMORY, backend="sim", plan_dir=tmp_path / "plans") as first:
        chosen = first.generate(prompts(), 1).prefill_plans[0]
    with Session(config="tiny", memory=MEMORY, backend="sim") as second:  # no plan folder: the user's cache
        [kept] = second.generate(prompts(seed=2), 1).prefill_plans
        assert (kept.candidate, kept.how) == (chosen.candidate, "kept")
    monkeypatch.setenv("TURNIP_CACHE", str(tmp_path / "empty"))  # another user's cache: the plan folder alone
    with Session(config="tiny", memory=MEMORY, backend="sim", plan_dir=tmp_path / "plans") as third:
        result = third.generate(prompts(seed=3), 1)
        [kept] = result.prefill_plans
        assert (kept.candidate, kept.how) == (chosen.candidate, "kept")
        assert result.compiles == 0 and result.plans_read == 2  # the prefill's plan and the decode step's
    with Session(config="tiny", memory=MEMORY, backend="sim") as fourth:  # written where it was read from: not here
        assert fourth.generate(prompts(), 1).prefill_plans[0].how == "searched"
    with Session(config="tiny", memory=MEMORY, backend="sim") as fifth:
        assert fifth.generate(prompts(), 1).prefill_plans[0].how == "kept"


def test_the_defaults_forced_dimensions_and_the_cpu_backend():
    default = packed().start({})
    with Session(config="tiny", memory=MEMORY, backend="sim", prefill_plan="default") as session:
        assert session.generate(prompts(), 1).prefill_plans == []
        assert session._prefill_choices[packed()] == default
    with Session(config="tiny", memory=MEMORY, backend="sim", prefill_plan={"layer_order": "blocks", "block": 32}) as session:
        [chosen] = session.generate(prompts(), 1).prefill_plans
        assert (chosen.candidate.layer_order, chosen.candidate.block) == ("blocks", 32)
        assert chosen.how == "searched"  # the query group and schedule
    with Session(config="tiny", memory=MEMORY, backend="sim", schedule="dfs") as session:  # a session's schedule is every plan's
        [chosen] = session.generate(prompts(), 1).prefill_plans
        assert chosen.candidate.schedule == "dfs"
    with Session(config="tiny", memory=MEMORY, backend="cpu") as session:  # the sim does not predict the cpu backend
        assert session.generate(prompts(), 1).prefill_plans == []
        assert session._prefill_choices[packed()] == default


def test_a_chosen_plan_computes_what_the_default_computes():
    """On the cpu backend, asked to choose (the plan the sim picks differs from the defaults): the same
    tokens, and Session.prefill's hidden states alike."""
    every = {"layer_order": "auto", "block": "auto", "query_group": "auto", "schedule": "auto"}
    with Session(config="tiny", memory=MEMORY, backend="cpu", prefill_plan="default") as plain, \
            Session(config="tiny", memory=MEMORY, backend="cpu", prefill_plan=every) as chosen:
        expected, result = plain.generate(prompts(), 3), chosen.generate(prompts(), 3)
        assert result.prefill_plans[0].candidate != packed().start({})
        assert (result.tokens == expected.tokens).all()
        ids = prompts((200,))[0]
        hidden = chosen.prefill(ids)
        assert chosen.prefill_plans[-1].tokens == 200
        np.testing.assert_allclose(hidden, plain.prefill(ids), rtol=1e-4, atol=1e-5)


def test_a_fixed_arena_refuses_a_candidate_whose_workspace_leaves_less():
    """The session's backend is prepared for its arena: a candidate that needs a larger cuda workspace
    does not fit it, whatever the sim would say of it."""
    config = llama.load_config("7b")
    prefill = LlamaPrefill(config, 8192, kv_outputs=True, sequences=(4096, 4096), hidden=False)
    small, large = (prefill.build(Candidate("blocks", block, 1, "given")).graph for block in (1024, 8192))
    target = PlanTarget(2 << 30, "cuda").resolved()
    arena = arena_budget(small, target.memory, "cuda", attention=target.attention)
    assert arena_budget(large, target.memory, "cuda", attention=target.attention) < arena  # its attention needs more room
    fixed = PlanTarget(target.memory, "cuda", target.attention, arena=arena)
    assert fixed.arena_of(small) == arena
    with pytest.raises(BudgetError, match="less than the arena"):
        fixed.arena_of(large)


def test_turnip_generate_states_the_prefill_plan_and_its_flag_forces_one(tmp_path, capsys):
    from turnip_cli.main import main

    ids = tmp_path / "prompts.npz"
    np.savez(ids, **{f"p{b}": prompt for b, prompt in enumerate(prompts())})
    base = ("generate", "--config", "tiny", "--memory", str(MEMORY), "--backend", "sim", "--input-ids", str(ids), "--max-new-tokens", "1")
    assert main([*base]) == 0
    chosen = [line for line in capsys.readouterr().out.splitlines() if line.startswith("prefill plan")]
    assert chosen == [f"prefill plan for 256 tokens: {Candidate('halves', 128, 1, 'given').describe()} (searched, "
                      + chosen[0].split("(searched, ")[1]]
    assert main([*base, "--prefill-plan", "block=64,layer_order=blocks,query_group=1,schedule=dfs"]) == 0
    assert "prefill plan" not in capsys.readouterr().out  # all four forced: nothing chosen
    assert main([*base, "--prefill-plan", "default"]) == 0
    assert "prefill plan" not in capsys.readouterr().out
    for bad, words in (("block=big", "block must be a positive integer or auto, got 'big'"), ("rows=2", "unknown dimension 'rows'"),
                       ("block", "must be auto, default or NAME=VALUE pairs")):
        with pytest.raises(SystemExit) as ended:
            main([*base, "--prefill-plan", bad])
        assert ended.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert words in err[-1] and "Traceback" not in "".join(err)


def test_prefills_alike_round_tokens_longest_prompt_and_count_up_to_powers_of_two():
    from turnip.session import _alike

    assert _alike(packed((61, 71, 31, 97))) == _alike(packed((60, 70, 33, 95))) == _alike(packed((40, 50, 60, 70)))
    assert _alike(packed((61, 71, 31, 97))) != _alike(packed((61, 71, 31, 97, 2)))  # five prompts: another class
    assert _alike(packed((61, 71, 31, 97))) != _alike(packed((200, 40)))
    assert _alike(LlamaPrefill(TINY, 256)) is None  # one sequence (Session.prefill): chosen for itself


def test_a_session_that_may_search_from_page_locked_memory_starts_the_server_at_once(monkeypatch, tmp_path):
    """On cuda (page-locked host memory) the search forks from a server, started when the session is made
    so that its imports overlap the weights' loading; not for `default`, nor where nothing is page-locked."""
    import json

    from turnip import session as session_module

    started = []
    monkeypatch.setattr(session_module.forks, "start_server", lambda preload: started.append(preload))
    (tmp_path / "config.json").write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "intermediate_size": 64}))
    for backend, plan, expected in (("cuda", "auto", 1), ("cuda", "default", 0), ("sim", "auto", 0)):
        started.clear()
        Session(config=str(tmp_path / "config.json"), memory=1 << 30, backend=backend, prefill_plan=plan).close()
        assert started == [("turnip.search",)] * expected, (backend, plan)


def test_the_session_plans_investigation_prints_both_tables(capsys):
    root = Path(__file__).parent.parent / "bench" / "investigations"
    sys.path.insert(0, str(root))
    try:
        import session_plans
    finally:
        sys.path.remove(str(root))
    assert session_plans.main(["--config", "tiny", "--memory", "320KiB", "--shapes", "4x64", "--alike", "4x40-64", "--sets", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4x")]
    assert len(rows) == 3 and "searched" in rows[0] and all("its own" in row for row in rows[1:])

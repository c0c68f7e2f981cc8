"""Choices and plans kept across processes: a kept choice is read instead of searched, keyed by everything
that changes it (each part changed: searched again), and a damaged, stale or foreign file is searched again
and written anew, never trusted; `turnip llama --plan-dir` keeps the choice and the plan, so a second run
neither searches nor compiles."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from frontend.workloads import llama
from turnip import choice_cache, choose, search
from turnip.choice_cache import ChoiceCache
from turnip.choose import LlamaPrefill, PlanTarget, choice_key, choose_llama_plan
from turnip_cli.main import main as turnip
from turnip_ir.cost import CostModel

TINY = llama.load_config("tiny")
PREFILL, TARGET = LlamaPrefill(TINY, 256), PlanTarget(192 << 10)


def _no_search(monkeypatch) -> None:
    monkeypatch.setattr(search.Search, "run", lambda self, workers: pytest.fail("searched again"))


def test_a_kept_choice_is_read_instead_of_searched(tmp_path, monkeypatch):
    cache = ChoiceCache(tmp_path)
    first = choose_llama_plan(PREFILL, TARGET, cache=cache)
    assert first.how == "searched" and len(list(tmp_path.glob("choice-*.json"))) == 1
    _no_search(monkeypatch)
    again = choose_llama_plan(PREFILL, TARGET, cache=cache)
    assert again.how == "kept" and again.candidate == first.candidate
    assert (again.built.block, again.built.layer_order) == (first.candidate.block, first.candidate.layer_order)
    assert again.memgraph.dumps() == first.memgraph.dumps()  # compiled again, the same plan


def _varied(monkeypatch) -> dict:
    """Each part of a choice's key changed alone: name -> the key with it changed ("base": none changed)."""
    base = dict(prefill=PREFILL, target=TARGET, given={}, remat=False, margin=choose.BIND_MARGIN)
    changes = {
        "base": {},
        "model shape": {"prefill": replace(PREFILL, config=replace(TINY, intermediate_size=96))},
        "dtype": {"prefill": replace(PREFILL, config=replace(TINY, dtype="float16"))},
        "tokens": {"prefill": replace(PREFILL, tokens=255)},
        "gpus": {"prefill": replace(PREFILL, gpus=2)},
        "placement": {"prefill": replace(PREFILL, placement="zigzag")},
        "kv outputs": {"prefill": replace(PREFILL, kv_outputs=True)},
        "budget": {"target": replace(TARGET, memory=TARGET.memory + 1)},
        "backend": {"target": replace(TARGET, backend="cuda")},
        "provider": {"target": replace(TARGET, attention="triton")},
        "streams": {"target": replace(TARGET, streams=3)},
        "arena": {"target": replace(TARGET, arena=128 << 10)},
        "given": {"given": {"block": 32}},
        "remat": {"remat": True},
        "margin": {"margin": 0.05},
    }
    keys = {name: choice_key(**(base | change)) for name, change in changes.items()}
    with monkeypatch.context() as patch:
        patch.setattr(choose, "PLAN_FORMAT", choose.PLAN_FORMAT + 1)
        keys["plan format"] = choice_key(**base)
    with monkeypatch.context() as patch:
        patch.setattr(choose, "CostModel", lambda: CostModel(h2d_bw=50e9))
        keys["cost model"] = choice_key(**base)
    return keys


def test_every_part_of_the_key_names_another_choice_file(tmp_path, monkeypatch):
    cache = ChoiceCache(tmp_path)
    keys = _varied(monkeypatch)
    paths = {name: cache.path(key) for name, key in keys.items()}
    assert len(set(paths.values())) == len(paths), paths
    base = cache.path(keys["base"])
    monkeypatch.setattr(choice_cache, "CHOICE_FORMAT", choice_cache.CHOICE_FORMAT + 1)
    assert cache.path(keys["base"]) != base


@pytest.mark.parametrize("change", [{"tokens": 255}, {"memory": 160 << 10}, {"remat": True}, {"dtype": "float16"}])
def test_a_choice_kept_for_another_key_is_not_read(tmp_path, change):
    cache = ChoiceCache(tmp_path)
    assert choose_llama_plan(PREFILL, TARGET, cache=cache).how == "searched"
    prefill = replace(PREFILL, tokens=change.get("tokens", PREFILL.tokens),
                      config=replace(TINY, dtype=change.get("dtype", TINY.dtype)))
    target = replace(TARGET, memory=change.get("memory", TARGET.memory))
    again = choose_llama_plan(prefill, target, cache=cache, remat=change.get("remat", False))
    assert again.how == "searched" and len(list(tmp_path.glob("choice-*.json"))) == 2


def _record(cache: ChoiceCache) -> tuple:
    path = cache.path(choice_key(PREFILL, TARGET, {}))
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("damage", ["not json", "truncated", "empty object", "older format", "another key",
                                    "no such block", "no such order", "a field missing", "a field more", "a list"])
def test_a_damaged_stale_or_foreign_choice_is_searched_again_and_written_anew(tmp_path, monkeypatch, damage):
    cache = ChoiceCache(tmp_path)
    first = choose_llama_plan(PREFILL, TARGET, cache=cache)
    path, record = _record(cache)
    text = json.dumps(record)
    choice = record["choice"]
    damaged = {
        "not json": "choice: halves",
        "truncated": text[: len(text) // 2],
        "empty object": "{}",
        "older format": json.dumps(record | {"format": record["format"] - 1}),
        "another key": json.dumps(record | {"key": record["key"] | {"remat": True}}),
        "no such block": json.dumps(record | {"choice": choice | {"block": 0}}),
        "no such order": json.dumps(record | {"choice": choice | {"layer_order": "sideways"}}),
        "a field missing": json.dumps(record | {"choice": {k: v for k, v in choice.items() if k != "schedule"}}),
        "a field more": json.dumps(record | {"choice": choice | {"gpus": 2}}),
        "a list": json.dumps([record]),
    }[damage]
    path.write_text(damaged)
    again = choose_llama_plan(PREFILL, TARGET, cache=cache)
    assert again.how == "searched" and again.candidate == first.candidate
    assert _record(cache)[1] == record  # written anew
    _no_search(monkeypatch)
    assert choose_llama_plan(PREFILL, TARGET, cache=cache).how == "kept"


def test_a_cache_that_cannot_be_written_costs_only_the_search(tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    cache = ChoiceCache(blocked / "choices")
    assert choose_llama_plan(PREFILL, TARGET, cache=cache).how == "searched"
    assert choose_llama_plan(PREFILL, TARGET, cache=cache).how == "searched"


LLAMA = ["llama", "--config", "tiny", "--tokens", "256", "--memory", "192KiB", "--seed", "3"]


def _plans(folder) -> list:
    return [path for path in folder.glob("*.json") if not path.name.startswith("choice-")]


def _reference() -> np.ndarray:
    config = llama.load_config("tiny")
    return llama.float64_forward(config, dict(llama.RandomWeights(config, seed=3)), llama.random_ids(config, 256, 3))


def test_llama_plan_dir_keeps_the_choice_and_the_plan_so_a_second_run_neither_searches_nor_compiles(tmp_path, capsys, monkeypatch):
    plans = tmp_path / "plans"
    assert turnip([*LLAMA, "--backend", "sim", "--plan-dir", str(plans)]) == 0
    first = capsys.readouterr().out
    assert "plan chosen in " in first
    assert len(list(plans.glob("choice-*.json"))) == 1 and len(_plans(plans)) == 1
    from turnip_cli import llama_cmd

    _no_search(monkeypatch)
    for module in (choose, llama_cmd):
        monkeypatch.setattr(module, "compile_taskgraph", lambda *a, **k: pytest.fail("compiled again"))
    assert turnip([*LLAMA, "--backend", "sim", "--plan-dir", str(plans)]) == 0
    second = capsys.readouterr().out
    assert "(chosen before, kept in " in second and "its plan read from --plan-dir" in second
    makespan = [line.split(", ")[-1] for line in first.splitlines() if "predicted makespan" in line]
    assert makespan and makespan == [line.split(", ")[-1] for line in second.splitlines() if "predicted makespan" in line]


def test_llama_plan_dir_recompiles_a_damaged_plan_and_runs_a_read_one_correctly(tmp_path, capsys):
    plans = tmp_path / "plans"
    args = [*LLAMA, "--backend", "cpu", "--plan-dir", str(plans), "--outputs"]
    assert turnip([*args, str(tmp_path / "a.npz")]) == 0
    capsys.readouterr()
    (plan,) = _plans(plans)
    plan.write_text(plan.read_text()[:-200])
    assert turnip([*args, str(tmp_path / "b.npz")]) == 0
    assert "read from --plan-dir" not in capsys.readouterr().out
    assert json.loads(plan.read_text())  # written anew, whole
    assert turnip([*args, str(tmp_path / "c.npz")]) == 0
    assert "plan read from --plan-dir" in capsys.readouterr().out
    expected = _reference()
    for name in "abc":
        out = np.load(tmp_path / f"{name}.npz")["hidden_states"]
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_llama_plan_dir_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert turnip([*LLAMA, "--backend", "sim", "--plan-dir", str(tmp_path / "f" / "plans")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("turnip llama: error: plan folder ") and "cannot be made" in err and len(err.splitlines()) == 1


def test_a_kept_choice_that_contradicts_what_was_given_is_searched_again(tmp_path):
    cache, given = ChoiceCache(tmp_path), {"block": 64}
    assert choose_llama_plan(PREFILL, TARGET, given, cache=cache).how == "searched"
    path = cache.path(choice_key(PREFILL, TARGET, given))
    record = json.loads(path.read_text())
    path.write_text(json.dumps(record | {"choice": record["choice"] | {"block": 128}}))
    again = choose_llama_plan(PREFILL, TARGET, given, cache=cache)
    assert again.how == "searched" and again.candidate.block == 64

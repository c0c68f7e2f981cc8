"""A budget error names the budget to pass for the whole command, workspace included, on every backend,
and that budget works while one byte less does not (issue 47, item 12; issue 45); sizes never read as
a round figure they are not."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from turnip import Session
from turnip_cli.main import main
from turnip_ir.errors import BudgetError
from turnip_ir.units import format_size

PROMPTS = [np.arange(1, 12) % 200, np.arange(5, 9) % 200]


def _generate(memory, backend="cpu", config="tiny", steps=5):
    with Session(config=config, memory=memory, backend=backend, kv_block=16) as session:
        return session.generate(PROMPTS, steps)


def _needed(err: BudgetError) -> int:
    return int(re.search(r"--memory (\d+)\)", str(err)).group(1))


@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_the_budget_a_generate_names_runs_it_and_one_byte_less_does_not(backend):
    with pytest.raises(BudgetError) as caught:
        _generate(33535, backend)  # the prefills fit from 33536 bytes, the decode step's logits do not
    message = str(caught.value)
    assert "\n" not in message and "this generate (its prefills and every decode step)" in message
    needed = _needed(caught.value)
    assert needed > 33536
    _generate(needed, backend)
    with pytest.raises(BudgetError) as again:
        _generate(needed - 1, backend)
    assert _needed(again.value) == needed


def test_a_cuda_budget_error_names_the_memory_to_pass_with_its_workspace(tmp_path):
    """On the cuda backend (numba-cuda's simulator) the arena is the budget less the workspace: the error
    names the budget, workspace included, and that budget runs."""
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
                                                      "max_position_embeddings": 2048, "dtype": "float32"}))
    config = str(tmp_path / "config.json")
    needed = {}
    for backend in ("cpu", "cuda"):
        with pytest.raises(BudgetError) as caught:
            _generate(1 << 10, backend, config, steps=2)
        needed[backend] = _needed(caught.value)
        assert ("the cuda backend holds back beside its arena included" in str(caught.value)) == (backend == "cuda")
    assert needed["cuda"] > needed["cpu"] + (1 << 20)  # the workspace: scratch, libraries
    _generate(needed["cuda"], "cuda", config, steps=2)


def test_turnip_generate_says_the_memory_to_pass_in_one_line(capsys):
    args = ["generate", "--config", "tiny", "--prompt-tokens", "6", "--max-new-tokens", "3", "--backend", "cpu"]
    assert main([*args, "--memory", "33535"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("turnip generate: error: a budget of 33535 bytes")
    needed = int(re.search(r"--memory (\d+)\)", err).group(1))
    assert main([*args, "--memory", str(needed)]) == 0


@pytest.mark.parametrize("count,text", [
    (300, "300 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (12288, "12.00 KiB"), (3 << 29, "1.50 GiB"),
    (1052832, "1.004 MiB"),  # not "1.00 MiB": a 1 MiB budget does not hold it
    (68095, "66.499 KiB"), (68096, "66.50 KiB"), (1048577, "1048577 B"), (1100000, "1.05 MiB"),
])
def test_a_size_never_reads_as_a_round_figure_it_is_not(count, text):
    assert format_size(count) == text


def test_two_sizes_that_differ_never_read_the_same_near_a_round_figure():
    for scale in (1 << 10, 1 << 20, 1 << 30):
        for count in (scale, scale + 1, scale + 7, scale + scale // 1000, scale + scale // 200 - 1):
            shown = format_size(count)
            if count != scale:
                assert shown != format_size(scale), (count, shown)


@pytest.mark.parametrize("backend", ["cpu", "sim", "cuda"])
def test_turnip_llama_names_the_memory_to_pass_workspace_included(backend, tmp_path, capsys):
    if backend == "cuda":
        from runtime.backends.cuda import simulated

        if not simulated():
            pytest.skip("runs numba-cuda's simulator")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "vocab_size": 256, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "dtype": "float32"}))
    args = ["llama", "--config", str(config), "--tokens", "16", "--backend", backend]
    assert main([*args, "--memory", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too small for this prefill" in err, err
    assert ("holds back beside its arena" in err) == (backend == "cuda")
    needed = int(re.search(r"--memory (\d+)\)", err).group(1))
    assert main([*args, "--memory", str(needed)]) == 0
    assert main([*args, "--memory", str(needed - 1)]) == 2

"""A cuda `Session` chooses its attention provider as `--attention auto` does: at its first plan it ranks
the candidates by the sim, each at its own arena (runtime.api, `plan_choosing_attention`), keeps the
winner for every later plan and makes its backend with it; a provider named in `backend_options` is
sized and run as named, with nothing ranked. Under numba's simulator only cublas runs, so the tests give
`auto` a second candidate and make torch-cudnn's kernels slow in the sim (this tiny fp32 model has no
fp16 attention to slow), so that the later candidate wins (the ranking itself:
tests/test_attention_choice.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from frontend.workloads import llama
from runtime import arena_budget
from turnip import Session
from turnip_ir.cost import CostModel

CUDA_RESERVE = (80 << 20) + 2 * (4 << 20) + (4 << 10)
PROMPTS = [np.array([1, 2, 3]), np.arange(4, 9)]


@pytest.fixture
def config(tmp_path):
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                "intermediate_size": 64}))
    return str(path)


def _expected(config: str, memory: int) -> np.ndarray:
    with Session(config=config, memory=memory, backend="cpu") as session:
        return session.generate(PROMPTS, 2).tokens


def test_auto_ranks_the_candidates_at_the_first_plan_and_the_session_runs_the_winner(config, monkeypatch):
    from runtime.backends.cuda import CudaBackend

    memory = 40_000 + CUDA_RESERVE
    expected = _expected(config, memory)
    monkeypatch.setattr(CudaBackend, "attention_candidates", staticmethod(lambda provider="auto": ("torch-cudnn", "cublas")))
    for_attention = CostModel.for_attention
    monkeypatch.setattr(CostModel, "for_attention", lambda self, provider: replace(self, launch=1e-3)
                        if provider == "torch-cudnn" else for_attention(self, provider))
    with Session(config=config, memory=memory, backend="cuda") as session:
        assert session.attention == "auto"
        result = session.generate(PROMPTS, 2)
        assert session.attention == "cublas" and set(session.attention_scores) == {"torch-cudnn", "cublas"}
        assert session.attention_scores["cublas"] < session.attention_scores["torch-cudnn"]
        assert session._machine.attention == "cublas"
        assert all(plan.budget <= arena_budget(plan, memory, "cuda", attention="cublas") for plan in session.cache.values())
    assert (result.tokens == expected).all()


def test_the_first_candidate_stays_unless_another_wins_by_the_margin(config, monkeypatch):
    from runtime.backends.cuda import CudaBackend

    monkeypatch.setattr(CudaBackend, "attention_candidates", staticmethod(lambda provider="auto": ("cublas", "torch-cudnn")))
    with Session(config=config, memory=40_000 + CUDA_RESERVE, backend="cuda") as session:
        session.generate(PROMPTS, 1)
        assert session.attention == "cublas" and set(session.attention_scores) == {"cublas", "torch-cudnn"}


def test_a_named_provider_or_a_single_candidate_is_not_ranked(config, monkeypatch):
    import turnip.session

    monkeypatch.setattr(turnip.session, "plan_choosing_attention", lambda *a, **k: pytest.fail("ranked"))
    memory = 40_000 + CUDA_RESERVE
    expected = _expected(config, memory)
    for options in ({"attention_provider": "cublas"}, None):  # under the simulator `auto` has one candidate, cublas
        with Session(config=config, memory=memory, backend="cuda", backend_options=options) as session:
            result = session.generate(PROMPTS, 2)
            assert session.attention == "cublas" and session.attention_scores == {}
            assert session._machine.attention == "cublas"
        assert (result.tokens == expected).all()


def test_turnip_generate_prints_autos_choice_and_passes_a_named_provider(config, monkeypatch, capsys):
    from runtime.backends.cuda import CudaBackend
    from turnip_cli.main import main as turnip

    args = ["generate", "--config", config, "--prompt-tokens", "3", "--batch", "2", "--max-new-tokens", "2",
            "--memory", str(40_000 + CUDA_RESERVE), "--backend", "cuda"]
    monkeypatch.setattr(CudaBackend, "attention_candidates", staticmethod(lambda provider="auto": ("cublas", "torch-cudnn")))
    assert turnip(args) == 0, capsys.readouterr().err
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("attention auto:"))
    assert line.startswith("attention auto: cublas (sim predictions: cublas ") and ", torch-cudnn " in line
    monkeypatch.setattr(Session, "generate", lambda self, *a, **k: pytest.fail(f"ran with {self.backend_options}"))
    with pytest.raises(pytest.fail.Exception, match="'attention_provider': 'cublas'"):
        turnip(args + ["--attention", "cublas"])


def test_turnip_generate_warns_that_a_provider_means_nothing_to_the_cpu_backend(config, capsys):
    from turnip_cli.main import main as turnip

    assert turnip(["generate", "--config", config, "--prompt-tokens", "3", "--max-new-tokens", "1", "--memory", "1MiB",
                   "--backend", "cpu", "--attention", "triton"]) == 0
    captured = capsys.readouterr()
    assert "warning: --attention triton is ignored" in captured.err and "attention auto:" not in captured.out

"""A cuda `Session` sizes its arena for the attention provider its backend runs: one named in
`backend_options` is sized and run as named; `auto` takes the first of `auto`'s candidates without ranking
them (triton's first use in a process costs seconds the sim's ranking of one plan does not see:
docs/generation.md). `turnip generate --attention` passes a named provider. Under numba's simulator
only cublas runs, so the tests give `auto` a second candidate where they need one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from frontend.workloads import llama
from runtime import arena_budget
from turnip import Session

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


def test_auto_takes_the_first_candidate_without_ranking(config, monkeypatch):
    """The sim is made to rank cublas far behind torch-cudnn (which cannot run under the simulator): a
    session that ranked would take torch-cudnn and fail; it takes cublas, the first candidate."""
    from dataclasses import replace

    from runtime.backends.cuda import CudaBackend
    from turnip_ir.cost import CostModel

    memory = 40_000 + CUDA_RESERVE
    expected = _expected(config, memory)
    monkeypatch.setattr(CudaBackend, "attention_candidates", staticmethod(lambda provider="auto": ("cublas", "torch-cudnn")))
    for_attention = CostModel.for_attention
    monkeypatch.setattr(CostModel, "for_attention", lambda self, provider: replace(self, launch=1e-3)
                        if provider == "cublas" else for_attention(self, provider))
    with Session(config=config, memory=memory, backend="cuda") as session:
        assert session.attention == "auto"
        result = session.generate(PROMPTS, 2)
        assert session.attention == "cublas" and session._machine.attention == "cublas"
        assert all(plan.budget <= arena_budget(plan, memory, "cuda", attention="cublas") for plan in session.cache.values())
    assert (result.tokens == expected).all()


def test_a_named_provider_sizes_the_arena_and_runs(config, monkeypatch):
    from runtime.backends.cuda import CudaBackend

    monkeypatch.setattr(CudaBackend, "attention_candidates", lambda provider="auto": pytest.fail("resolved auto"))
    memory = 40_000 + CUDA_RESERVE
    expected = _expected(config, memory)
    with Session(config=config, memory=memory, backend="cuda", backend_options={"attention_provider": "cublas"}) as session:
        result = session.generate(PROMPTS, 2)
        assert session.attention == "cublas" and session._machine.attention == "cublas"
    assert (result.tokens == expected).all()


def test_turnip_generate_passes_a_named_provider(config, monkeypatch, capsys):
    from turnip_cli.main import main as turnip

    args = ["generate", "--config", config, "--prompt-tokens", "3", "--batch", "2", "--max-new-tokens", "2",
            "--memory", str(40_000 + CUDA_RESERVE), "--backend", "cuda"]
    assert turnip(args) == 0, capsys.readouterr().err
    assert "attention auto:" not in capsys.readouterr().out
    monkeypatch.setattr(Session, "generate", lambda self, *a, **k: pytest.fail(f"ran with {self.backend_options}"))
    with pytest.raises(pytest.fail.Exception, match="'attention_provider': 'cublas'"):
        turnip(args + ["--attention", "cublas"])


def test_turnip_generate_warns_that_a_provider_means_nothing_to_the_cpu_backend(config, capsys):
    from turnip_cli.main import main as turnip

    assert turnip(["generate", "--config", config, "--prompt-tokens", "3", "--max-new-tokens", "1", "--memory", "1MiB",
                   "--backend", "cpu", "--attention", "triton"]) == 0
    assert "warning: --attention triton is ignored" in capsys.readouterr().err

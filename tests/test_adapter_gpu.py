"""LoRA adapters on a real GPU (marked `gpu`; needs neither torch's models nor peft): an fp16 checkpoint
with a LoRA adapter (B drawn, not zero) on q, v, o and down projections, under budgets that make the
weights stream. `turnip llama --adapter` on the cuda backend gives the float64 reference's hidden states
of the merged weights; a cuda `Session(adapter=...)` reads the weights the adapter leaves alone in place
from the checkpoint's page-locked map and its teacher-forced logits match the cpu backend's float32 ones.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from frontend.safetensors import save_file
from frontend.workloads import llama
from frontend.workloads.llama.float64_forward import float64_forward
from runtime import arena_budget
from turnip import Session
from turnip.lora import Adapter, LoraSettings, MergedWeights
from turnip_cli.main import main

pytestmark = pytest.mark.gpu

MODEL = {**llama.PRESETS["tiny-gqa"], "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096, "dtype": "float16"}
"""About 10 MB of fp16 weights (the layers 5.8 MB, the embedding table and the LM head 4 MB)."""
ARENA = 6 << 20
"""Arena bytes: under the weights, over the largest op (the LM head's block)."""
SETTINGS = LoraSettings(8, 16, ("q_proj", "v_proj", "o_proj", "down_proj"))
LOGIT_TOLERANCE = 0.05
"""As tests/test_generate_gpu.py: fp16 activations over a few layers against float32, on logits of order 1."""


def checkpoint(folder: Path) -> tuple[llama.LlamaConfig, dict[str, np.ndarray]]:
    """A model folder of fp16 random weights (stored as computed: the cuda backend reads them in place)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MODEL))
    config = llama.load_config(str(folder))
    drawn = llama.RandomWeights(config, 0)
    weights = {name: np.asarray(drawn[name]) for name in drawn}
    save_file(weights, folder / "model.safetensors")
    return config, weights


def drawn_adapter(config: llama.LlamaConfig, folder: Path) -> Adapter:
    """An adapter as PEFT initialises one, then B drawn too (a zero B would change nothing), saved as PEFT's folder."""
    adapter = Adapter.new(config, SETTINGS, 1)
    rng = np.random.default_rng(2)
    for name, tensor in adapter.tensors.items():
        if ".lora_B." in name:
            tensor[...] = 0.05 * rng.standard_normal(tensor.shape)
    adapter.save(folder)
    return adapter


def budget(graph) -> int:
    """The cuda workspace of `graph` plus ARENA."""
    return (1 << 30) - arena_budget(graph, 1 << 30, "cuda") + ARENA


def test_llama_with_an_adapter_on_the_gpu_equals_the_float64_reference(tmp_path):
    config, weights = checkpoint(tmp_path / "m")
    adapter = drawn_adapter(config, tmp_path / "a")
    tokens = 256
    memory = budget(llama.build_llama(config, tokens).graph)
    assert main(["llama", "--weights", str(tmp_path / "m"), "--adapter", str(tmp_path / "a"), "--tokens", str(tokens),
                 "--memory", str(memory), "--backend", "cuda", "--outputs", str(tmp_path / "h.npz")]) == 0
    got = np.load(tmp_path / "h.npz")["hidden_states"].astype(np.float64)
    ids = llama.random_ids(config, tokens, 0)  # what --tokens draws from --seed 0
    want = float64_forward(config, MergedWeights(weights, adapter), ids)  # merged in float32, rounded to fp16, as the run's
    plain = float64_forward(config, weights, ids)
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    print(f"largest error {error:.2e} of the largest value; the adapter moves them {np.max(np.abs(plain - want)) / np.max(np.abs(want)):.2e}")
    assert error < 2e-2
    assert np.max(np.abs(plain - want)) / np.max(np.abs(want)) > 1e-1  # the adapter matters


def test_a_cuda_session_with_an_adapter_matches_float32_and_reads_the_rest_in_place(tmp_path):
    config, _ = checkpoint(tmp_path / "m")
    drawn_adapter(config, tmp_path / "a")
    prompts = [np.random.default_rng(3).integers(0, config.vocab_size, n) for n in (37, 64)]
    steps = 6
    with Session(weights=tmp_path / "m", adapter=tmp_path / "a", dtype="float32", memory=1 << 30, backend="cpu") as reference:
        greedy = reference.generate(prompts, steps).tokens
        want = reference.generate(prompts, steps, forced=greedy)
    longest = llama.build_llama(replace(config, dtype="float16"), max(len(p) for p in prompts) - 1, kv_outputs=True).graph
    with Session(weights=tmp_path / "m", adapter=tmp_path / "a", memory=budget(longest), backend="cuda") as session:
        got = session.generate(prompts, steps, forced=greedy)
        maps = list(session.host.mappings.values())
        in_place = {name for name, value in session.weights.kept.items() if any(np.shares_memory(value, m) for m in maps)}
    assert got.bytes_reloaded > 0  # the budget made the weights stream
    errors = [float(np.max(np.abs(g - w))) for g, w in zip(got.logits, want.logits)]
    print("largest logit error per step:", ", ".join(f"{e:.4f}" for e in errors))
    assert max(errors) < LOGIT_TOLERANCE
    assert "model.layers.0.self_attn.k_proj.weight" in in_place and "model.layers.0.mlp.up_proj.weight" in in_place
    assert not any(f".{target}." in name for name in in_place for target in SETTINGS.targets)  # merged: new arrays

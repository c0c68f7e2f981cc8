"""Generation on a real GPU (marked `gpu`; `bash bench/gpu_bench.sh generatetests` runs it on the H200).

A small but real fp16 model (hidden 1024, 4 layers, GQA 16/4, vocab 32000, random weights), a batch of
four ragged prompts and eight new tokens under a budget that forces the weights to stream. Random fp16
weights give near ties among logits, so greedy token streams of two correct implementations part after a
step or two: the check is under teacher forcing. The cpu backend in float32 picks the greedy tokens; the
cuda session is fed the same tokens, and every step's logits must match the float32 ones within
`LOGIT_TOLERANCE` (absolute, on logits of order 1: the model's scale). The largest error per step is printed
(`-s` or `-rA` shows it).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from frontend.workloads import llama
from runtime import arena_budget
from turnip import Session

pytestmark = pytest.mark.gpu

LOGIT_TOLERANCE = 0.05
"""Largest absolute logit error allowed against float32: fp16 storage of every activation (relative
error ~5e-4 each) over four layers and a 1024-wide LM head, with fp32 accumulation in cuBLAS; the cpu
backend's numpy fp16 kernels, which round more often, stay near a tenth of it at two layers."""
ARENA = 112 << 20
"""Arena bytes: under the weights on the GPU (~153 MB: the layers and the LM head), over the largest op."""


def small_model() -> llama.LlamaConfig:
    base = llama.load_config("tiny")
    return replace(base, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=4096, dtype="float16")


@pytest.mark.parametrize("lengths", [(37, 64, 5, 100), (48, 48, 48)], ids=["ragged", "even"])
def test_teacher_forced_logits_on_cuda_match_float32_per_step(lengths):
    """Ragged prompts append their new rows on the host; prompts of one length have them copied from
    the GPU straight into the cache (`execute(outputs_into=)`)."""
    config = small_model()
    drawn = llama.RandomWeights(config, 0)
    weights = {name: np.asarray(drawn[name]) for name in drawn}  # drawn once, fp16, shared by both sessions
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, config.vocab_size, n) for n in lengths]
    steps = 8
    with Session(config=replace(config, dtype="float32"), weights=weights, memory=1 << 34, backend="cpu") as reference:
        greedy = reference.generate(prompts, steps).tokens
        want = reference.generate(prompts, steps, forced=greedy)
    longest = llama.build_llama(config, max(len(p) for p in prompts) - 1, kv_outputs=True).graph
    memory = (1 << 30) - arena_budget(longest, 1 << 30, "cuda") + ARENA  # the cuda workspace plus the arena
    with Session(config=config, weights=weights, memory=memory, backend="cuda") as session:
        got = session.generate(prompts, steps, forced=greedy)
        again = session.generate(prompts, steps, forced=greedy)
        assert again.compiles == 0 and session.backends_built == 1
        straight = len(session._machine.views.targets)
    assert straight == (2 * config.num_hidden_layers if len(set(lengths)) == 1 else 0)
    assert got.bytes_reloaded > 0  # the budget made the weights stream
    errors = [float(np.abs(g - w).max()) for g, w in zip(got.logits, want.logits, strict=True)]
    scale = max(float(np.abs(w).max()) for w in want.logits)
    print(f"\nlargest |logit error| per step vs float32 (logits up to {scale:.2f}): " + " ".join(f"{e:.4f}" for e in errors))
    print(f"reloaded {got.bytes_reloaded / 1e6:.1f} MB per call, decode {1e3 * np.median(got.step_seconds):.2f} ms per step")
    assert max(errors) <= LOGIT_TOLERANCE, errors
    # the second call ran on the prepared backend, its arena holding the first call's data: same numbers
    np.testing.assert_allclose(np.concatenate(again.logits), np.concatenate(got.logits), rtol=0, atol=1e-2)


def test_a_checkpoint_session_reads_its_weights_in_place_and_matches_float32(tmp_path):
    """The same model saved as an fp16 safetensors folder: the cuda session page-locks the file's map and
    reads the weights where it lies (no host copy), and its teacher-forced logits match float32's."""
    import json

    from frontend.safetensors import save_file

    config = small_model()
    drawn = llama.RandomWeights(config, 0)
    weights = {name: np.asarray(drawn[name]) for name in drawn}
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 4096,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope.theta, "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": "float16"}))
    save_file(weights, folder / "model.safetensors")
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, config.vocab_size, n) for n in (20, 9)]
    with Session(config=replace(llama.load_config(str(folder)), dtype="float32"), weights=weights, memory=1 << 34, backend="cpu") as reference:
        greedy = reference.generate(prompts, 4).tokens
        want = reference.generate(prompts, 4, forced=greedy)
    with Session(weights=folder, memory=1 << 30, backend="cuda") as session:
        got = session.generate(prompts, 4, forced=greedy)
        assert session.host.mappings and got.bytes_staged == 0
    errors = [float(np.abs(g - w).max()) for g, w in zip(got.logits, want.logits, strict=True)]
    print(f"\ncheckpoint read in place: largest |logit error| per step vs float32: " + " ".join(f"{e:.4f}" for e in errors))
    assert max(errors) <= LOGIT_TOLERANCE, errors

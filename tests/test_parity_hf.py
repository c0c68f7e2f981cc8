"""Parity with code nobody here wrote: Hugging Face transformers' `LlamaModel` on the same weights.

The test writes a tiny model folder (config.json from transformers itself, or in the old key spelling,
and model.safetensors from our writer), runs `turnip llama --weights` on it (cpu backend, a budget that
forces offload), and compares `hidden_states` with `LlamaModel(...).last_hidden_state[0]`, with the
weights loaded into torch by the `safetensors` package, not by our reader. Skipped without transformers
(`pip install -e '.[parity]'`).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from turnip_cli.main import main as turnip  # noqa: E402
from frontend.safetensors import save_file  # noqa: E402
from frontend.workloads import llama  # noqa: E402
from frontend.workloads.llama.rope import rope_tables  # noqa: E402

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def write_model(folder, doc: dict, from_transformers: bool) -> None:
    """config.json (saved by transformers, or `doc` as written) and random weights in model.safetensors."""
    folder.mkdir()
    if from_transformers:
        transformers.LlamaConfig(**doc).save_pretrained(folder)
    else:
        (folder / "config.json").write_text(json.dumps(doc))
    config = llama.load_config(str(folder))
    save_file(dict(llama.RandomWeights(config, seed=2)), folder / "model.safetensors")


def hf_hidden_states(folder, ids: np.ndarray, dtype: str) -> np.ndarray:
    config = transformers.LlamaConfig.from_pretrained(folder)
    model = transformers.LlamaModel(config).to(getattr(torch, dtype)).eval()
    state = safetensors_torch.load_file(folder / "model.safetensors")
    model.load_state_dict({name.removeprefix("model."): tensor for name, tensor in state.items() if name != "lm_head.weight"})
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].float().numpy()


CASES = {
    "float32, new spelling (saved by transformers)": ({**TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, "float32", True, 2e-5),
    "float32, old spelling, llama3 rope, head_dim 32": ({**TINY, "head_dim": 32, "rope_theta": 500000.0, "rope_scaling": LLAMA3}, "float32", False, 2e-5),
    "float16, old spelling": ({**TINY, "rope_theta": 10000.0, "torch_dtype": "float16"}, "float16", False, 1e-2),
}


@pytest.mark.parametrize("case", CASES)
def test_turnip_llama_equals_transformers(tmp_path, capsys, case):
    doc, dtype, from_transformers, tolerance = CASES[case]
    write_model(tmp_path / "m", {**doc, "torch_dtype": dtype} if from_transformers else doc, from_transformers)
    ids = np.random.default_rng(0).integers(0, TINY["vocab_size"], 50)
    np.save(tmp_path / "ids.npy", ids)
    args = ["llama", "--weights", str(tmp_path / "m"), "--input-ids", str(tmp_path / "ids.npy"), "--memory", "120KiB" if dtype == "float32" else "60KiB",
            "--block", "16", "--backend", "cpu", "--order", "random", "--outputs", str(tmp_path / "out.npz")]
    assert turnip(args) == 0, capsys.readouterr().err
    planned = re.search(r"^(\d+) offloads", capsys.readouterr().out, re.MULTILINE)
    assert planned and int(planned.group(1)) > 0  # the budget forces offload
    ours = np.load(tmp_path / "out.npz")["hidden_states"]
    theirs = hf_hidden_states(tmp_path / "m", ids, dtype)
    assert ours.dtype == np.dtype(dtype) and ours.shape == theirs.shape == (50, 64)
    error = np.abs(ours.astype(np.float64) - theirs)
    scale = np.abs(theirs).max()
    print(f"\n{case}: max abs error {error.max():.2e}, max relative error {error.max() / scale:.2e} (of max |h| {scale:.2f})")
    assert error.max() <= tolerance * scale


@pytest.mark.parametrize("rope", [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    LLAMA3,
])
def test_rope_tables_equal_transformers_rotary_embedding(rope):
    doc = {**TINY, "max_position_embeddings": 128, "rope_parameters": {**rope, "rope_theta": 10000.0}}
    hf = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig(**doc))
    tokens = 300  # past max_position_embeddings, where dynamic NTK scaling starts
    positions = torch.arange(tokens)[None]
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions)
    ours = rope_tables(llama.config.from_hf(doc, "c"), tokens)
    # transformers works in float32: position x frequency is off by up to ~300 * 6e-8 radians
    np.testing.assert_allclose(ours[0], cos[0].numpy(), atol=1e-4)
    np.testing.assert_allclose(ours[1], sin[0].numpy(), atol=1e-4)

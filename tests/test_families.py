"""Model families against transformers' own classes, on tiny random checkpoints written by save_pretrained.

Per family (Llama 3.2: GQA, llama3 RoPE, tied embeddings; Mistral: a sliding window shorter than the
prompt that the block size does not divide; Qwen2: q/k/v biases, RoPE theta 1e6, tied embeddings):
`turnip llama --weights` equals `XForCausalLM(...).model(...).last_hidden_state[0]` in float32 to a
relative error of 1e-4 under a budget that forces offload, and the greedy tokens of `Session.generate`
and `turnip generate` equal transformers' `generate`. The window's blocks behind it are never built, and its masks are exact; the
cuda backend refuses a windowed attention in one line; what no family supports is refused in one line
naming the field and its value.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from frontend.safetensors import save_file
from frontend.workloads import llama
from frontend.workloads.llama.config import from_hf
from passes.pipeline import compile_taskgraph
from runtime import execute
from turnip import Session
from turnip_cli.main import main as turnip
from turnip_ir.errors import InputError, KernelError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}
WINDOW = 7
"""Mistral's window: shorter than the prompts, and no block size used here (5, 4) divides it."""
FAMILIES = {
    "llama 3.2": ("Llama", {**TINY, "tie_word_embeddings": True, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}),
    "mistral": ("Mistral", {**TINY, "sliding_window": WINDOW}),
    "qwen2": ("Qwen2", {**TINY, "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen2, untied": ("Qwen2", {**TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
}


def write_checkpoint(folder, family: str, doc: dict) -> None:
    """config.json saved by transformers' config class, our random weights (biases included) beside it."""
    folder.mkdir()
    getattr(transformers, f"{family}Config")(**doc).save_pretrained(folder)
    config = llama.load_config(str(folder))
    weights = dict(llama.RandomWeights(config, seed=3))
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, folder / "model.safetensors")


def hf_model(folder, family: str):
    """transformers' `XForCausalLM` with the checkpoint's tensors, loaded by the safetensors package."""
    config = getattr(transformers, f"{family}Config").from_pretrained(folder)
    model = getattr(transformers, f"{family}ForCausalLM")(config).float().eval()
    missing, unexpected = model.load_state_dict(safetensors_torch.load_file(folder / "model.safetensors"), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if missing:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    model.generation_config.eos_token_id = None  # exactly the asked number of tokens
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request, tmp_path_factory):
    family, doc = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param.replace(" ", "_").replace(",", "")) / "m"
    write_checkpoint(folder, family, doc)
    return request.param, folder, hf_model(folder, family)


def test_turnip_llama_equals_the_family_model(checkpoint, tmp_path, capsys):
    name, folder, model = checkpoint
    ids = np.random.default_rng(0).integers(0, TINY["vocab_size"], 23)
    np.save(tmp_path / "ids.npy", ids)
    args = ["llama", "--weights", str(folder), "--input-ids", str(tmp_path / "ids.npy"), "--memory", "120KiB",
            "--block", "5", "--backend", "cpu", "--order", "random", "--outputs", str(tmp_path / "out.npz")]
    assert turnip(args) == 0, capsys.readouterr().err
    planned = re.search(r"^(\d+) offloads", capsys.readouterr().out, re.MULTILINE)
    assert planned and int(planned.group(1)) > 0  # the budget forces offload
    ours = np.load(tmp_path / "out.npz")["hidden_states"].astype(np.float64)
    with torch.no_grad():
        theirs = model.model(input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].numpy()
    error = np.abs(ours - theirs).max() / np.abs(theirs).max()
    print(f"\n{name}: max relative error {error:.2e}")
    assert error <= 1e-4


def test_greedy_tokens_equal_the_family_generate(checkpoint, tmp_path, capsys):
    name, folder, model = checkpoint
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 128, n) for n in (11, 3, 9)]  # past the window, and inside it
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.from_numpy(prompt)[None], max_new_tokens=5, do_sample=False, pad_token_id=0)
            expected.append(out[0, len(prompt):].tolist())
    with Session(weights=folder, memory=100 << 10, backend="cpu", kv_block=4) as session:
        assert session.generate(prompts, 5).tokens.tolist() == expected
    np.save(tmp_path / "ids.npy", prompts[0])
    args = ["generate", "--weights", str(folder), "--input-ids", str(tmp_path / "ids.npy"), "--max-new-tokens", "5",
            "--memory", "100KiB", "--backend", "cpu", "--outputs", str(tmp_path / "out.npz")]
    assert turnip(args) == 0, capsys.readouterr().err
    assert np.load(tmp_path / "out.npz")["generated"].tolist() == expected[:1]


def test_a_window_builds_only_the_key_blocks_it_reaches():
    """Prompt 23 in blocks of 5, window 7: query block 4 (tokens 20-22; 20 sees 14..20, 22 sees 16..22)
    reads key blocks 2 and 3, masked, and 4, whole; query block 2 (10-14: 10 sees 4..10, 14 sees 8..14)
    reads blocks 0 and 1, masked, and 2; in decode at position 23 (it sees 17..23), kv blocks of 4 rows: the block
    16-19 is masked, 20-22 is whole, 0-15 are not inputs."""
    config = from_hf({**TINY, "model_type": "mistral", "sliding_window": WINDOW}, "c")
    graph = llama.build_llama(config, 23, block=5).graph
    links = {node.id: node.attrs for node in graph.nodes.values() if node.id.startswith("l0.attn[")}
    assert sorted(i for i in links if i.startswith("l0.attn[4")) == ["l0.attn[4,0]", "l0.attn[4,0].k2", "l0.attn[4,0].k3"]
    assert [(links[f"l0.attn[4,0].k{j}"]["window"], links[f"l0.attn[4,0].k{j}"]["offset"]) for j in (2, 3)] == [
        (WINDOW, -10), (WINDOW, -5)]
    assert "window" not in links["l0.attn[4,0]"]
    assert links["l0.attn[2,0].k0"]["offset"] == -10 and links["l0.attn[2,0].k1"]["offset"] == -5
    step = llama.build_decode_step(config, [23], kv_block=4).graph
    cache = sorted(node.id for node in step.nodes.values() if node.op == "input" and node.id.startswith("kv.0.k"))
    assert cache == ["kv.0.k[4]", "kv.0.k[5]"]  # columns of 4 positions: 16-19 (seen in part), 20-23
    links = [node.attrs for node in step.nodes.values() if node.op == "decode_attention" and node.id.startswith("l0.")]
    assert [(a["window"], a.get("start"), a.get("own", False)) for a in links] == [(WINDOW, 16, False), (WINDOW, 20, False), (WINDOW, None, True)]


@pytest.mark.parametrize("block", [3, 5, 7, 23])
def test_windowed_prefill_equals_the_float64_forward(block):
    config = from_hf({**TINY, "model_type": "mistral", "sliding_window": WINDOW}, "c")
    weights = llama.RandomWeights(config, 4)
    ids = np.random.default_rng(block).integers(0, 128, 23)
    built = llama.build_llama(config, 23, block=block)
    outputs = execute(compile_taskgraph(built.graph, 1 << 30), backend="cpu", inputs=built.feed(weights, ids)).outputs
    want = llama.float64_forward(config, weights, ids)
    np.testing.assert_allclose(built.gather(outputs), want, atol=1e-4 * np.abs(want).max())
    full = llama.float64_forward(from_hf({**TINY, "model_type": "mistral", "sliding_window": None}, "c"), weights, ids)
    assert not np.allclose(full[WINDOW:], want[WINDOW:], atol=1e-3)  # the window changes the later rows


def test_a_windowed_prefill_on_the_cuda_backend_equals_the_float64_forward(window=3):
    """numba-cuda's simulator here (the cublas provider, which every provider hands a windowed block to):
    the softmax masks the keys behind the window, and a row the window hides a whole block from (window
    3 in blocks of 4) weighs that block to nothing."""
    from runtime.backends.cuda import CudaBackend

    config = from_hf({**TINY, "num_hidden_layers": 1, "model_type": "mistral", "sliding_window": window}, "c")
    weights, ids = llama.RandomWeights(config, 1), np.arange(12)
    built = llama.build_llama(config, 12, block=4)
    assert any("window" in node.attrs for node in built.graph.nodes.values())
    outputs = execute(compile_taskgraph(built.graph, 1 << 30), backend=CudaBackend(), inputs=built.feed(weights, ids)).outputs
    want = llama.float64_forward(config, weights, ids)
    np.testing.assert_allclose(built.gather(outputs), want, atol=1e-5 * np.abs(want).max())


def test_qwen2_prefill_runs_on_the_cuda_backend():
    """The bias is a broadcast `add`, which the cuda backend has (numba-cuda's simulator here)."""
    from runtime.backends.cuda import CudaBackend

    config = from_hf({**TINY, "num_hidden_layers": 1, "model_type": "qwen2"}, "c")
    weights, ids = llama.RandomWeights(config, 1), np.arange(8)
    built = llama.build_llama(config, 8, block=4)
    outputs = execute(compile_taskgraph(built.graph, 1 << 30), backend=CudaBackend(), inputs=built.feed(weights, ids)).outputs
    want = llama.float64_forward(config, weights, ids)
    np.testing.assert_allclose(built.gather(outputs), want, atol=1e-5 * np.abs(want).max())


def test_qwen2_biases_are_weights_drawn_read_and_counted(tmp_path):
    config = from_hf({**TINY, "model_type": "qwen2"}, "c")
    bias = "model.layers.1.self_attn.k_proj.bias"
    assert llama.weight_shapes(config)[bias] == (32,)
    drawn = llama.RandomWeights(config, 1)[bias]
    assert drawn.shape == (32,) and 0 < np.abs(drawn).max() < 1
    plain = llama.host_footprint(from_hf(TINY, "c"), 10).weights
    assert llama.host_footprint(config, 10).weights - plain == 2 * (64 + 32 + 32) * 4
    weights = dict(llama.RandomWeights(config, 1))
    save_file({k: v for k, v in weights.items() if k != bias}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "qwen2"}))
    with pytest.raises(InputError, match=f"tensor '{bias}' is missing"):
        llama.CheckpointWeights(tmp_path, config)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gemma"}, "model_type 'gemma' is not supported (supported: llama, mistral, qwen2)"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh' is not supported (only silu)"),
    ({"attention_bias": True}, "attention_bias true is not supported"),
    ({"model_type": "mistral", "attention_bias": True}, "attention_bias true is not supported"),
    ({"mlp_bias": True}, "mlp_bias true is not supported"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
     "use_sliding_window true is not supported"),
    ({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]},
     'layer_types ["sliding_attention"] is not supported'),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window must be a positive integer, got 0"),
])
def test_what_no_family_supports_is_one_line_naming_the_field(change, message):
    with pytest.raises(InputError) as caught:
        from_hf({**TINY, **change}, "c")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_family_defaults_follow_transformers():
    assert from_hf({**TINY, "model_type": "mistral"}, "c").sliding_window == 4096  # MistralConfig's default
    assert from_hf({**TINY, "model_type": "llama", "sliding_window": 5}, "c").sliding_window is None  # llama ignores it
    qwen = from_hf({**TINY, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}, "c")
    assert qwen.qkv_bias and qwen.sliding_window is None  # no layer from max_window_layers on: none slides

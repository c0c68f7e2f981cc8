"""The base model run with a PEFT LoRA adapter: `turnip generate --adapter DIR`, `turnip llama --adapter DIR`
and `Session(adapter=...)` against peft's own model of that adapter (transformers + peft: greedy tokens in
float32, hidden states in float64), under budgets that offload, for an adapter peft made (A and B both
drawn) and one `turnip finetune` wrote; plans shared by sessions with and without an adapter; bad adapters
and outputs over the adapter's files refused in one line with nothing written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from frontend.safetensors import SafeTensors
from frontend.workloads import llama
from turnip import Session
from turnip.lora import CONFIG_FILE, PREFIX, WEIGHTS_FILE, Adapter, LoraSettings, MergedWeights, MergedTensor
from turnip_cli.main import main
from turnip_ir.errors import InputError

MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 96, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
         "initializer_range": 0.1}
VOCAB = MODEL["vocab_size"]
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
BUDGET = "48KiB"
"""Under the model's ~100 KiB of float32 weights, over its largest op: the runs offload and reload."""
PROMPTS = [np.array([5, 17, 3, 88, 41, 9, 60]), np.array([2, 71, 30])]
NEW = 6

torch.set_num_threads(1)  # tiny models: more threads only contend for the test machine's cores


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny LLaMA checkpoint transformers writes (float32 safetensors)."""
    path = tmp_path_factory.mktemp("adapter") / "model"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**MODEL)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapter(model, tmp_path_factory) -> Path:
    """An adapter folder peft writes with save_pretrained: r 4, alpha 8 on TARGETS, A and B both drawn
    (init_lora_weights=False), so B is not zero and the adapter changes what the model computes."""
    path = tmp_path_factory.mktemp("adapter") / "peft"
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False,
                             task_type="CAUSAL_LM")
    peft.get_peft_model(base(model), config).save_pretrained(path)
    return path


def base(model: Path, dtype=torch.float32):
    return transformers.LlamaForCausalLM.from_pretrained(model, dtype=dtype).eval()


def peft_greedy(model: Path, folder: Path | None, prompt: np.ndarray, steps: int = NEW) -> list[int]:
    """peft's model of the adapter `folder` (None: the base model alone), greedy, exactly `steps` tokens."""
    lm = base(model) if folder is None else peft.PeftModel.from_pretrained(base(model), str(folder)).eval()
    lm.generation_config.eos_token_id = None
    with torch.no_grad():
        out = lm.generate(input_ids=torch.from_numpy(prompt)[None], max_new_tokens=steps, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def turnip(capsys, *args) -> tuple[int, str, str]:
    """`turnip ...` in this process: its exit code, stdout and stderr (argparse's errors exit)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def prompts_file(tmp_path: Path) -> Path:
    np.savez(tmp_path / "prompts.npz", a=PROMPTS[0], b=PROMPTS[1])
    return tmp_path / "prompts.npz"


def generate(capsys, model: Path, folder: Path, tmp_path: Path, *extra) -> tuple[np.ndarray, str]:
    """`turnip generate --adapter folder` of PROMPTS on the cpu backend under BUDGET: the tokens and stdout."""
    out = tmp_path / "out.npz"
    code, stdout, err = turnip(capsys, "generate", "--weights", model, "--adapter", folder, "--input-ids", prompts_file(tmp_path),
                               "--max-new-tokens", NEW, "--memory", BUDGET, "--backend", "cpu", "--outputs", out, *extra)
    assert code == 0, err
    return np.load(out)["generated"], stdout


# ----- the commands against peft -------------------------------------------------------------------------------
def test_generate_with_a_peft_adapter_gives_peft_greedy_tokens(model, adapter, tmp_path, capsys):
    tokens, out = generate(capsys, model, adapter, tmp_path, "--order", "random", "--seed", 3)
    expected = [peft_greedy(model, adapter, p) for p in PROMPTS]
    assert tokens.tolist() == expected
    assert expected != [peft_greedy(model, None, p) for p in PROMPTS]  # the adapter changes the tokens
    assert f"adapter '{adapter}' (LoRA r 4, alpha 8 on q_proj,v_proj,o_proj,down_proj)" in out
    assert "reloaded 0 B" not in out  # the budget made the weights stream


def test_llama_with_a_peft_adapter_gives_peft_hidden_states(model, adapter, tmp_path, capsys):
    ids = np.random.default_rng(4).integers(0, VOCAB, 13)
    np.save(tmp_path / "ids.npy", ids)
    code, out, err = turnip(capsys, "llama", "--weights", model, "--adapter", adapter, "--input-ids", tmp_path / "ids.npy",
                            "--memory", "40KiB", "--backend", "cpu", "--block", 4, "--order", "random", "--outputs", tmp_path / "h.npz")
    assert code == 0, err
    hidden = np.load(tmp_path / "h.npz")["hidden_states"]
    lm = peft.PeftModel.from_pretrained(base(model, torch.float64), str(adapter)).eval()
    with torch.no_grad():
        theirs = lm.base_model.model.model(input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].numpy()
        plain = base(model, torch.float64).model(input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].numpy()
    np.testing.assert_allclose(hidden, theirs, rtol=0, atol=2e-5)  # float32 compute against float64
    assert np.abs(theirs - plain).max() > 1e-1  # the adapter matters
    assert "LoRA r 4, alpha 8 on q_proj,v_proj,o_proj,down_proj" in out
    assert re.search(r"^[1-9]\d* offloads, [1-9]\d* reloads planned", out, re.M)


def test_an_adapter_turnip_finetune_wrote_runs_with_generate_as_peft_runs_it(model, tmp_path, capsys):
    np.save(tmp_path / "d.npy", np.random.default_rng(6).integers(0, VOCAB, (4, 10)))
    code, _, err = turnip(capsys, "finetune", "--weights", model, "--data", tmp_path / "d.npy", "--steps", 3, "--memory", "1MiB",
                          "--backend", "cpu", "--lr", 0.05, "--lora-rank", 2, "--lora-targets", "q_proj,v_proj,down_proj",
                          "--adapter-out", tmp_path / "tuned")
    assert code == 0, err
    stored = SafeTensors.open(tmp_path / "tuned" / WEIGHTS_FILE)
    assert all(np.abs(stored.get(n)).max() > 1e-3 for n in stored.names() if "lora_B" in n)  # trained: B moved from 0
    tokens, out = generate(capsys, model, tmp_path / "tuned", tmp_path)
    expected = [peft_greedy(model, tmp_path / "tuned", p) for p in PROMPTS]
    assert tokens.tolist() == expected
    assert expected != [peft_greedy(model, None, p) for p in PROMPTS]  # the tuned adapter changes the tokens
    assert "LoRA r 2, alpha 4 on q_proj,v_proj,down_proj" in out


# ----- the session -------------------------------------------------------------------------------------------
def test_a_session_with_an_adapter_gives_the_commands_tokens_and_shares_plans_with_one_without(model, adapter, tmp_path, capsys):
    """Sessions with and without an adapter run the same graphs, so the plans one kept in `plan_dir` serve
    the other; what each computes is its own weights' (no value is kept across sessions)."""
    tokens, _ = generate(capsys, model, adapter, tmp_path)
    plans = tmp_path / "plans"
    with Session(weights=model, memory=BUDGET, backend="cpu", plan_dir=plans) as plain:
        without = plain.generate(PROMPTS, NEW)
    assert without.tokens.tolist() == [peft_greedy(model, None, p) for p in PROMPTS]
    config = llama.load_config(str(model))
    for given in (adapter, str(adapter), Adapter.read(adapter, config)[0]):
        with Session(weights=model, memory=BUDGET, backend="cpu", plan_dir=plans, adapter=given) as session:
            result = session.generate(PROMPTS, NEW)
            assert session.adapter.settings == LoraSettings(4, 8, tuple(TARGETS))
        assert (result.tokens == tokens).all()
        assert result.compiles == 0 and result.plans_read > 0  # the plain session's plans
        assert result.bytes_reloaded > 0


def test_session_adapters_that_do_not_fit_are_one_line(model, adapter):
    config = llama.load_config(str(model))
    good = Adapter.read(adapter, config)[0]
    name = "model.layers.0.self_attn.q_proj.lora_A.weight"
    cases = {
        "an adapter tensor of another shape": (Adapter(good.settings, {**good.tensors, name: np.zeros((4, 31), np.float32)}),
                                               rf"adapter tensor '{re.escape(name)}' has shape \[4, 31\], the model needs \[4, 32\]"),
        "a tensor of no target": (Adapter(LoraSettings(4, 8, ("q_proj",)), good.tensors), "adapter tensor '.*v_proj.* is none of the model's"),
        "a missing tensor": (Adapter(good.settings, {n: t for n, t in good.tensors.items() if n != name}), f"adapter has no tensor '{name}'"),
        "neither a folder nor an Adapter": (3, "adapter must be a PEFT LoRA folder's path or an Adapter, got int"),
        "a missing folder": (adapter.parent / "none", "adapter folder '.*none' does not exist"),
        "a name too long": ("x" * 5000, "adapter folder 'x+.*' does not exist"),
    }
    for what, (given, message) in cases.items():
        with pytest.raises(InputError) as err:
            Session(weights=model, memory=BUDGET, backend="cpu", adapter=given)
        assert re.search(message, str(err.value)) and "\n" not in str(err.value), (what, str(err.value))


def test_a_session_with_an_adapter_does_not_fine_tune_it_again_merged(model, adapter):
    with Session(weights=model, memory="1MiB", backend="cpu", adapter=adapter) as session:
        with pytest.raises(InputError, match="the session runs its model with an adapter merged in, so it cannot fine-tune"):
            session.finetune(np.ones((2, 6), np.int64), 1)


def test_a_cuda_session_with_an_adapter_reads_the_untargeted_weights_in_place(model, adapter):
    """On the cuda backend (numba-cuda's simulator) the weights the adapter leaves alone are still read from
    the checkpoint's page-locked map; the merged ones are copied; the tokens are the cpu backend's."""
    from runtime.backends.cuda import simulated
    from test_generate import CUDA_RESERVE

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    prompts = [PROMPTS[1]]
    with Session(weights=model, memory=48 << 10, backend="cpu", adapter=adapter) as session:
        want = session.generate(prompts, 2).tokens
    with Session(weights=model, memory=(48 << 10) + CUDA_RESERVE, backend="cuda", adapter=adapter) as session:
        got = session.generate(prompts, 2).tokens
        kept = session.weights.kept
        mapped = {name for name, value in kept.items() if any(np.shares_memory(value, m) for m in session.host.mappings.values())}
    assert (got == want).all()
    merged = {f"model.layers.{i}.{kind}.{t}.weight" for i in range(2) for t in TARGETS
              for kind in (("self_attn",) if t.endswith(("q_proj", "v_proj", "o_proj")) else ("mlp",))}
    assert merged <= set(kept) and not merged & mapped
    assert "model.layers.0.self_attn.k_proj.weight" in mapped


# ----- merged weights, block by block ------------------------------------------------------------------------
def test_a_merged_weights_lazy_blocks_are_its_merged_weights_blocks(model, adapter):
    """`MergedWeights.lazy`: a targeted weight's blocks (as a graph's feed cuts them) are the blocks of W +
    (alpha / r) B A computed here in float64 from the files; an untargeted weight is the checkpoint's own
    lazy tensor (so the cuda backend may read it in place)."""
    config = llama.load_config(str(model))
    source = llama.CheckpointWeights(model, config)
    merged = MergedWeights(source, Adapter.read(adapter, config)[0])
    stored = SafeTensors.open(adapter / WEIGHTS_FILE)
    module = "model.layers.1.mlp.down_proj"
    a, b = (stored.get(f"{PREFIX}{module}.lora_{x}.weight", np.float64) for x in "AB")
    expected = np.asarray(source[f"{module}.weight"], np.float64) + 2.0 * b @ a
    whole = merged[f"{module}.weight"]
    assert whole.dtype == np.float32
    np.testing.assert_allclose(whole, expected, rtol=0, atol=1e-6)
    lazy = merged.lazy(f"{module}.weight")
    assert isinstance(lazy, MergedTensor)
    for rows, cols in ((slice(0, 16), slice(0, 64)), (slice(16, 32), slice(8, 40)), (slice(5, 6), slice(None))):
        np.testing.assert_array_equal(lazy[rows, cols].materialize(), whole[rows, cols])
    untouched = merged.lazy("model.layers.1.mlp.up_proj.weight")
    assert untouched.mapped() is not None
    np.testing.assert_array_equal(merged["model.layers.1.mlp.up_proj.weight"], source["model.layers.1.mlp.up_proj.weight"])


# ----- bad input ---------------------------------------------------------------------------------------------
def damaged(adapter: Path, tmp_path: Path, change) -> Path:
    """A copy of the adapter folder with `change(folder)` made to it."""
    folder = tmp_path / "bad"
    shutil.copytree(adapter, folder)
    change(folder)
    return folder


def _edit_config(folder: Path, **fields) -> None:
    import json

    doc = json.loads((folder / CONFIG_FILE).read_text())
    (folder / CONFIG_FILE).write_text(json.dumps({**doc, **fields}))


BAD = {
    "a missing folder": (lambda a, p: ["--adapter", p / "none"], "adapter folder '.*none' does not exist"),
    "no adapter_config.json": (lambda a, p: ["--adapter", damaged(a, p, lambda f: (f / CONFIG_FILE).unlink())],
                               "adapter folder '.*bad' has no adapter_config.json"),
    "a target the model lacks": (lambda a, p: ["--adapter", damaged(a, p, lambda f: _edit_config(f, target_modules=["c_attn"]))],
                                 "targets 'c_attn', which the model lacks"),
    "tensors of another rank": (lambda a, p: ["--adapter", damaged(a, p, lambda f: _edit_config(f, r=3))],
                                r"has shape \[4, 32\], the model needs \[3, 32\]"),
    "--outputs over the adapter's weights": (lambda a, p: ["--adapter", a, "--outputs", a / WEIGHTS_FILE],
                                             f"--outputs .*{WEIGHTS_FILE} is a file of --adapter .*: writing it would destroy the input"),
    "--trace over the adapter's config": (lambda a, p: ["--adapter", a, "--trace", a / CONFIG_FILE],
                                          f"--trace .*{CONFIG_FILE} is a file of --adapter"),
}
COMMANDS = {"generate": ["--input-ids", "{ids}", "--max-new-tokens", 2],
            "llama": ["--input-ids", "{ids}"]}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", BAD)
def test_bad_adapters_and_outputs_over_them_are_one_line_and_write_nothing(model, adapter, tmp_path, capsys, command, case):
    np.save(tmp_path / "ids.npy", PROMPTS[0])
    flags = BAD[case][0](adapter, tmp_path)
    rest = [str(a).format(ids=tmp_path / "ids.npy") for a in COMMANDS[command]]
    outputs = [] if "--outputs" in flags else ["--outputs", tmp_path / "o.npz"]
    watched = [*tmp_path.rglob("*"), *adapter.iterdir()]
    before = {p: p.stat().st_mtime_ns for p in watched}
    code, _, err = turnip(capsys, command, "--weights", model, "--memory", "1MiB", "--backend", "cpu", *rest, *outputs, *flags)
    assert code != 0
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"turnip {command}: error: ") and re.search(BAD[case][1], err), err
    assert {p: p.stat().st_mtime_ns for p in watched} == before and not (tmp_path / "o.npz").exists()
    assert set(tmp_path.rglob("*")) == set(before) - set(adapter.iterdir())


def test_help_of_both_commands_names_the_adapter_flag(capsys):
    for command in COMMANDS:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--adapter DIR" in capsys.readouterr().out

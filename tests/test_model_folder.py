"""A model folder is read, never written: no output of any command replaces a file of it (config, shards,
index, tokenizer files, or any other file it holds), nor an ids file or a plan; and one rule decides
which files a folder may hold: each resolves (links followed) inside the folder, or inside the blobs of
the same Hugging Face cache repository (`models--ORG--NAME/snapshots/<rev>/x -> ../../blobs/<sha>`, what
`huggingface-cli download` leaves), anything else is refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from frontend.safetensors import SafeTensors, save_file, save_sharded
from frontend.workloads import llama
from frontend.workloads.llama.config import from_hf
from turnip_cli.main import main as turnip
from turnip_ir import files
from turnip_ir.errors import InputError
from turnip_ir.limits import quoted

CONFIG = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "vocab_size": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
          "torch_dtype": "float32"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                   "tokenizer.model")


def model_folder(folder: Path, shards: int = 0) -> dict[str, bytes]:
    """A tiny HF model folder (random weights, tokenizer files beside them); returns every file's bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    weights = dict(llama.RandomWeights(from_hf(CONFIG, "c"), seed=3))
    if shards:
        save_sharded(weights, folder, shards)
    else:
        save_file(weights, folder / "model.safetensors")
    for name in TOKENIZER_FILES:
        (folder / name).write_text(json.dumps({"name": name}))
    return snapshot(folder)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def hf_cache(root: Path, shards: int = 2) -> Path:
    """`root/models--org--tiny` as the Hugging Face cache lays it out; returns the snapshot folder, whose
    every file is a relative link into `blobs`."""
    repo = root / "models--org--tiny"
    made = repo / "made"
    model_folder(made, shards)
    (repo / "blobs").mkdir()
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for k, path in enumerate(sorted(made.iterdir())):
        blob = repo / "blobs" / f"{k:040x}"
        path.rename(blob)
        (snap / path.name).symlink_to(Path("..", "..", "blobs", blob.name))
    made.rmdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snap


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ----- no output over a file a command reads ------------------------------------------------------------------

MODEL_RUNS = {
    "llama": ["llama", "--tokens", "4", "--memory", "1MiB", "--backend", "cpu"],
    "generate": ["generate", "--prompt-tokens", "4", "--max-new-tokens", "1", "--memory", "1MiB", "--backend", "cpu"],
}


@pytest.mark.parametrize("command", list(MODEL_RUNS))
@pytest.mark.parametrize("source, flag, name", [
    ("--weights", "--outputs", "model.safetensors"),
    ("--weights", "--trace", "config.json"),
    ("--config", "--outputs", "config.json"),  # --config FOLDER reads FOLDER/config.json
    ("--weights", "--trace", "tokenizer.json"),
    ("--weights", "--outputs", "tokenizer_config.json"),
    ("--weights", "--trace", "generation_config.json"),
    ("--weights", "--outputs", "special_tokens_map.json"),
    ("--weights", "--outputs", "tokenizer.model"),
    ("--config", "--trace", "model.safetensors"),
])
def test_no_output_replaces_a_file_of_the_model_folder(tmp_path, capsys, command, source, flag, name):
    folder = tmp_path / "ck"
    before = model_folder(folder)
    assert turnip([*MODEL_RUNS[command], source, str(folder), flag, str(folder / name)]) == 1
    line = _one_line(capsys)
    assert f"{flag} {folder / name} is a file of {source} {folder}" in line
    assert "writing it would destroy the input" in line
    assert snapshot(folder) == before


@pytest.mark.parametrize("command", list(MODEL_RUNS))
@pytest.mark.parametrize("name", ["model.safetensors.index.json", "model-00002-of-00002.safetensors"])
def test_no_output_replaces_an_index_or_a_shard(tmp_path, capsys, command, name):
    folder = tmp_path / "ck"
    before = model_folder(folder, shards=2)
    assert turnip([*MODEL_RUNS[command], "--weights", str(folder), "--outputs", str(folder / name)]) == 1
    assert "a file of --weights" in _one_line(capsys)
    assert snapshot(folder) == before


@pytest.mark.parametrize("command", list(MODEL_RUNS))
@pytest.mark.parametrize("link", ["symlink", "hardlink", "blob"])
def test_an_output_that_is_a_model_file_by_another_name_is_refused(tmp_path, capsys, command, link):
    """A link to a model file, a hard link to one, or the cache blob a snapshot's file links to."""
    if link == "blob":
        folder = hf_cache(tmp_path)
        out = (folder / "config.json").resolve()
    else:
        folder = tmp_path / "ck"
        model_folder(folder)
        out = tmp_path / "out.npz"
        (out.symlink_to if link == "symlink" else out.hardlink_to)(folder / "model.safetensors")
    before = snapshot(tmp_path)
    assert turnip([*MODEL_RUNS[command], "--weights", str(folder), "--outputs", str(out)]) == 1
    model_file = "config.json" if link == "blob" else "model.safetensors"
    assert f"--outputs {out} is {folder / model_file}, a file of --weights {folder}: writing it would destroy the input" in _one_line(capsys)
    assert snapshot(tmp_path) == before


def test_generate_writes_no_output_over_a_kept_plan(tmp_path, capsys):
    plans = tmp_path / "plans"
    plans.mkdir()
    plan = plans / ("0" * 40 + ".json")
    plan.write_text("{}")
    assert turnip([*MODEL_RUNS["generate"], "--config", "tiny", "--plan-dir", str(plans), "--trace", str(plan)]) == 1
    assert f"a file of --plan-dir {plans}" in _one_line(capsys)
    assert plan.read_text() == "{}"


def test_build_writes_no_taskgraph_over_the_config_of_a_folder(tmp_path, capsys):
    folder = tmp_path / "ck"
    before = model_folder(folder)
    assert turnip(["build", "llama", "--config", str(folder), "-o", str(folder / "config.json")]) == 1
    assert "a file of --config" in _one_line(capsys)
    assert snapshot(folder) == before


def test_a_new_file_inside_a_model_folder_may_be_written(tmp_path):
    folder = tmp_path / "ck"
    model_folder(folder)
    (folder / "sub").mkdir()
    files.check_outputs({"--outputs": folder / "hidden.npz", "--trace": folder / "sub" / ".." / "trace.json"},
                        {"--weights": folder})
    with pytest.raises(InputError, match="a file of --weights"):
        files.check_outputs({"--outputs": folder / "sub" / ".." / "config.json"}, {"--weights": folder})


# ----- one rule for the files a model folder holds ------------------------------------------------------------

@pytest.mark.parametrize("shards", [0, 2])
def test_weights_may_be_a_snapshot_folder_of_the_hugging_face_cache(tmp_path, capsys, shards):
    snap = hf_cache(tmp_path, shards)
    plain = tmp_path / "plain"
    model_folder(plain, shards)
    outs = []
    for folder in (snap, plain):
        outs.append(tmp_path / f"{folder.name}.npz")
        assert turnip([*MODEL_RUNS["llama"], "--weights", str(folder), "--outputs", str(outs[-1])]) == 0, capsys.readouterr().err
    assert np.array_equal(np.load(outs[0])["hidden_states"], np.load(outs[1])["hidden_states"])
    assert SafeTensors.open(snap / ("model.safetensors.index.json" if shards else "model.safetensors")).names()


def test_a_link_to_the_snapshot_folder_is_the_snapshot(tmp_path):
    snap = hf_cache(tmp_path)
    (tmp_path / "tiny").symlink_to(snap)
    assert llama.load_config(str(tmp_path / "tiny")).hidden_size == CONFIG["hidden_size"]
    assert len(SafeTensors.open(tmp_path / "tiny")) == len(SafeTensors.open(snap))


def _relink(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"])
@pytest.mark.parametrize("layout", ["plain", "cache"])
def test_a_file_that_links_out_of_the_folder_is_refused(tmp_path, capsys, name, layout):
    """Every file the folder holds, whether a link out of a plain folder or out of a snapshot's repository
    (to another repository's blobs): the linked file is valid, so only the rule refuses it."""
    folder = hf_cache(tmp_path) if layout == "cache" else tmp_path / "ck"
    if layout == "plain":
        model_folder(folder, shards=2)
    elsewhere = hf_cache(tmp_path / "other") / name  # the same file, in another model's cache repository
    target = elsewhere.resolve()
    _relink(folder / name, target)
    for command in MODEL_RUNS:
        assert turnip([*MODEL_RUNS[command], "--weights", str(folder)]) == 1
        line = _one_line(capsys)
        assert f"{name!r} leads to {str(target)!r}, outside the model folder '{folder}'" in line
    with pytest.raises(InputError, match="outside the model folder"):
        llama.CheckpointWeights(folder, from_hf(CONFIG, "c")) if name != "config.json" else llama.load_config(str(folder))


def test_a_config_linked_to_a_system_file_is_never_read(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ck"
    model_folder(folder)
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:hunter2:/root:/bin/sh\n")
    _relink(folder / "config.json", secret)
    read = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self) or real(self, *a, **k))
    assert turnip([*MODEL_RUNS["llama"], "--weights", str(folder)]) == 1
    line = _one_line(capsys)
    assert "outside the model folder" in line and "hunter2" not in line
    assert not any(p.resolve() == secret for p in read)


@pytest.mark.parametrize("shard", ["a\x00b.safetensors", "loop.safetensors"])
def test_a_shard_named_with_a_nul_or_a_link_loop_is_one_line(tmp_path, shard):
    folder = tmp_path / "ck"
    model_folder(folder, shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {name: shard for name in index["weight_map"]}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    if shard == "loop.safetensors":
        (folder / shard).symlink_to(folder / shard)
    for opened in (folder, folder / "model.safetensors.index.json"):  # the folder's check, the index's
        with pytest.raises(InputError, match=f"{re.escape(quoted(shard))} in .* cannot be resolved") as caught:
            SafeTensors.open(opened)
        assert "\x00" not in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["tokenizer.json", "original/params.json", "original"])
def test_any_file_of_a_folder_that_links_out_is_refused_when_the_folder_opens(tmp_path, capsys, name):
    """Not only the files turnip reads: a tokenizer file or a folder linking out is refused before any
    reader (a tokenizer library, which follows links) opens it; dot folders are a clone's records."""
    folder = tmp_path / "ck"
    model_folder(folder)
    (folder / "original").mkdir()
    (folder / "original" / "params.json").write_text("{}")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").symlink_to("/etc/hostname")
    assert llama.load_config(str(folder)).vocab_size == CONFIG["vocab_size"]  # dot folders aside, all inside
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "params.json").write_text("{}")
    target = secret if name == "original" else secret / "params.json"
    if name == "original":
        (folder / name / "params.json").unlink()
        (folder / name).rmdir()
    else:
        (folder / name).unlink()
    (folder / name).symlink_to(target)
    for command in MODEL_RUNS:
        assert turnip([*MODEL_RUNS[command], "--weights", str(folder)]) == 1
        assert f"model folder file {name!r} leads to {str(target)!r}, outside the model folder" in _one_line(capsys)
    assert turnip([*MODEL_RUNS["llama"], "--config", str(folder)]) == 1
    assert "outside the model folder" in _one_line(capsys)

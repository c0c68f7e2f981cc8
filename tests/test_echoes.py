"""What a diagnostic echoes of its input: a name is quoted as Python's repr writes it (a NUL, a newline or
a terminal escape shows escaped, so the message stays one line of plain text) and a long one is cut, so
a 100 KB einsum equation or inline --config is not printed back in full."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from frontend.safetensors import INDEX_FILE, SafeTensors, save_file
from turnip_cli.main import main as turnip
from turnip_ir.errors import InputError
from turnip_ir.limits import quoted
from turnip_ir.taskgraph import TaskGraph

LONG = 100_000


def _one_line(capsys, limit: int = 600) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "\x00" not in err and "\x1b" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert len(lines[0]) < limit, lines[0][:2000]
    return lines[0]


def test_quoted_escapes_and_cuts():
    assert quoted("w") == "'w'"
    assert quoted("a\x00b\nc\x1b[31m") == r"'a\x00b\nc\x1b[31m'"
    assert quoted("x" * LONG) == repr("x" * 77 + "...")


@pytest.mark.parametrize("shard", ["a\x00b.safetensors", "a\nb.safetensors", "\x1b[2J.safetensors", "s" * LONG])
def test_a_shard_name_is_echoed_escaped_and_cut(tmp_path, capsys, shard):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "vocab_size": 32}))
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": shard}}))
    assert turnip(["llama", "--weights", str(tmp_path), "--tokens", "4", "--memory", "1MiB", "--backend", "cpu"]) == 1
    assert quoted(shard) in _one_line(capsys)


@pytest.mark.parametrize("name", ["w\x00", "w\nx", "n" * LONG])
def test_a_tensor_name_from_a_header_is_echoed_escaped_and_cut(tmp_path, name):
    header = json.dumps({name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    with pytest.raises(InputError) as caught:
        SafeTensors.open(path)
    message = str(caught.value)
    assert message.startswith(f"tensor {quoted(name)} in") and "\n" not in message and len(message) < 600


def test_a_long_shape_in_a_header_is_cut(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [1.5] * LONG, "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    with pytest.raises(InputError, match=r"shape \[1\.5, 1\.5, .*\.\.\. must be a list of sizes") as caught:
        SafeTensors.open(path)
    assert len(str(caught.value)) < 600


def test_a_100_kb_einsum_equation_is_cut(tmp_path, capsys):
    graph = TaskGraph()
    graph.kernel("einsum", graph.input((4, 4), id="x"), id="e", equation="ij->ji")
    doc = graph.to_json()
    for node in doc["nodes"]:
        if node["id"] == "e":
            node["attrs"]["equation"] = "i" * LONG
    (tmp_path / "g.json").write_text(json.dumps(doc))
    assert turnip(["run", str(tmp_path / "g.json"), "--memory", "1MiB", "--backend", "sim"]) == 1
    assert "einsum equation 'iiiiiiii" in _one_line(capsys)


@pytest.mark.parametrize("workload, config, message", [
    ("matmul", json.dumps({"n": "x" * LONG}), "MatmulConfig.n must be a positive integer, got 'xxx"),
    ("matmul", "{" + "x" * LONG, "is neither a preset"),
    ("llama", "x" * LONG, "is neither a preset"),
], ids=["value", "broken-json", "llama"])
def test_a_100_kb_inline_config_is_cut(tmp_path, capsys, workload, config, message):
    assert turnip(["build", workload, "--config", config, "-o", str(tmp_path / "g.json")]) == 1
    assert message in _one_line(capsys)


def test_a_deep_inline_config_is_one_line(tmp_path, capsys):
    assert turnip(["build", "matmul", "--config", "[" * LONG + "]" * LONG, "-o", str(tmp_path / "g.json")]) == 1
    assert "is neither a preset" in _one_line(capsys)


def test_an_unknown_key_of_an_inline_config_is_escaped(tmp_path, capsys):
    assert turnip(["build", "matmul", "--config", json.dumps({"bad\nkey": 1}), "-o", str(tmp_path / "g.json")]) == 1
    assert r"unknown key 'bad\nkey'" in _one_line(capsys)


def test_valid_names_read_as_before(tmp_path):
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    assert SafeTensors.open(tmp_path / "m.safetensors").get("w").tolist() == [1.0, 1.0]


@pytest.mark.parametrize("command", [["llama", "--tokens", "4"], ["generate", "--prompt-tokens", "4", "--max-new-tokens", "1"]])
def test_a_weights_folder_name_too_long_for_the_system_is_one_short_line(capsys, command):
    assert turnip([*command, "--weights", "w" * LONG, "--memory", "1MiB", "--backend", "cpu"]) == 1
    assert "weights folder 'wwwwwwww" in _one_line(capsys)

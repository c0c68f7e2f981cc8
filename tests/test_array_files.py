"""Arrays read from .npy and .npz files (`turnip llama` and `turnip generate --input-ids`, `turnip run
--inputs`): a header is checked before numpy allocates what it claims, and a folder, a text file, pickled
objects, an .npz where one prompt goes or an .npy where an .npz goes are each one line saying what was
expected."""

from __future__ import annotations

import io
import json
import signal
import zipfile
from pathlib import Path

import numpy as np
import pytest

from passes.pipeline import compile_taskgraph
from frontend.workloads import matmul
from runtime.array_files import read_arrays
from turnip_cli.main import main as turnip
from turnip_ir.errors import InputError

HUGE = 10**11


def _npy(array) -> bytes:
    data = io.BytesIO()
    np.save(data, array, allow_pickle=True)
    return data.getvalue()


def _claiming(count: int) -> bytes:
    """An .npy of 8 int64 ids whose header claims `count` of them (the header's padding shrunk to keep its length)."""
    data = _npy(np.arange(8, dtype=np.int64))
    end = data.index(b"\n") + 1
    header = data[:end].replace(b"(8,)", f"({count},)".encode())
    return header[: end - 1] + b"\n" + data[end:]


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as packed:
        for name, data in members.items():
            packed.writestr(name, data)
    return out.getvalue()


@pytest.fixture
def deadline():
    def expired(*_):
        raise TimeoutError("still running after 10 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


LLAMA = ["llama", "--config", "tiny", "--memory", "1MiB", "--backend", "cpu", "--input-ids"]
GENERATE = ["generate", "--config", "tiny", "--memory", "1MiB", "--backend", "cpu", "--max-new-tokens", "1", "--input-ids"]


# ----- a header that claims more than the file holds ------------------------------------------------------------

def test_the_claiming_header_is_a_valid_npy_header():
    assert np.lib.format.read_array_header_1_0(_as_stream(_claiming(HUGE)))[0] == (HUGE,)
    assert np.load(io.BytesIO(_claiming(8))).tolist() == list(range(8))


def _as_stream(data: bytes):
    stream = io.BytesIO(data)
    np.lib.format.read_magic(stream)
    return stream


@pytest.mark.parametrize("argv, packed", [(LLAMA, False), (GENERATE, False), (GENERATE, True)], ids=["llama", "generate", "generate-npz"])
def test_ids_whose_header_claims_10_to_the_11_values_are_one_line(tmp_path, capsys, deadline, argv, packed):
    path = tmp_path / ("ids.npz" if packed else "ids.npy")
    path.write_bytes(_zip({"a.npy": _claiming(HUGE)}) if packed else _claiming(HUGE))
    assert turnip([*argv, str(path)]) == 1
    line = _one_line(capsys)
    assert f"its header claims {HUGE} values of int64 ({8 * HUGE} bytes), the file holds 64 bytes of data" in line


def test_run_inputs_whose_header_claims_10_to_the_11_values_are_one_line(tmp_path, capsys, deadline):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(compile_taskgraph(matmul.build(matmul.PRESETS["small"]).taskgraph(), 12288).to_json()))
    inputs = tmp_path / "in.npz"
    inputs.write_bytes(_zip({"x.npy": _claiming(HUGE)}))
    assert turnip(["run", str(plan), "--backend", "cpu", "--inputs", str(inputs)]) == 1
    assert f"array 'x' of inputs file '{inputs}': its header claims {HUGE} values" in _one_line(capsys)


def test_arrays_past_the_host_memory_available_are_refused_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(1000, dtype=np.int64))
    monkeypatch.setattr("runtime.host_memory.available_bytes", lambda: 4000)
    with pytest.raises(InputError, match="needs 8000 bytes .* of host memory for the arrays of token ids file"):
        read_arrays(path, "token ids file", "ids")


# ----- what was expected ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [LLAMA, GENERATE], ids=["llama", "generate"])
def test_a_folder_of_ids_says_it_is_a_folder(tmp_path, capsys, argv):
    assert turnip([*argv, str(tmp_path)]) == 1
    assert f"token ids file '{tmp_path}' is a folder; expected a .npy" in _one_line(capsys)


@pytest.mark.parametrize("argv", [LLAMA, GENERATE], ids=["llama", "generate"])
def test_a_text_file_of_ids_says_what_was_expected(tmp_path, capsys, argv):
    path = tmp_path / "ids.txt"
    path.write_text("1 2 3\n")
    assert turnip([*argv, str(path)]) == 1
    line = _one_line(capsys)
    assert f"token ids file '{path}' is neither a .npy nor an .npz file; expected a .npy of integer token ids" in line
    assert "pickle" not in line


@pytest.mark.parametrize("argv", [LLAMA, GENERATE], ids=["llama", "generate"])
def test_pickled_ids_say_they_hold_python_objects(tmp_path, capsys, argv):
    path = tmp_path / "ids.npy"
    path.write_bytes(_npy(np.array([1, 2, 3], dtype=object)))
    assert turnip([*argv, str(path)]) == 1
    assert "holds Python objects (pickled data), not numbers; expected a .npy" in _one_line(capsys)


def test_llama_given_an_npz_of_prompts_says_it_takes_one(tmp_path, capsys):
    path = tmp_path / "prompts.npz"
    np.savez(path, a=np.arange(3), b=np.arange(4))
    assert turnip([*LLAMA, str(path)]) == 1
    assert _one_line(capsys).endswith(f"token ids file '{path}' is an .npz: turnip llama takes one prompt, a .npy of "
                                      "integer token ids, shape [T] or [1, T] (turnip generate takes an .npz of several)")


def test_run_given_an_npy_as_inputs_says_it_takes_an_npz(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(compile_taskgraph(matmul.build(matmul.PRESETS["small"]).taskgraph(), 12288).to_json()))
    np.save(tmp_path / "x.npy", np.zeros(3))
    assert turnip(["run", str(plan), "--backend", "cpu", "--inputs", str(tmp_path / "x.npy")]) == 1
    assert "is an .npy; expected an .npz of input tensors keyed by taskgraph input id" in _one_line(capsys)


@pytest.mark.parametrize("member", [b"plain text, not an array", _npy(np.arange(3))[:20]], ids=["text", "cut-header"])
def test_an_npz_member_that_is_not_an_npy_is_one_line(tmp_path, capsys, member):
    path = tmp_path / "prompts.npz"
    path.write_bytes(_zip({"a.npy": _npy(np.arange(3)), "b.npy": member}))
    assert turnip([*GENERATE, str(path)]) == 1
    line = _one_line(capsys)
    assert f"array 'b' of token ids file '{path}' is not a readable .npy: its header is damaged" in line


def test_a_long_reason_is_cut_at_a_word(tmp_path):
    from runtime.array_files import _reason

    reason = _reason(ValueError("word " * 100))
    assert reason.endswith(" ...") and reason[:-4].split(" ")[-1] == "word"


def test_valid_files_still_read(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(5))
    np.savez(tmp_path / "b.npz", x=np.arange(2), y=np.ones((2, 2)))
    assert read_arrays(tmp_path / "a.npy", "ids", "ids").tolist() == list(range(5))
    both = read_arrays(tmp_path / "b.npz", "ids", "ids")
    assert list(both) == ["x", "y"] and both["y"].shape == (2, 2)
    (tmp_path / "empty.npz").write_bytes(_zip({}))
    assert read_arrays(tmp_path / "empty.npz", "ids", "ids") == {}
    assert isinstance(Path(tmp_path / "a.npy"), Path)

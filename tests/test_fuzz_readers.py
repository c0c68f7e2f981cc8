"""Mutation fuzzing of every reader: any damage to a valid file must end in one `TurnipError` line, fast;
never another exception, a traceback or a hang.

Readers: taskgraph and memgraph JSON and IR text (through `turnip-opt`), an .npz of inputs (`turnip run
--inputs`), an .npy of token ids (`turnip llama --input-ids`), a model's config.json (`load_config`),
safetensors files and their model.safetensors.index.json (`SafeTensors.open`), plan files of --plan-dir
(`read_plan`: a proven plan or none, whatever the file holds), and the Python API's arguments
(`Session`, `generate`). A seeded mutator flips, deletes and inserts bytes, deletes fields and changes
numbers of valid seed files written to tmp_path; configs also get non-finite, mistyped and enormous values
in any field (a config that still reads must be sane: `_sane`), and configs, headers and indexes get JSON
nested 100,000 deep, integers of thousands of digits, NaN and Infinity anywhere in them (`hostile_text`).
Through a CLI the property is: exit 0, or a non-zero exit with one line on stderr; no traceback; no file
in the folder but the named outputs created or changed; an output only on success, and then whole.
The CI part runs a few hundred cases per reader in seconds; `-m slow` runs ten times as many.

Found this way: xDSL's lexer backtracks exponentially on an unclosed string literal (a stray `"` hung
the parser for minutes), xDSL raised VerifyException and ValueError while parsing, and the JSON readers
let negative devices, list-valued dtypes and integers past 64 bits through to the IR builders.
"""

from __future__ import annotations

import copy
import io
import json
import math
import random
import signal
import struct
from pathlib import Path

import numpy as np
import pytest

from passes.pipeline import compile_taskgraph
from turnip_ir.verifier import verify_memgraph
from turnip_ir.errors import TurnipError
from turnip_ir.io import check_module, graph_to_module, module_to_graph, parse_ir, parse_json
from turnip_ir.memgraph import MemGraph
from frontend.workloads import matmul

ROOT = Path(__file__).parent
VALUES = [None, -1, 0, 1, 2.5, "x", "", [], {}, [1], ["a"], [[1]], True, 10**20, "matmul", "input", [0, 1], [-5, 3]]
TOKENS = ['"', "%n0", "-1", "99999999999999999999999", "<", ">", ",", "}", "{", ":", "turnip.nope", "tensor<4xf32>",
          "i8", "bf16", "after[", "]", "!turnip.token", "<-1, 0, 4>", '"a\\"b"', "{task = 3}", "\n", "->", "("]


class Hang(Exception):
    pass


@pytest.fixture
def deadline():
    def alarm(*_):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    yield lambda seconds: signal.alarm(seconds)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _must_fail_cleanly(action, deadline) -> None:
    deadline(5)
    try:
        action()
    except TurnipError as err:
        assert "\n" not in str(err), str(err)
    finally:
        deadline(0)


def _mutated_json(rng: random.Random, doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    target = rng.choice(doc["nodes"]) if rng.random() < 0.8 else doc
    key = rng.choice([*target.keys(), "attrs", "extra", "kernel"])
    if rng.random() < 0.2:
        target.pop(key, None)
    else:
        target[key] = rng.choice(VALUES)
    return doc


def _load_json_fully(text: str) -> None:
    graph = parse_json(text, "f.json")
    check_module(graph_to_module(graph), "f.json")
    if isinstance(graph, MemGraph):
        verify_memgraph(graph)
    else:
        compile_taskgraph(graph, 1 << 20)


def test_damaged_json_fails_cleanly(deadline):
    taskgraph = matmul.build(matmul.PRESETS["small"]).taskgraph()  # 64x64 in 32x32 tiles over 3 GPUs
    docs = [taskgraph.to_json(), compile_taskgraph(taskgraph, 12288).to_json()]
    rng = random.Random(7)
    for _ in range(600):
        text = json.dumps(_mutated_json(rng, rng.choice(docs)))
        _must_fail_cleanly(lambda: _load_json_fully(text), deadline)


def test_damaged_ir_fails_cleanly(deadline):
    texts = [p.read_text() for p in sorted((ROOT / "golden" / "valid").glob("*.out.mlir"))]
    rng = random.Random(11)
    for _ in range(600):
        words = rng.choice(texts).split(" ")
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(words))
            choice = rng.random()
            if choice < 0.4:
                words[k] = rng.choice(TOKENS)
            elif choice < 0.7:
                words.insert(k, rng.choice(TOKENS))
            else:
                del words[k]
        text = " ".join(words)
        _must_fail_cleanly(lambda: module_to_graph(parse_ir(text, "f.mlir")), deadline)



# ----- the harness for the other readers ---------------------------------------------------------------------

@pytest.fixture(autouse=True)
def slow_only_when_asked(request):
    """The `slow` runs (ten times the cases, minutes) run only when `-m slow` selects them."""
    if request.node.get_closest_marker("slow") and "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a slow fuzz run: select it with -m slow")


def both(test):
    """Run `test` as a CI case and again, ten times longer, as a `slow` one."""
    return pytest.mark.parametrize("scale", [1, pytest.param(10, marks=pytest.mark.slow)], ids=["ci", "slow"])(test)


NUMBERS = [0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**20, -(10**20), 0.5, -0.0, 1e308, float("nan"), "1", None, True, [], {}]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One to three byte-level changes: flip a bit, set a byte, delete or duplicate a range, or truncate."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not data:
            break
        k = rng.randrange(len(data))
        choice = rng.random()
        if choice < 0.35:
            data[k] ^= 1 << rng.randrange(8)
        elif choice < 0.55:
            data[k] = rng.choice(b'\x00\xff"{}[],:-0123456789e.')
        elif choice < 0.7:
            del data[k:k + rng.randint(1, 16)]
        elif choice < 0.85:
            data[k:k] = data[k:k + rng.randint(1, 16)]
        else:
            del data[k:]
    return bytes(data)


def mutate_doc(rng: random.Random, doc):
    """A JSON document with one field deleted, one number changed or one value replaced, somewhere inside."""
    doc = copy.deepcopy(doc)
    parent, key = _pick(rng, doc)
    if parent is None:
        return rng.choice(NUMBERS)
    choice = rng.random()
    if choice < 0.25 and isinstance(parent, dict):
        parent.pop(key)
    elif choice < 0.75 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        value = parent[key]
        parent[key] = rng.choice([value + 1, value - 1, -value, value * 1000, 0, 2**63, 10**20, 0.5, float(value), str(value)])
    else:
        parent[key] = rng.choice([*NUMBERS, "x", "", ["a"], {"a": 1}])
    return doc


def _pick(rng: random.Random, doc):
    """A random (container, key) inside `doc`, found by a short random walk; (None, None) for the root."""
    parent, key, node = None, None, doc
    while isinstance(node, (dict, list)) and node and (parent is None or rng.random() < 0.6):
        parent = node
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        node = node[key]
    return parent, key



REPO = ROOT.parent


def _where(err: BaseException) -> tuple[str, str, str]:
    """(file, function, exception type) of the innermost frame of the project's own code (not the tests)."""
    place = ("?", "?")
    tb = err.__traceback__
    while tb is not None:
        file = Path(tb.tb_frame.f_code.co_filename)
        if file.is_relative_to(REPO) and not file.is_relative_to(ROOT):
            place = (str(file.relative_to(REPO)), tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return (*place, type(err).__name__)


def _escaped(err: Exception, context: str) -> None:
    """Any exception other than a one-line `TurnipError` fails the test here, naming where it escaped."""
    key = _where(err)
    raise AssertionError(f"{context}: {key[2]} escaped from {key[0]} {key[1]}(): {err}") from err



def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def cli_case(main, argv: list[str], folder: Path, outputs: list[str], capsys, whole) -> None:
    """Run one CLI call in-process and check the property (module docstring); `whole(path)` reads an output."""
    before = _listing(folder)
    signal.alarm(20)  # a hang fails the test instead of stalling the run
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    except Exception as err:  # in a process: a traceback
        capsys.readouterr()
        _escaped(err, " ".join(argv))
        for name in outputs:
            (folder / name).unlink(missing_ok=True)
        return None
    finally:
        signal.alarm(0)
    out, err = capsys.readouterr()
    context = f"{' '.join(argv)}: exit {code}, stderr {err!r}"
    assert "Traceback" not in out + err, context
    after = _listing(folder)
    changed = {name for name in after if before.get(name) != after[name]} | (set(before) - set(after))
    assert changed <= set(outputs), f"{context}: touched {sorted(changed - set(outputs))}"
    if code == 0:
        for name in outputs:
            whole(folder / name)
    else:
        assert len(err.strip().splitlines()) == 1, context
        assert not any((folder / name).exists() for name in outputs), f"{context}: an output of a failed run"
    for name in outputs:
        (folder / name).unlink(missing_ok=True)
    return code


def both_outcomes(codes: list) -> None:
    """A fuzz run that never succeeds (or never fails) checks less than it seems to."""
    assert 0 in codes and any(code not in (0, None) for code in codes), codes


def reader_case(read, path: Path, folder: Path) -> None:
    """Call a reader in-process: it returns, or raises one `TurnipError` line; it writes nothing."""
    before = _listing(folder)
    signal.alarm(20)
    try:
        read(path)
    except TurnipError as err:
        assert "\n" not in str(err), str(err)
    except Exception as err:
        _escaped(err, f"{path}: {path.read_bytes()[:300]!r}")
    finally:
        signal.alarm(0)
    assert _listing(folder) == before, f"{path}: the reader changed the folder"


@pytest.fixture
def alarm():
    def hang(*_):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, hang)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _json_whole(path: Path) -> None:
    json.loads(path.read_text())


def _mlir_whole(path: Path) -> None:
    module_to_graph(parse_ir(path.read_text(), str(path)))


def _npz_whole(path: Path) -> None:
    with np.load(path) as data:
        assert data.files


# ----- taskgraph and memgraph JSON, IR text: turnip-opt -------------------------------------------------------

def _opt_seeds(folder: Path) -> dict[str, str]:
    taskgraph = matmul.build(matmul.PRESETS["small"]).taskgraph()
    return {
        "taskgraph.json": json.dumps(taskgraph.to_json()),
        "memgraph.json": json.dumps(compile_taskgraph(taskgraph, 12288).to_json()),
        "graph.mlir": (ROOT / "golden" / "valid" / "memgraph_issue.mlir").read_text(),
    }


@both
def test_turnip_opt_reads_damaged_graphs_cleanly(tmp_path, capsys, alarm, scale) -> None:
    from turnip_cli.opt import main

    seeds = _opt_seeds(tmp_path)
    rng = random.Random(21)
    codes: list = []
    for _ in range(150 * scale):
        name = rng.choice(list(seeds))
        text = seeds[name]
        if name.endswith(".json") and rng.random() < 0.6:
            data = json.dumps(mutate_doc(rng, json.loads(text))).encode()
        else:
            data = mutate_bytes(rng, text.encode())
        (tmp_path / name).write_bytes(data)
        pipeline = "turnip-memgraph{budget=12288}" if name == "taskgraph.json" else "turnip-verify-memgraph"
        out = "out.mlir" if name.endswith(".mlir") else "out.json"
        reader = _mlir_whole if out == "out.mlir" else _json_whole
        argv = [str(tmp_path / name), "-p", pipeline, "--emit", out.rsplit(".", 1)[1], "-o", str(tmp_path / out)]
        codes.append(cli_case(main, argv, tmp_path, [out], capsys, reader))
    both_outcomes(codes)


# ----- .npz inputs: turnip run --inputs ------------------------------------------------------------------------

def _npz(arrays: dict) -> bytes:
    data = io.BytesIO()
    np.savez(data, **arrays)
    return data.getvalue()


def mutate_arrays(rng: random.Random, arrays: dict[str, np.ndarray]) -> dict:
    """Arrays with one key dropped or added, or one array of another dtype, shape or contents."""
    arrays = dict(arrays)
    key = rng.choice(list(arrays))
    array = arrays[key]
    choice = rng.randrange(8)
    if choice == 0:
        del arrays[key]
    elif choice == 1:
        arrays["stray"] = array
    elif choice == 2:
        arrays[key] = array.astype(rng.choice(["float64", "float16", "int8", "int64", "uint64", "bool", "complex64"]))
    elif choice == 3:
        arrays[key] = array.reshape(-1)
    elif choice == 4:
        arrays[key] = array[: rng.randrange(len(array))]
    elif choice == 5:
        arrays[key] = np.asarray(array.flat[0])
    elif choice == 6:
        arrays[key] = np.full_like(array, rng.choice([np.nan, np.inf, -1e30, 2**62]))
    else:
        arrays[key] = np.asarray(["text"] * array.size)
    return arrays


def mutate_member(rng: random.Random, npz: bytes) -> bytes:
    """The .npz with one member's bytes damaged and zipped again, so its checksum holds and numpy parses them."""
    import zipfile

    members = {}
    with zipfile.ZipFile(io.BytesIO(npz)) as zipped:
        for name in zipped.namelist():
            members[name] = zipped.read(name)
    name = rng.choice(list(members))
    members[name] = mutate_bytes(rng, members[name][:160]) + members[name][160:]  # mostly the .npy header
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zipped:
        for key, data in members.items():
            zipped.writestr(key, data)
    return out.getvalue()


@both
def test_run_reads_damaged_inputs_cleanly(tmp_path, capsys, alarm, scale) -> None:
    from runtime.inputs import input_specs
    from turnip_cli.main import main

    memgraph = compile_taskgraph(matmul.build(matmul.PRESETS["small"]).taskgraph(), 12288)
    (tmp_path / "plan.json").write_text(json.dumps(memgraph.to_json()))
    rng = random.Random(31)
    codes: list = []
    valid = {task: np.asarray(rng.random() * np.ones(shape), dtype=dtype) for task, (shape, dtype) in input_specs(memgraph).items()}
    for _ in range(40 * scale):
        choice = rng.random()
        if choice < 0.4:
            data = _npz(mutate_arrays(rng, valid))
        elif choice < 0.7:
            data = mutate_member(rng, _npz(valid))
        else:
            data = mutate_bytes(rng, _npz(valid))
        (tmp_path / "in.npz").write_bytes(data)
        argv = ["run", str(tmp_path / "plan.json"), "--backend", "cpu", "--inputs", str(tmp_path / "in.npz"),
                "--outputs", str(tmp_path / "out.npz")]
        codes.append(cli_case(main, argv, tmp_path, ["out.npz"], capsys, _npz_whole))
    both_outcomes(codes)


# ----- .npy token ids and config.json: turnip llama, load_config -------------------------------------------------

SMALL_LLAMA = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "vocab_size": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "dtype": "float32"}


def _npy(array) -> bytes:
    data = io.BytesIO()
    np.save(data, array, allow_pickle=True)
    return data.getvalue()


def mutate_ids(rng: random.Random, ids: np.ndarray):
    choice = rng.randrange(8)
    if choice == 7:  # still valid: fewer ids, another integer type
        return ids[: rng.randint(1, len(ids))].astype(rng.choice(["int32", "uint8", "int64"]))
    if choice == 0:
        return ids.astype(rng.choice(["float32", "int8", "uint64", "bool", "int16"]))
    if choice == 1:
        return ids.reshape(2, -1)
    if choice == 2:
        return ids[:0]
    if choice == 3:
        return np.asarray(ids[0])
    if choice == 4:
        changed = ids.copy()
        changed[rng.randrange(len(ids))] = rng.choice([-1, 32, 2**62, -(2**62)])
        return changed
    if choice == 5:
        return np.asarray([str(i) for i in ids])
    return np.asarray([int(i) for i in ids], dtype=object)


@both
def test_llama_reads_damaged_token_ids_cleanly(tmp_path, capsys, alarm, scale) -> None:
    from turnip_cli.main import main

    (tmp_path / "config.json").write_text(json.dumps(SMALL_LLAMA))
    valid = np.arange(8, dtype=np.int64)
    rng = random.Random(41)
    codes: list = []
    for _ in range(40 * scale):
        data = _npy(mutate_ids(rng, valid)) if rng.random() < 0.5 else mutate_bytes(rng, _npy(valid))
        (tmp_path / "ids.npy").write_bytes(data)
        argv = ["llama", "--config", str(tmp_path / "config.json"), "--input-ids", str(tmp_path / "ids.npy"),
                "--memory", "1MiB", "--backend", "cpu", "--outputs", str(tmp_path / "out.npz")]
        codes.append(cli_case(main, argv, tmp_path, ["out.npz"], capsys, _npz_whole))
    both_outcomes(codes)


@both
def test_load_config_reads_damaged_configs_cleanly(tmp_path, alarm, scale) -> None:
    from frontend.workloads.llama import load_config
    from frontend.workloads.llama.config import PRESETS

    rng = random.Random(51)
    seeds = [SMALL_LLAMA, PRESETS["7b"], {**PRESETS["tiny"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
             "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}]
    path = tmp_path / "config.json"
    for _ in range(300 * scale):
        doc = rng.choice(seeds)
        data = json.dumps(mutate_doc(rng, doc)).encode() if rng.random() < 0.7 else mutate_bytes(rng, json.dumps(doc).encode())
        path.write_bytes(data)
        reader_case(lambda p: load_config(str(p)), path, tmp_path)


HOSTILE = ["[" * 100_000 + "]" * 100_000, "{\"a\": " * 300 + "1" + "}" * 300, "1" + "0" * 5000, "-" + "9" * 4400,
           "NaN", "Infinity", "-Infinity", "1e999", "-1e999"]
"""JSON texts Python's reader crashes on (RecursionError, ValueError for 4300+ digits) or takes where a
number must be finite (NaN, Infinity, 1e999 read as inf)."""
SENTINEL = "@@hostile@@"


def hostile_text(rng: random.Random, doc) -> bytes:
    """`doc` as JSON text with one value somewhere inside (or the whole) replaced by a `HOSTILE` literal."""
    doc = copy.deepcopy(doc)
    parent, key = _pick(rng, doc)
    if parent is None:
        return rng.choice(HOSTILE).encode()
    parent[key] = SENTINEL
    return json.dumps(doc).replace(json.dumps(SENTINEL), rng.choice(HOSTILE)).encode()


CONFIG_FIELDS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings", "rope_theta", "tie_word_embeddings",
                 "eos_token_id", "bos_token_id", "model_type", "sliding_window", "attention_bias", "mlp_bias", "hidden_act",
                 "torch_dtype", "rope_scaling", "partial_rotary_factor", "use_sliding_window", "max_window_layers", "layer_types"]
ROPE_FIELDS = ["rope_type", "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
               "rope_theta", "partial_rotary_factor"]
CONFIG_VALUES = [float("nan"), float("inf"), -float("inf"), 0, -1, -5, 1, 2, 3, 2.5, 1e-300, 10**9, 10**12, 2**62, 10**400,
                 "false", "true", "1", "", True, False, None, [], {}, [1, 2], [-1], "x" * 10_000, "llama3", "dynamic", "linear"]
"""Non-finite, mistyped and enormous values for any field of a config."""


def mutate_config(rng: random.Random, doc: dict) -> dict:
    """A config with one to three fields (of its own or of its RoPE parameters) set to a `CONFIG_VALUES` value."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        rope = doc.get("rope_scaling")
        if isinstance(rope, dict) and rng.random() < 0.3:
            rope[rng.choice(ROPE_FIELDS)] = rng.choice(CONFIG_VALUES)
        else:
            doc[rng.choice(CONFIG_FIELDS)] = rng.choice(CONFIG_VALUES)
    return doc


def _sane(config) -> None:
    """What a config that reads must be: sizes within their maxima, finite floats in range, ids in the
    vocabulary, a bool where one goes, finite RoPE frequencies, and its weight shapes listed at once."""
    from frontend.workloads.llama.config import MAXIMA
    from frontend.workloads.llama.rope import inverse_frequencies
    from frontend.workloads.llama.weights import weight_shapes

    for key, most in MAXIMA.items():
        value = getattr(config, key, None) if key != "original_max_position_embeddings" else config.rope.original_max_position_embeddings
        assert value is None or (type(value) is int and 1 <= value <= most), (key, value)
    assert 0 < config.rms_norm_eps <= 1 and config.rope.theta > 1 and math.isfinite(config.rope.theta)
    assert all(math.isfinite(x) and x > 0 for x in (config.rope.factor, config.rope.low_freq_factor, config.rope.high_freq_factor))
    assert type(config.tie_word_embeddings) is bool and all(0 <= i < config.vocab_size for i in config.eos_token_id)
    assert config.hidden_size % config.num_attention_heads == 0 and config.head_dim % 2 == 0
    assert np.isfinite(inverse_frequencies(config, config.max_position_embeddings + 1)).all()
    assert len(weight_shapes(config)) == 2 + 9 * config.num_hidden_layers + (3 * config.num_hidden_layers if config.qkv_bias else 0)


@both
def test_load_config_reads_hostile_values_cleanly_or_sanely(tmp_path, alarm, scale) -> None:
    """Configs with non-finite, mistyped and enormous values, and deeply nested or huge-integer JSON: one
    line, or a config that is sane (`_sane`) and whose weights are listed without a hang."""
    from frontend.workloads.llama import load_config
    from frontend.workloads.llama.config import PRESETS

    rng = random.Random(53)
    llama3 = {**PRESETS["tiny"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    seeds = [SMALL_LLAMA, PRESETS["7b"], llama3, {**PRESETS["tiny"], "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
             {**SMALL_LLAMA, "model_type": "mistral", "sliding_window": 16}, {**SMALL_LLAMA, "model_type": "qwen2"}]
    path = tmp_path / "config.json"
    read: list = []
    for _ in range(300 * scale):
        doc = rng.choice(seeds)
        path.write_bytes(hostile_text(rng, doc) if rng.random() < 0.3 else json.dumps(mutate_config(rng, doc)).encode())
        reader_case(lambda p: read.append(_sane(load_config(str(p)))), path, tmp_path)
    assert 0 < len(read) < 300 * scale  # some mutations still read: the property is checked on them


# ----- safetensors files and their index: SafeTensors.open ------------------------------------------------------

def _read_all(path: Path) -> None:
    from frontend.safetensors import SafeTensors

    tensors = SafeTensors.open(path)
    for name in tensors:
        tensors.get(name, "float32")


def _tensors() -> dict[str, np.ndarray]:
    return {"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "b.bias": np.ones(5, dtype=np.float16),
            "c.weight": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)}


def _pack(header: dict, data: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


@both
def test_safetensors_reads_damaged_files_cleanly(tmp_path, alarm, scale) -> None:
    from frontend.safetensors import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "model.safetensors"
    save_file(_tensors(), path, metadata={"format": "pt"}, bfloat16=("c.weight",))
    valid = path.read_bytes()
    (length,) = struct.unpack("<Q", valid[:8])
    header, data = json.loads(valid[8:8 + length]), valid[8 + length:]
    rng = random.Random(61)
    for _ in range(300 * scale):
        path.write_bytes(_pack(mutate_doc(rng, header), data) if rng.random() < 0.6 else mutate_bytes(rng, valid))
        reader_case(_read_all, path, folder)


@both
def test_safetensors_index_reads_damaged_indexes_cleanly(tmp_path, alarm, scale) -> None:
    from frontend.safetensors import save_sharded

    folder = tmp_path / "model"
    folder.mkdir()
    index = save_sharded(_tensors(), folder, shards=2, metadata={"format": "pt"})
    valid = json.loads(index.read_text())
    rng = random.Random(71)
    for _ in range(300 * scale):
        data = json.dumps(mutate_doc(rng, valid)).encode() if rng.random() < 0.7 else mutate_bytes(rng, json.dumps(valid).encode())
        index.write_bytes(data)
        reader_case(_read_all, folder, folder)


@both
def test_safetensors_reads_hostile_json_cleanly(tmp_path, alarm, scale) -> None:
    """A header or an index with a deeply nested or huge-integer value, or NaN or Infinity, anywhere in it."""
    from frontend.safetensors import save_file, save_sharded

    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "model.safetensors"
    save_file(_tensors(), path, metadata={"format": "pt"})
    valid = path.read_bytes()
    (length,) = struct.unpack("<Q", valid[:8])
    header, data = json.loads(valid[8:8 + length]), valid[8 + length:]
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    index = save_sharded(_tensors(), sharded, shards=2, metadata={"format": "pt"})
    weight_map = json.loads(index.read_text())
    rng = random.Random(63)
    for _ in range(100 * scale):
        text = hostile_text(rng, header)
        path.write_bytes(struct.pack("<Q", len(text)) + text + data)
        reader_case(_read_all, path, folder)
        index.write_bytes(hostile_text(rng, weight_map))
        reader_case(_read_all, sharded, sharded)


# ----- plan files of --plan-dir: read_plan ----------------------------------------------------------------------

PLAN_BUDGET = 100 << 10
ATTRIBUTE_VALUES = [float("nan"), float("inf"), -float("inf"), 10.0, 0.0, -1, 0, 1, 10**20, True, "ti,io->to", "x", None]


def _tampered_plan(rng: random.Random, doc: dict) -> bytes:
    """A plan file damaged (bytes, fields) or tampered as a person would: an attribute set, two operands,
    two task names or two outputs swapped, the budget raised."""
    doc = copy.deepcopy(doc)
    nodes, choice = doc["nodes"], rng.random()
    if choice < 0.15:
        return mutate_bytes(rng, json.dumps(doc).encode())
    if choice < 0.35:
        return json.dumps(mutate_doc(rng, doc)).encode()
    if choice < 0.55:
        node = rng.choice([n for n in nodes if n.get("attrs")])
        node["attrs"][rng.choice([*node["attrs"], "start", "eps"])] = rng.choice(ATTRIBUTE_VALUES)
    elif choice < 0.7:
        node = rng.choice([n for n in nodes if len(n["inputs"]) > 1])
        i, j = rng.sample(range(len(node["inputs"])), 2)
        node["inputs"][i], node["inputs"][j] = node["inputs"][j], node["inputs"][i]
    elif choice < 0.85:
        a, b = rng.sample(nodes, 2)
        a["task"], b["task"] = b["task"], a["task"]
    elif choice < 0.95:
        x, y = rng.sample(list(doc["outputs"]), 2)
        doc["outputs"][x], doc["outputs"][y] = doc["outputs"][y], doc["outputs"][x]
    else:
        doc["budget"] = rng.choice([PLAN_BUDGET * 2, 10 << 20, PLAN_BUDGET - 1, 2**63])
    return json.dumps(doc).encode()


@both
def test_read_plan_takes_a_proven_plan_or_none(tmp_path, alarm, scale) -> None:
    """Whatever a plan file holds, `read_plan` returns None or a plan of the graph at the budget that the
    oracle (tests/oracle.py, which shares no code with the verifier) finds correct; never raises, never hangs."""
    from frontend.workloads import llama
    from frontend.workloads.llama.decode import build_decode_step
    from oracle import violations
    from turnip.plans import read_plan

    step = build_decode_step(llama.load_config("tiny"), [10, 3], 1, 16)
    doc = compile_taskgraph(step.graph, PLAN_BUDGET, inputs="recur").to_json()
    path = tmp_path / "plan.json"
    rng = random.Random(71)
    accepted = 0
    for _ in range(200 * scale):
        path.write_bytes(_tampered_plan(rng, doc))
        signal.alarm(20)
        try:
            plan = read_plan(path, step.graph, PLAN_BUDGET)
        except BaseException as err:  # noqa: B036 (read_plan raises nothing, Hang included)
            _escaped(err, f"plan {path.read_bytes()[:300]!r}")
        finally:
            signal.alarm(0)
        if plan is not None:
            accepted += 1
            assert plan.budget == PLAN_BUDGET and violations(plan, step.graph) == [], path.read_text()[:300]
    assert 0 < accepted < 200 * scale  # some damage leaves a correct plan (an unused field), most does not


# ----- the Python API's arguments: Session and generate -------------------------------------------------------------

def _weights_mapping(rng: random.Random):
    from frontend.workloads import llama

    weights = {name: np.array(value) for name, value in llama.RandomWeights(llama.load_config("tiny"), 0).items()}
    name = rng.choice(sorted(weights))
    change = rng.random()
    if change < 0.25:
        weights.pop(name)
    elif change < 0.5:
        weights[name] = weights[name].reshape(-1)[: rng.randint(0, 4)]
    elif change < 0.75:
        weights[name].reshape(-1)[0] = rng.choice([np.nan, np.inf, -np.inf])
    else:
        weights[name] = rng.choice(["x", None, 3, [1.0], weights[name].astype(np.complex64)])
    return weights


SESSION_VALUES = {
    "memory": [1 << 20, 1 << 20, 1 << 10, 0, -1, 1.5, "1MiB", None, 2**70, np.int64(1 << 20)],
    "backend": ["cpu", "cpu", "sim", "gpu", 3, None],
    "gpus": [1, 1, 2, 0, -1, 100000, "2", 2.0, None],
    "order": ["nondet", "fixed", "random", "best", None],
    "seed": [0, 5, -1, "x", 1.5, 2**70, None],
    "dtype": [None, "float32", "float16", "int8", "float64", np.float16, 3],
    "schedule": ["given", "dfs", "memory", "fast", None],
    "kv_block": [16, 16, 1, 0, -16, 3.5, "16", None],
    "backend_options": [None, {}, [1], "x"],
    "plan_dir": [None, 3, "PLANS"],
}
CALL_VALUES = {
    "max_new_tokens": [1, 2, 0, -1, 2.0, "2", None, np.int64(2)],
    "temperature": [0.0, 0.7, 1e-320, -1.0, float("nan"), float("inf"), "0.5", None],
    "top_p": [1.0, 0.5, 0.0, 1.5, float("nan"), "x", None],
    "seed": [None, 3, -1, 1.5, "x"],
    "stop_at_eos": [False, True, "yes", None],
    "caches": [None, None, 5, [None, None], []],
}
PROMPT_VALUES = [[np.array([1, 2, 3]), np.array([4, 5])], [np.array([1, 2, 3]), np.array([4, 5])], np.array([1, 2]), np.array(5),
                 [], [np.array([], dtype=np.int64)], [np.array([1, 300])], [np.array([1.5])], "hello", 5, None, [[1, 2], [3]]]


@both
def test_python_api_arguments_give_tokens_or_one_turnip_error(tmp_path, alarm, scale) -> None:
    """Random arguments, most of them valid: the session runs, or one `TurnipError` line comes back at
    construction or at the call; never another exception, never a hang."""
    from turnip import Session

    rng = random.Random(81)
    outcomes = []
    for case in range(40 * scale):
        arguments = {name: rng.choice(values) for name, values in SESSION_VALUES.items() if rng.random() < 0.08}
        if arguments.get("plan_dir") == "PLANS":
            arguments["plan_dir"] = tmp_path / f"plans{case}"
        weights = _weights_mapping(rng) if rng.random() < 0.1 else None
        call = {name: rng.choice(values) for name, values in CALL_VALUES.items() if rng.random() < 0.1}
        prompts = PROMPT_VALUES[0] if rng.random() < 0.8 else rng.choice(PROMPT_VALUES)
        signal.alarm(60)
        try:
            with Session(config="tiny", weights=weights, **{"memory": 1 << 20, "backend": "cpu", **arguments}) as session:
                session.generate(prompts, **{"max_new_tokens": 2, **call})
            outcomes.append(0)
        except TurnipError as err:
            assert "\n" not in str(err), str(err)
            outcomes.append(1)
        except Exception as err:
            _escaped(err, f"Session({arguments!r}, weights={weights is not None}).generate({prompts!r}, {call!r})")
        finally:
            signal.alarm(0)
    both_outcomes(outcomes)


# ----- the tracebacks the fuzz found, one concrete input each, fixed -----------------------------------------------

def test_llama_damaged_npy_header_is_one_line(tmp_path, capsys) -> None:
    from turnip_cli.main import main

    (tmp_path / "config.json").write_text(json.dumps(SMALL_LLAMA))
    data = _npy(np.arange(8, dtype=np.int64))
    assert b"(8,)" in data
    (tmp_path / "ids.npy").write_bytes(data.replace(b"(8,)", b"(8,,"))  # the header's shape tuple, damaged
    argv = ["llama", "--config", str(tmp_path / "config.json"), "--input-ids", str(tmp_path / "ids.npy"),
            "--memory", "1MiB", "--backend", "cpu"]
    assert main(argv) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_safetensors_dtype_that_is_not_a_string_is_one_line(tmp_path) -> None:
    from frontend.safetensors import SafeTensors

    path = tmp_path / "model.safetensors"
    path.write_bytes(_pack({"w": {"dtype": {"F32": 1}, "shape": [1], "data_offsets": [0, 4]}}, bytes(4)))
    with pytest.raises(TurnipError, match="dtype"):
        SafeTensors.open(path)

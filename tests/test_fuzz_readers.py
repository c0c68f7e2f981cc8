"""Mutation fuzzing of every reader: any damage to a valid file must end in one `TurnipError` line, fast;
never another exception, a traceback or a hang.

Readers: taskgraph and memgraph JSON and IR text (through `turnip-opt`), an .npz of inputs (`turnip run
--inputs`), an .npy of token ids (`turnip llama --input-ids`), a model's config.json (`load_config`), and
safetensors files and their model.safetensors.index.json (`SafeTensors.open`). A seeded mutator flips,
deletes and inserts bytes, deletes fields and changes numbers of valid seed files written to tmp_path.
Through a CLI the property is: exit 0, or a non-zero exit with one line on stderr; no traceback; no file
in the folder but the named outputs created or changed; an output only on success, and then whole.
The CI part runs a few hundred cases per reader; `-m slow` runs ten times as many.

Found this way: xDSL's lexer backtracks exponentially on an unclosed string literal (a stray `"` hung
the parser for minutes), xDSL raised VerifyException and ValueError while parsing, and the JSON readers
let negative devices, list-valued dtypes and integers past 64 bits through to the IR builders.
"""

from __future__ import annotations

import copy
import io
import json
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

ROUNDS = {"ci": 1, "slow": 10}
"""Cases per reader are `base * ROUNDS[...]`: the CI part stays under a minute on two cores."""


def _rounds(request) -> int:
    return ROUNDS["slow"] if request.node.get_closest_marker("slow") else ROUNDS["ci"]


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


def reader_case(read, path: Path, folder: Path) -> None:
    """Call a reader in-process: it returns, or raises one `TurnipError` line; it writes nothing."""
    before = _listing(folder)
    signal.alarm(20)
    try:
        read(path)
    except TurnipError as err:
        assert "\n" not in str(err), str(err)
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
    for case in range(150 * scale):
        name = rng.choice(list(seeds))
        text = seeds[name]
        if name.endswith(".json") and rng.random() < 0.6:
            data = json.dumps(mutate_doc(rng, json.loads(text))).encode()
        else:
            data = mutate_bytes(rng, text.encode())
        (tmp_path / name).write_bytes(data)
        pipeline = "turnip-memgraph{budget=12288}" if name == "taskgraph.json" else "turnip-verify-memgraph"
        out = "out.mlir" if name.endswith(".mlir") else "out.json"
        reader = (lambda path: path.read_text()) if out == "out.mlir" else _json_whole
        cli_case(main, [str(tmp_path / name), "-p", pipeline, "-o", str(tmp_path / out)], tmp_path, [out], capsys, reader)

"""Mutation fuzzing of the JSON and IR readers: any damage to a valid file must end in one `TurnipError`
line, fast; never another exception, a traceback or a hang.

Found this way: xDSL's lexer backtracks exponentially on an unclosed string literal (a stray `"` hung
the parser for minutes), xDSL raised VerifyException and ValueError while parsing, and the JSON readers
let negative devices, list-valued dtypes and integers past 64 bits through to the IR builders.
"""

from __future__ import annotations

import copy
import json
import random
import signal
from pathlib import Path

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

"""A plan read from `Session(plan_dir=...)` is proven a plan of the session's taskgraph at its budget, or
compiled again (issue 47, item 2): each tampering below is self-consistent (it reads and verifies alone),
so only the check against the taskgraph and the budget can catch it. The session must compile that
plan anew (and write it again), and give the tokens of untouched plans. Files that are no plan at all
(a FIFO, a link to /dev/zero, a huge file, JSON nested 100,000 deep) are compiled anew too, never a hang
or a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest

from frontend.workloads import llama
from frontend.workloads.llama.decode import build_decode_step
from passes.pipeline import compile_taskgraph
from turnip import Session
import turnip.session
from turnip.plans import plan_key, read_plan, write_plan

PROMPTS = [np.arange(1, 12) % 200, np.arange(5, 9) % 200]
MEMORY = 100 << 10


def _generate(plan_dir, memory=MEMORY):
    with Session(config="tiny", memory=memory, backend="cpu", kv_block=16, plan_dir=plan_dir) as session:
        result = session.generate(PROMPTS, 5)
        return result, session.compiles, session.disk_hits


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tokens and plan files of an untouched run."""
    plans = tmp_path_factory.mktemp("plans")
    result, compiles, _ = _generate(plans)
    assert compiles == len(list(plans.glob("*.json"))) >= 2
    return result.tokens, plans


def _docs(plans):
    return {path: json.loads(path.read_text()) for path in sorted(plans.glob("*.json"))}


def _node(doc, kernel=None, task=None):
    return next(n for n in doc["nodes"] if (kernel is None or n.get("kernel") == kernel) and (task is None or n["task"] == task))


def _set_attr(kernel, name, value):
    def tamper(doc):
        _node(doc, kernel)["attrs"][name] = value

    return tamper


def _equation(doc):  # the q projection [t, in] x [out, in], square in tiny: read the weight transposed
    node = _node(doc, "einsum")
    assert node["attrs"]["equation"] == "ti,oi->to"
    node["attrs"]["equation"] = "ti,io->to"


def _swap_q_k_operands(doc):  # attention(q, k, v) read as attention(k, q, v): the same shapes in tiny
    node = _node(doc, "attention")
    node["inputs"][0], node["inputs"][1] = node["inputs"][1], node["inputs"][0]


def _swap_q_k_names(doc):  # the nodes computing q and k of layer 0 trade names
    q, k = _node(doc, task="l0.q"), _node(doc, task="l0.k")
    q["task"], k["task"] = k["task"], q["task"]


def _swap_new_rows(doc):  # the holders of layer 0's new k and v rows trade names and outputs
    outputs = doc["outputs"]
    names = ("l0.k_rope", "l0.v")  # the decode step's new rows: DecodeStep.new_kv_names(0), the prefill's names
    k, v = (next(n for n in doc["nodes"] if n["id"] == outputs[name]) for name in names)
    k["task"], v["task"] = v["task"], k["task"]
    outputs[names[0]], outputs[names[1]] = outputs[names[1]], outputs[names[0]]


def _move_start(doc):
    node = _node(doc, "decode_attention", task="l0.attn.0")
    node["attrs"]["start"] += 1


def _raise_budget(doc):
    doc["budget"] = 10 << 20


TAMPERINGS = {
    "eps-10": ("rmsnorm", _set_attr("rmsnorm", "eps", 10.0)),
    "eps-nan": ("rmsnorm", _set_attr("rmsnorm", "eps", float("nan"))),
    "eps-inf": ("rmsnorm", _set_attr("rmsnorm", "eps", float("inf"))),
    "einsum-equation": ("einsum", _equation),
    "q-k-operands-swapped": ("attention", _swap_q_k_operands),
    "q-k-names-swapped": ("decode_attention", _swap_q_k_names),
    "new-row-holders-swapped": ("decode_attention", _swap_new_rows),
    "attention-start-moved": ("decode_attention", _move_start),
    "budget-raised": ("decode_attention", _raise_budget),
}


@pytest.mark.parametrize("name", TAMPERINGS)
def test_a_tampered_plan_is_compiled_again(name, reference, tmp_path):
    tokens, plans = reference
    shutil.copytree(plans, tmp_path, dirs_exist_ok=True)
    kernel, tamper = TAMPERINGS[name]
    path, doc = next((p, d) for p, d in _docs(tmp_path).items() if any(n.get("kernel") == kernel for n in d["nodes"]))
    tamper(doc)
    path.write_text(json.dumps(doc))
    result, compiles, hits = _generate(tmp_path)
    assert compiles == 1 and hits == len(_docs(plans)) - 1
    np.testing.assert_array_equal(result.tokens, tokens)
    assert json.loads(path.read_text()) != doc  # written anew
    assert _generate(tmp_path)[1] == 0


def test_a_plan_of_a_larger_budget_under_this_budgets_name_is_compiled_again(reference, tmp_path, monkeypatch):
    """Each plan of a 1 MiB session copied over the file of the same graph at 100 KiB."""
    tokens, _ = reference
    written = []
    original = turnip.session.write_plan
    monkeypatch.setattr(turnip.session, "write_plan", lambda path, memgraph: (written.append(path), original(path, memgraph)))
    _generate(tmp_path / "large", memory=1 << 20)
    _generate(tmp_path / "small")
    large, small = written[: len(written) // 2], written[len(written) // 2 :]
    assert len(large) == len(small) and all(p.parent.name == "small" for p in small)
    for source, target in zip(large, small):
        shutil.copyfile(source, target)
    written.clear()
    result, compiles, hits = _generate(tmp_path / "small")
    assert compiles == len(small) and hits == 0
    assert result.peak_arena <= MEMORY
    np.testing.assert_array_equal(result.tokens, tokens)


class Hang(BaseException):
    """Not an OSError (which a reader may catch as "no plan")."""


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _zeros(path):
    path.unlink()
    path.symlink_to("/dev/zero")


def _huge(path):
    with open(path, "r+b") as file:
        file.truncate(1 << 40)  # sparse: a terabyte that takes no disk


def _nested(path):
    path.write_text("[" * 100_000 + "]" * 100_000)


def _not_utf8(path):
    path.write_bytes(b'{"format": "\xff"}')


NOT_PLANS = {"fifo": _fifo, "link-to-dev-zero": _zeros, "huge": _huge, "nested-100000-deep": _nested, "not-utf8": _not_utf8}


@pytest.mark.parametrize("name", NOT_PLANS)
def test_a_file_that_is_no_plan_is_compiled_again_without_hanging(name, reference, tmp_path):
    tokens, plans = reference
    shutil.copytree(plans, tmp_path, dirs_exist_ok=True)
    path = sorted(tmp_path.glob("*.json"))[0]
    NOT_PLANS[name](path)

    def hang(*_):
        raise Hang(f"reading a plan that is {name} hung")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        result, compiles, _ = _generate(tmp_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert compiles == 1
    np.testing.assert_array_equal(result.tokens, tokens)
    assert path.is_file() and not path.is_symlink() and path.stat().st_size < 1 << 20  # a plan again


def test_read_plan_takes_the_plan_of_its_graph_and_budget_only(tmp_path):
    """The same checks without a session: a plan of one decode step is no plan of another step, nor of
    its own step at another budget."""
    config = llama.load_config("tiny")
    step, other = (build_decode_step(config, lengths, 1, 16) for lengths in ([10, 3], [20, 3]))
    path = tmp_path / f"{plan_key(step.graph, MEMORY, 'given', 'recur', None)}.json"
    write_plan(path, compile_taskgraph(step.graph, MEMORY, inputs="recur"))
    assert read_plan(path, step.graph, MEMORY) is not None
    assert read_plan(path, other.graph, MEMORY) is None
    assert read_plan(path, step.graph, MEMORY * 2) is None
    assert read_plan(tmp_path / "none.json", step.graph, MEMORY) is None


@pytest.mark.parametrize("where", ["replace", "fsync"])
def test_ctrl_c_while_a_plan_is_written_leaves_no_temporary(where, tmp_path, monkeypatch):
    """A KeyboardInterrupt in the write or in the rename (SIGINT lands anywhere) removes the temporary."""
    config = llama.load_config("tiny")
    step = build_decode_step(config, [10, 3], 1, 16)
    memgraph = compile_taskgraph(step.graph, MEMORY, inputs="recur")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_plan(tmp_path / "plan.json", memgraph)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []

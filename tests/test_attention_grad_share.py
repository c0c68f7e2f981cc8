"""A (query block, key block) pair's two `attention_grad` links (dQ's chain and dK/dV's) are written one
after the other (frontend/attention.py, key block by key block), so a plan reads the same operand nodes
for both; by default (`TURNIP_ATTENTION_GRAD_SHARE`, 4 results kept) the cuda backend's torch paths compute the pair's fused
backward once (`attention_grad.GradShare`), and the allowance for torch's memory holds the kept result."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from frontend.workloads import llama
from frontend.workloads.llama.train import LoraSpec, build_training_step
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime.backends.cuda import attention_grad
from runtime.backends.cuda.attention_grad import SHARE_ENV, GradShare


def _step(tokens: int = 64, block: int = 16):
    config = llama.load_config("tiny")
    return build_training_step(config, 1, tokens, LoraSpec(rank=2, alpha=4.0, targets=("q_proj", "v_proj")), block=block)


def _pair(node) -> tuple:
    return tuple(node.inputs[:5]), node.attrs.get("causal", False)


def test_a_pairs_two_links_come_one_after_the_other_and_read_the_same_nodes():
    """Four token blocks: ten pairs a layer; in the taskgraph each dQ link is followed by its pair's dK/dV
    link, and in a plan that offloads most pairs read the same five operand nodes (the shared key)."""
    step = _step()
    links = [node for node in step.graph.nodes.values() if node.op == "attention_grad"]
    assert len(links) == 2 * 10 * llama.load_config("tiny").num_hidden_layers
    for first, second in zip(links[::2], links[1::2]):
        assert (first.attrs["wrt"], second.attrs["wrt"]) == ("q", "kv")
        assert first.inputs[:5] == second.inputs[:5], (first.id, second.id)
    memgraph = compile_taskgraph(step.graph, int(minimum_budget(step.graph) * 1.5))
    assert memgraph.count("offload") > 0
    kernels = [node for node in memgraph.nodes if node.op == "kernel" and node.kernel == "attention_grad"]
    keys = [_pair(node) for node in kernels]
    adjacent = sum(1 for a, b in zip(keys, keys[1:]) if a == b)
    assert adjacent >= len(kernels) // 4, (adjacent, len(kernels))


def test_the_second_link_takes_the_first_links_result_once_and_a_replaced_one_is_computed_again():
    share = GradShare()
    assert share.take("a") is None
    share.keep("a", "grads of a")  # a's first link computed it
    assert share.take("a") == "grads of a" and share.take("a") is None  # its second took it, once
    share.keep("b", "grads of b")
    share.keep("c", "grads of c")  # c's first link replaced b's result before b's second link came
    assert share.take("b") is None
    share.keep("b", "b again")  # b's second link computed it again and keeps nothing: b is done
    assert share.take("c") == "grads of c"
    assert share.take("b") is None
    assert (share.taken, share.computed) == (2, 4)
    share.keep("d", "grads of d")
    share.new_run()  # the next run reads new values from the same nodes: nothing is kept
    assert share.take("d") is None
    share.keep("b", "b in the new run")
    assert share.take("b") == "b in the new run"


def test_with_more_slots_the_oldest_kept_result_goes_first():
    share = GradShare(slots=2)
    for key in "abc":
        share.keep(key, f"grads of {key}")  # a goes when c comes
    assert share.take("a") is None
    assert share.take("c") == "grads of c" and share.take("b") == "grads of b"
    assert not share.kept


@dataclass
class _Source:
    shape: tuple
    dtype: str


@dataclass
class _Node:
    attrs: dict


def test_torchs_allowance_holds_a_kept_result_only_where_results_are_shared(monkeypatch):
    node = _Node({"heads": 32, "kv_heads": 32, "wrt": "q"})
    sources = [_Source((4096, 4096), "float16"), _Source((4096, 4096), "float16")]
    monkeypatch.setenv(SHARE_ENV, "0")
    alone = attention_grad.library_bytes(node, sources, "torch-cudnn")
    monkeypatch.setenv(SHARE_ENV, "1")
    shared = attention_grad.library_bytes(node, sources, "torch-cudnn")
    assert shared - alone == (4096 + 2 * 4096) * 4096 * 2  # dQ, dK and dV of one block in float16
    monkeypatch.setenv(SHARE_ENV, "4")
    assert attention_grad.library_bytes(node, sources, "torch-cudnn") - alone == 4 * (shared - alone)
    assert attention_grad.library_bytes(node, sources, "cublas") == 0


@pytest.mark.parametrize("value, slots", [(None, 4), ("", 4), ("0", 0), ("1", 1), ("4", 4), ("yes", 4), ("-2", 4)])
def test_four_results_are_shared_unless_told_otherwise(monkeypatch, value, slots):
    if value is None:
        monkeypatch.delenv(SHARE_ENV, raising=False)
    else:
        monkeypatch.setenv(SHARE_ENV, value)
    assert attention_grad.sharing() == slots

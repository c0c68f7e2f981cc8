"""Kernel attributes of every type (str, float, int, bool): checked by the builder and both JSON readers,
and carried exactly, types included, through taskgraph <-> JSON <-> IR and memgraph <-> JSON <-> IR."""

from __future__ import annotations

import json

import numpy as np
import pytest

from passes.pipeline import compile_taskgraph
from turnip_ir.convert import memgraph_from_ir, taskgraph_from_ir
from turnip_ir.errors import InputError, ShapeError
from turnip_ir.io import graph_to_module, module_text, parse_ir, parse_json
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.json_taskgraph import taskgraph_from_json
from turnip_ir.kernels import KERNELS, KernelSpec
from turnip_ir.taskgraph import TaskGraph


def _attention_graph() -> TaskGraph:
    """A chain of two attention blocks (int, bool and float attributes) beside an einsum and a scale."""
    g = TaskGraph(devices=1)
    q = g.input((4, 16), "float32", id="q")
    k0 = g.input((4, 8), "float32", id="k0")
    k1 = g.input((4, 8), "float32", id="k1")
    p = g.attention(q, k0, k0, heads=4, kv_heads=2, final=False, id="p")
    o = g.attention(q, k1, k1, p, heads=4, kv_heads=2, causal=True, softmax_scale=0.08838834764831845, id="o")
    s = g.scale(g.einsum("ij->ij", o, id="e"), 1, id="s")
    g.output(s)
    return g


def _typed(attrs: dict) -> list:
    return sorted((name, type(value).__name__, value) for name, value in attrs.items())


def test_taskgraph_round_trips_keep_values_and_types() -> None:
    g = _attention_graph()
    assert g["p"].attrs == {"heads": 4, "kv_heads": 2, "final": False}
    assert type(g["s"].attrs["factor"]) is float  # the builder converts 1 to the table's float
    from_json = taskgraph_from_json(json.loads(g.dumps()))
    text = module_text(graph_to_module(from_json))
    assert "heads = 4 : i64" in text and "final = false" in text and "causal = true" in text
    from_ir = taskgraph_from_ir(parse_ir(text))
    for graph in (from_json, from_ir):
        assert graph.to_json() == g.to_json()
        for node_id in ("p", "o", "e", "s"):
            assert _typed(graph[node_id].attrs) == _typed(g[node_id].attrs), node_id


def test_memgraph_round_trips_keep_values_and_types() -> None:
    memgraph = compile_taskgraph(_attention_graph(), budget=1 << 20)
    kernels = [node for node in memgraph.nodes if node.op == "kernel"]
    assert {node.kernel for node in kernels} == {"attention", "einsum", "scale"}
    from_json = memgraph_from_json(json.loads(memgraph.dumps()))
    from_ir = memgraph_from_ir(parse_ir(module_text(graph_to_module(from_json))))
    for graph in (from_json, from_ir):
        assert graph.to_json() == memgraph.to_json()
        for mine, theirs in zip(kernels, [node for node in graph.nodes if node.op == "kernel"]):
            assert _typed(theirs.attrs) == _typed(mine.attrs)


BUILDER_ERRORS = [
    ({"heads": True}, "attribute 'heads' must be an integer, got True"),
    ({"heads": 4.0}, "attribute 'heads' must be an integer, got 4.0"),
    ({"heads": "4"}, "attribute 'heads' must be an integer, got '4'"),
    ({"causal": 1}, "attribute 'causal' must be True or False, got 1"),
    ({"final": "no"}, "attribute 'final' must be True or False, got 'no'"),
    ({"softmax_scale": False}, "attribute 'softmax_scale' must be a number, got False"),
]


@pytest.mark.parametrize("extra,message", BUILDER_ERRORS)
def test_builder_checks_attribute_types(extra, message) -> None:
    g = TaskGraph()
    q, k = g.input((4, 16), id="q"), g.input((4, 8), id="k")
    attrs = {"heads": 4, "kv_heads": 2, **extra}
    with pytest.raises(InputError) as caught:
        g.kernel("attention", q, k, k, id="a", **attrs)
    assert str(caught.value) == f"node 'a': {message}"
    assert "a" not in g.nodes


def test_builder_takes_numpy_integers_as_ints() -> None:
    g = TaskGraph()
    q, k = g.input((4, 16)), g.input((4, 8))
    out = g.attention(q, k, k, heads=np.int64(4), kv_heads=np.int32(2), id="a")
    assert out.shape == (4, 16)
    assert _typed(g["a"].attrs) == [("heads", "int", 4), ("kv_heads", "int", 2)]


def _taskgraph_doc(attrs: dict) -> dict:
    return {
        "format": "turnip.taskgraph/1",
        "devices": 1,
        "nodes": [
            {"id": "q", "op": "input", "device": 0, "shape": [4, 16], "dtype": "float32"},
            {"id": "k", "op": "input", "device": 0, "shape": [4, 8], "dtype": "float32"},
            {"id": "a", "op": "attention", "inputs": ["q", "k", "k"], "attrs": attrs},
        ],
    }


JSON_ERRORS = [
    ({"heads": 4.0, "kv_heads": 2}, "node 'a': attribute 'heads' must be an integer, got 4.0"),
    ({"heads": True, "kv_heads": 2}, "node 'a': attribute 'heads' must be an integer, got True"),
    ({"heads": 4, "kv_heads": 2, "causal": 1}, "node 'a': attribute 'causal' must be true or false, got 1"),
    ({"heads": 4, "kv_heads": 2, "softmax_scale": "x"}, "node 'a': attribute 'softmax_scale' must be a number, got 'x'"),
    ({"heads": 4}, "node 'a': attention needs the attribute 'kv_heads'"),
    ({"heads": 3, "kv_heads": 1}, "node 'a': attention: heads 3 does not divide q width 16"),
]


@pytest.mark.parametrize("attrs,message", JSON_ERRORS)
def test_taskgraph_json_checks_attribute_types(attrs, message) -> None:
    with pytest.raises(InputError) as caught:
        parse_json(json.dumps(_taskgraph_doc(attrs)), "g.json")
    assert str(caught.value) == f"g.json: {message}"


def test_taskgraph_json_reads_true_false_and_integers() -> None:
    text = json.dumps(_taskgraph_doc({"heads": 4, "kv_heads": 2, "causal": True, "softmax_scale": 1}))
    assert '"causal": true' in text
    graph = parse_json(text, "g.json")
    assert _typed(graph["a"].attrs) == [("causal", "bool", True), ("heads", "int", 4), ("kv_heads", "int", 2), ("softmax_scale", "float", 1.0)]


def _memgraph_doc(change) -> str:
    memgraph = compile_taskgraph(_attention_graph(), budget=1 << 20)
    doc = json.loads(memgraph.dumps())
    change(doc["nodes"])
    return json.dumps(doc)


def _set_attr(nodes, kernel: str, name: str, value) -> None:
    next(node for node in nodes if node.get("kernel") == kernel)["attrs"][name] = value


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda n: _set_attr(n, "attention", "heads", 4.5), "attribute 'heads' must be an integer, got 4.5"),
        (lambda n: _set_attr(n, "attention", "final", 0), "attribute 'final' must be true or false, got 0"),
        (lambda n: _set_attr(n, "attention", "eps", 0.1), "attention has no attribute 'eps'"),
        (lambda n: n[0].update(attrs={"heads": 4}), "an input has no attributes"),
    ],
)
def test_memgraph_json_checks_attributes(change, message) -> None:
    with pytest.raises(InputError) as caught:
        parse_json(_memgraph_doc(change), "m.json")
    assert str(caught.value).startswith("m.json: node ")
    assert str(caught.value).endswith(message)


def test_a_kernel_may_declare_its_own_dtype_rule() -> None:
    attention = KERNELS["attention"]
    assert attention.infer([(4, 16), (4, 8), (4, 8)], ["float16"] * 3, {"heads": 4, "kv_heads": 2}) == ((4, 16), "float16")
    partial = attention.infer([(4, 16), (4, 8), (4, 8)], ["bfloat16"] * 3, {"heads": 4, "kv_heads": 2, "final": False})
    assert partial == ((4, 20), "float32")
    with pytest.raises(ShapeError, match=r"^attention: q, k and v have mixed dtypes \['float16', 'float32'\]$"):
        attention.infer([(4, 16), (4, 8), (4, 8)], ["float16", "float32", "float16"], {"heads": 4, "kv_heads": 2})
    # a kernel without the hook keeps the one-dtype rule
    plain = KernelSpec("twice", (2, 2), lambda s, a: s[0], lambda s, o, a: 0)
    with pytest.raises(ShapeError, match=r"^twice operands have mixed dtypes"):
        plain.infer([(2,), (2,)], ["float16", "float32"], {})
    cast = KernelSpec("cast", (1, 1), lambda s, a: s[0], lambda s, o, a: 0, attrs={"to": str}, infer_dtype=lambda d, a: a["to"])
    assert cast.infer([(2,)], ["float16"], {"to": "float64"}) == ((2,), "float64")


def test_segments_of_a_packed_block_survive_every_round_trip() -> None:
    """A causal block of packed sequences keeps its `segments` string through JSON and IR text, taskgraph
    and memgraph; JSON that breaks its rule gets the shape rule's diagnostic."""
    g = TaskGraph(devices=1)
    q, k = g.input((6, 16), "float32", id="q"), g.input((6, 8), "float32", id="k")
    g.output(g.attention(q, k, k, heads=4, kv_heads=2, causal=True, segments="1,4", id="a"))
    text = module_text(graph_to_module(taskgraph_from_json(json.loads(g.dumps()))))
    assert 'segments = "1,4"' in text
    for generic in (False, True):
        again = taskgraph_from_ir(parse_ir(module_text(graph_to_module(g), generic=generic)))
        assert again.to_json() == g.to_json() and again["a"].attrs["segments"] == "1,4"
    memgraph = compile_taskgraph(g, budget=1 << 20)
    for graph in (memgraph_from_json(json.loads(memgraph.dumps())), memgraph_from_ir(parse_ir(module_text(graph_to_module(memgraph))))):
        assert graph.to_json() == memgraph.to_json()
    doc = _taskgraph_doc({"heads": 4, "kv_heads": 2, "segments": "2"})
    with pytest.raises(InputError, match="^g.json: node 'a': attention: segments '2' cut a causal block only"):
        parse_json(json.dumps(doc), "g.json")

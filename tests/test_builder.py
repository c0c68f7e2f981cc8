"""The Python builder: building, shape and dtype inference for every kernel, and its errors naming the node."""

from __future__ import annotations

import json

import pytest

from turnip_ir.convert import taskgraph_from_ir
from turnip_ir.errors import InputError, KernelError, ShapeError
from turnip_ir.io import graph_to_module, load_taskgraph, module_text, parse_ir
from turnip_ir.json_taskgraph import taskgraph_from_json
from turnip_ir.kernels import KERNELS
from turnip_ir.taskgraph import TaskGraph


def test_issue_example_builds_and_loads_back() -> None:
    g = TaskGraph(devices=3)
    a = g.input((256, 256), "float32", device=0)
    b = g.input((256, 128), "float32", device=0, id="b")
    c = g.matmul(a, b)
    m = g.move(c, device=1)
    g.output(m)
    assert (c.shape, c.dtype, c.device) == ((256, 128), "float32", None)
    assert (m.shape, m.device) == ((256, 128), 1)
    assert g[m.id].inputs == (c.id,) and g.outputs == [m.id]
    doc = g.to_json()
    assert doc["format"] == "turnip.taskgraph/1" and doc["devices"] == 3
    assert [n["op"] for n in doc["nodes"]] == ["input", "input", "matmul", "move"]
    assert "device" not in doc["nodes"][2]  # an unplaced kernel stays unplaced
    assert taskgraph_from_json(json.loads(g.dumps())).to_json() == doc
    text = module_text(graph_to_module(g))
    assert "turnip.matmul" in text and "turnip.move" in text
    assert taskgraph_from_ir(parse_ir(text)).to_json() == doc


def test_load_from_files(tmp_path) -> None:
    g = TaskGraph(2)
    x = g.input((4, 4), "float16", device=1, id="x")
    g.output(g.relu(x, device=1, id="y"))
    (tmp_path / "g.json").write_text(g.dumps())
    (tmp_path / "g.mlir").write_text(module_text(graph_to_module(g)))
    assert load_taskgraph(tmp_path / "g.json").to_json() == g.to_json()
    assert load_taskgraph(tmp_path / "g.mlir").to_json() == g.to_json()


def test_ids_are_fresh_and_explicit_ids_are_kept() -> None:
    g = TaskGraph()
    g.input((2,), id="in2")
    a = g.input((2,))
    b = g.input((2,))
    assert len({a.id, b.id, "in2"}) == 3
    assert g.relu(a, id="blk[0,1]").id == "blk[0,1]"
    assert g.add(a, "blk[0,1]").shape == (2,)  # ids work as handles too


# ----- shape inference, one case per kernel -----------------------------------------------------

INFERRED = [
    ("matmul", [(8, 16), (16, 4)], {}, (8, 4)),
    ("einsum", [(2, 8, 16), (2, 16, 4)], {"equation": "bij,bjk->bik"}, (2, 8, 4)),
    ("einsum", [(8, 16)], {"equation": "ij->"}, ()),
    ("einsum", [(8, 16)], {"equation": "ij -> ji"}, (16, 8)),
    ("add", [(8, 4), (4,)], {}, (8, 4)),
    ("sub", [(8, 1), (1, 4)], {}, (8, 4)),
    ("mul", [(3, 1, 5), (2, 5)], {}, (3, 2, 5)),
    ("relu", [(3, 5)], {}, (3, 5)),
    ("gelu", [(3, 5)], {}, (3, 5)),
    ("silu", [(7,)], {}, (7,)),
    ("exp", [(2, 2, 2)], {}, (2, 2, 2)),
    ("scale", [(4, 4)], {"factor": 3}, (4, 4)),
    ("softmax", [(4, 9)], {}, (4, 9)),
    ("rmsnorm", [(4, 9)], {}, (4, 9)),
    ("rmsnorm", [(4, 9), (9,)], {"eps": 1e-3}, (4, 9)),
    ("rope", [(4, 16), (4, 8), (4, 8)], {}, (4, 16)),
    ("swiglu", [(4, 9), (4, 9)], {}, (4, 9)),
    ("attention", [(6, 16), (5, 8), (5, 8)], {"heads": 4, "kv_heads": 2}, (6, 16)),
    ("attention", [(5, 16), (5, 16), (5, 16)], {"heads": 4, "kv_heads": 4, "causal": True, "softmax_scale": 1}, (5, 16)),
    ("decode_attention", [(3, 16), (5, 3, 8), (5, 3, 8), (3,)], {"heads": 4, "kv_heads": 2, "start": 5, "final": True}, (3, 16)),
    ("rows", [(6, 16)], {"start": 2, "stop": 5}, (3, 16)),
    ("concat", [(1, 16), (3, 16), (2, 16)], {}, (6, 16)),
    ("cast", [(4, 9)], {"dtype": "bfloat16"}, (4, 9)),
    ("rmsnorm_grad", [(4, 9), (9,), (4, 9)], {"eps": 1e-3}, (4, 9)),
    ("swiglu_grad", [(4, 9), (4, 9), (4, 9)], {}, (4, 9)),
    ("attention_unpack", [(6, 20)], {"heads": 4, "dtype": "bfloat16"}, (6, 16)),
    ("attention_grad", [(6, 16), (5, 8), (5, 8), (6, 20), (6, 16)], {"heads": 4, "kv_heads": 2, "wrt": "kv"}, (10, 8)),
    ("xent", [(4, 9), (4,)], {"start": 9}, (4, 3)),
    ("xent_loss", [(4, 3), (4,)], {}, (2,)),
    ("xent_grad", [(4, 9), (4,), (4, 3), (2,)], {"start": 9, "factor": 0.5}, (4, 9)),
]


FLOAT32_OPERANDS = {"decode_attention": (3,), "attention_grad": (3,), "xent": (1,), "xent_loss": (0, 1), "xent_grad": (1, 2, 3)}
"""Operands that are float32 whatever the model dtype: token counts, packed partials, labels, statistics."""


def test_the_cases_cover_every_kernel() -> None:
    assert {case[0] for case in INFERRED} == set(KERNELS)


@pytest.mark.parametrize("name,shapes,attrs,want", INFERRED, ids=lambda v: v if isinstance(v, str) else None)
def test_inferred_shape(name, shapes, attrs, want) -> None:
    g = TaskGraph()
    wide = FLOAT32_OPERANDS.get(name, ())
    operands = [g.input(s, "float32" if i in wide else "bfloat16") for i, s in enumerate(shapes)]
    out = g.kernel(name, *operands, id="out", **attrs)
    assert (out.shape, out.dtype) == (want, "float32" if name in ("xent", "xent_loss") else "bfloat16")
    assert g["out"].attrs == {k: KERNELS[name].attrs[k](v) for k, v in attrs.items()}
    assert module_text(parse_ir(module_text(graph_to_module(g)))) == module_text(graph_to_module(g))  # the verifier agrees


ERRORS = [
    ("matmul", [(8, 16), (8, 4)], {}, "node 'bad': matmul inner dimensions differ: [8, 16] @ [8, 4]"),
    ("matmul", [(8,), (8, 4)], {}, "node 'bad': matmul needs 2-D operands, got [8] and [8, 4]"),
    ("matmul", [(8, 8)], {}, "node 'bad': matmul takes 2 operands, got 1"),
    ("einsum", [(8, 16)], {}, "node 'bad': einsum needs the attribute 'equation'"),
    ("einsum", [(8, 16)], {"equation": "ij"}, "node 'bad': einsum equation 'ij' must look like 'ij,jk->ik'"),
    ("einsum", [(8, 16)], {"equation": "ij,jk->ik"}, "node 'bad': einsum equation 'ij,jk->ik' names 2 operands, got 1"),
    ("einsum", [(8, 16)], {"equation": "i->i"}, "node 'bad': einsum subscripts 'i' do not match rank of [8, 16]"),
    ("einsum", [(8, 16), (8, 4)], {"equation": "ij,jk->ik"}, "node 'bad': einsum index 'j' has sizes 16 and 8"),
    ("einsum", [(8, 16)], {"equation": "ij->k"}, "node 'bad': einsum output index 'k' is not in any operand"),
    ("einsum", [(8, 8)], {"equation": "ij->ii"}, "node 'bad': einsum output 'ii' repeats an index"),
    ("add", [(8, 4), (8, 3)], {}, "node 'bad': shapes [8, 4] and [8, 3] do not broadcast"),
    ("relu", [(4,), (4,)], {}, "node 'bad': relu takes 1 operands, got 2"),
    ("relu", [(4,)], {"factor": 2.0}, "node 'bad': relu has no attribute 'factor'"),
    ("scale", [(4,)], {}, "node 'bad': scale needs the attribute 'factor'"),
    ("softmax", [()], {}, "node 'bad': softmax needs an operand of rank 1 or more"),
    ("rmsnorm", [()], {}, "node 'bad': rmsnorm needs an operand of rank 1 or more"),
    ("rmsnorm", [(4, 9), (4,)], {}, "node 'bad': rmsnorm weight [4] must be [9]"),
    ("rmsnorm", [(4, 9), (9,), (9,)], {}, "node 'bad': rmsnorm takes 1 to 2 operands, got 3"),
    ("rows", [(4, 9)], {"start": 2, "stop": 5}, "node 'bad': rows: [2, 5) is not a range of the 4 rows of [4, 9]"),
    ("rows", [(4, 9)], {"start": 3, "stop": 1}, "node 'bad': rows: [3, 1) is not a range of the 4 rows of [4, 9]"),
    ("rows", [(4, 9)], {"start": 0}, "node 'bad': rows needs the attribute 'stop'"),
    ("concat", [(1, 9), (1, 8)], {}, "node 'bad': concat: operands differ past the first axis: [1, 9] and [1, 8]"),
    ("concat", [()], {}, "node 'bad': concat needs operands of rank 1 or more, got [[]]"),
]


@pytest.mark.parametrize("name,shapes,attrs,message", ERRORS, ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_shape_errors_name_the_node(name, shapes, attrs, message) -> None:
    g = TaskGraph()
    operands = [g.input(s) for s in shapes]
    with pytest.raises(ShapeError) as caught:
        g.kernel(name, *operands, id="bad", **attrs)
    assert str(caught.value) == message
    assert "bad" not in g.nodes


def test_mixed_dtypes() -> None:
    g = TaskGraph()
    a, b = g.input((4,), "float32"), g.input((4,), "float16")
    with pytest.raises(ShapeError, match=r"^node 'm': mul operands have mixed dtypes \['float16', 'float32'\]$"):
        g.mul(a, b, id="m")


# ----- other builder errors ---------------------------------------------------------------------


def test_duplicate_ids() -> None:
    g = TaskGraph()
    x = g.input((4,), id="x")
    with pytest.raises(InputError, match="^node 'x': duplicate id$"):
        g.relu(x, id="x")
    with pytest.raises(InputError, match="^node 'x': duplicate id$"):
        g.input((4,), id="x")
    assert len(g) == 1


@pytest.mark.parametrize("bad_id", ["", 7, ("x",)])
def test_ids_must_be_non_empty_strings(bad_id) -> None:
    with pytest.raises(InputError, match="must be a non-empty string"):
        TaskGraph().input((4,), id=bad_id)


@pytest.mark.parametrize("bad_id", ["é", "tab\there", "x\x01"])
def test_ids_must_be_printable_ascii(bad_id) -> None:
    with pytest.raises(InputError, match="an id must be printable ASCII"):
        TaskGraph().input((4,), id=bad_id)


@pytest.mark.parametrize("device", [-1, 3, True, 1.0, "0"])
def test_bad_devices(device) -> None:
    g = TaskGraph(devices=3)
    x = g.input((4,), id="x")
    with pytest.raises(InputError, match=r"^node 'i': device .* is not in \[0, 3\)$"):
        g.input((4,), device=device, id="i")
    with pytest.raises(InputError, match=r"^node 'm': device .* is not in \[0, 3\)$"):
        g.move(x, device, id="m")
    with pytest.raises(InputError, match=r"^node 'k': device .* is not in \[0, 3\)$"):
        g.relu(x, device=device, id="k")


def test_devices_must_be_positive() -> None:
    with pytest.raises(InputError, match="at least 1 device, got 0"):
        TaskGraph(devices=0)


@pytest.mark.parametrize("dtype", ["int8", "f32", "float"])
def test_bad_dtypes(dtype) -> None:
    with pytest.raises(InputError, match=rf"^node 'x': unknown dtype '{dtype}' \(known: float16, bfloat16, float32, float64\)$"):
        TaskGraph().input((4,), dtype, id="x")


def test_bad_shapes_and_attributes() -> None:
    g = TaskGraph()
    with pytest.raises(InputError, match=r"^node 'x': negative dimension in shape \[4, -1\]$"):
        g.input((4, -1), id="x")
    with pytest.raises(InputError, match=r"^node 'y': shape \[2.5\] must hold integers$"):
        g.input((2.5,), id="y")
    z = g.input((4,), id="z")
    with pytest.raises(InputError, match=r"^node 's': attribute 'factor' must be a number, got 'x'$"):
        g.scale(z, "x", id="s")
    with pytest.raises(InputError, match=r"^node 'e': attribute 'equation' must be a string, got 3$"):
        g.einsum(3, z, id="e")


def test_a_repeated_signature_is_checked_and_kept_as_written() -> None:
    """The builder keeps each signature's inference: a later call that differs only in an attribute's
    type or a zero's sign, or in a shape, is still checked on its own and keeps its own value."""
    g = TaskGraph()
    q, k, v = (g.input((8, 64), id=name) for name in "qkv")
    first = g.attention(q, k, v, heads=2, kv_heads=2, causal=True, id="a1")
    with pytest.raises(InputError, match=r"^node 'a2': attribute 'causal' must be True or False, got 1$"):
        g.attention(q, k, v, heads=2, kv_heads=2, causal=1, id="a2")
    with pytest.raises(ShapeError, match=r"^node 'a3': attention has no attribute 'stride'$"):
        g.attention(q, k, v, heads=2, kv_heads=2, causal=True, stride=4, id="a3")
    short = g.input((4, 64), id="short")
    with pytest.raises(ShapeError, match=r"^node 'a4': attention: a causal block needs as many queries as keys"):
        g.attention(q, short, short, heads=2, kv_heads=2, causal=True, id="a4")
    again = g.attention(q, k, v, heads=2, kv_heads=2, causal=True, id="a5")
    assert (again.shape, again.dtype) == (first.shape, first.dtype)
    g["a5"].attrs["heads"] = 99  # each node owns its attributes
    assert g.attention(q, k, v, heads=2, kv_heads=2, causal=True, id="a6") == g.tensor("a6")
    assert g["a6"].attrs == {"heads": 2, "kv_heads": 2, "causal": True}
    assert g["a1"].attrs["heads"] == 2
    g.scale(q, 0.0, id="s1")
    g.scale(q, -0.0, id="s2")
    g.scale(q, 1, id="s3")
    assert [str(g[s].attrs["factor"]) for s in ("s1", "s2", "s3")] == ["0.0", "-0.0", "1.0"]
    assert type(g["s3"].attrs["factor"]) is float


def test_undefined_inputs_and_unknown_kernels() -> None:
    g = TaskGraph()
    with pytest.raises(InputError, match=r"^node 'r': input 'nope' is not defined$"):
        g.relu("nope", id="r")
    with pytest.raises(InputError, match=r"^node 'm': input 'nope' is not defined$"):
        g.move("nope", 0, id="m")
    with pytest.raises(InputError, match=r"^node 'output': input 'nope' is not defined$"):
        g.output("nope")
    with pytest.raises(KernelError, match=r"^unknown kernel 'tanh' \(known: matmul, einsum"):
        g.kernel("tanh", g.input((4,)))


def test_outputs_and_effective_outputs() -> None:
    g = TaskGraph()
    x = g.input((4,), id="x")
    y = g.relu(x, id="y")
    z = g.exp(x, id="z")
    assert g.effective_outputs() == ["y", "z"]
    g.output(z, z, "y")
    assert g.outputs == ["z", "y"] and g.consumers()["x"] == ["y", "z"]
    assert y.id in g.to_json()["outputs"]

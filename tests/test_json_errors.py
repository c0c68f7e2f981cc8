"""Every bad field of a `turnip.taskgraph/1` or `turnip.memgraph/1` document gets a one-line message that
names the file and the node (or the top-level field) at fault."""

from __future__ import annotations

import copy
import json
import random

import pytest

from turnip_ir.errors import InputError
from turnip_ir.io import parse_json
from turnip_ir.kernels import KERNELS
from turnip_ir.limits import MAX_NESTING

from test_ir_roundtrip import ISSUE_MEMGRAPH, ISSUE_TASKGRAPH

KNOWN_OPS = ", ".join(["input", "move", *KERNELS])


def _node(doc: dict, node_id):
    return next(n for n in doc["nodes"] if n["id"] == node_id)


def _error(base: dict, change, name: str) -> str:
    doc = copy.deepcopy(base)
    change(doc)
    with pytest.raises(InputError) as caught:
        parse_json(json.dumps(doc), name)
    message = str(caught.value)
    assert "\n" not in message
    return message


TASKGRAPH_CASES = [
    ("device past 64 bits", lambda d: _node(d, "x").update(device=10**20), f"node 'x': field 'device' must be int, got {10**20}"),
    ("shape past 64 bits", lambda d: _node(d, "x").update(shape=[10**20]),
     f"node 'x': field 'shape' must be a list of integers, got [{10**20}]"),
    ("missing op", lambda d: _node(d, "y").pop("op"), "node 'y': missing field 'op'"),
    ("unknown op", lambda d: _node(d, "y").update(op="tanh"), f"node 'y': unknown op 'tanh' (known: {KNOWN_OPS})"),
    ("op not a string", lambda d: _node(d, "y").update(op=3), "node 'y': field 'op' must be str, got 3"),
    ("shape not a list", lambda d: _node(d, "x").update(shape=64), "node 'x': field 'shape' must be list, got 64"),
    ("shape of non-integers", lambda d: _node(d, "x").update(shape=[64, "a"]),
     "node 'x': field 'shape' must be a list of integers, got [64, 'a']"),
    ("shape of booleans", lambda d: _node(d, "x").update(shape=[True]),
     "node 'x': field 'shape' must be a list of integers, got [True]"),
    ("negative shape", lambda d: _node(d, "x").update(shape=[64, -64]),
     "node 'x': negative dimension in shape [64, -64]"),
    ("shape differs from inferred", lambda d: _node(d, "y").update(shape=[64, 32]),
     "node 'y': field 'shape' is [64, 32] but the op gives [64, 64]"),
    ("move shape differs", lambda d: _node(d, "z").update(shape=[1]), "node 'z': field 'shape' is [1] but the op gives [64, 64]"),
    ("dtype differs from inferred", lambda d: _node(d, "v").update(dtype="float16"),
     "node 'v': field 'dtype' is 'float16' but the op gives 'float32'"),
    ("unknown dtype", lambda d: _node(d, "w").update(dtype="int8"),
     "node 'w': unknown dtype 'int8' (known: float16, bfloat16, float32, float64)"),
    ("mixed dtypes", lambda d: _node(d, "w").update(dtype="float64"),
     "node 'y': matmul operands have mixed dtypes ['float32', 'float64']"),
    ("kernel shape error", lambda d: _node(d, "w").update(shape=[32, 64]),
     "node 'y': matmul inner dimensions differ: [64, 64] @ [32, 64]"),
    ("input missing shape", lambda d: _node(d, "x").pop("shape"), "node 'x': missing field 'shape'"),
    ("input missing dtype", lambda d: _node(d, "x").pop("dtype"), "node 'x': missing field 'dtype'"),
    ("input missing device", lambda d: _node(d, "x").pop("device"), "node 'x': missing field 'device'"),
    ("move missing device", lambda d: _node(d, "z").pop("device"), "node 'z': missing field 'device'"),
    ("device out of range", lambda d: _node(d, "z").update(device=2), "node 'z': device 2 is not in [0, 2)"),
    ("device not an integer", lambda d: _node(d, "x").update(device="0"), "node 'x': field 'device' must be int, got '0'"),
    ("input to unknown node", lambda d: _node(d, "y").update(inputs=["x", "q"]), "node 'y': input 'q' is not a node id"),
    ("inputs not a list", lambda d: _node(d, "v").update(inputs="x"), "node 'v': field 'inputs' must be list, got 'x'"),
    ("input given inputs", lambda d: _node(d, "w").update(inputs=["x"]), "node 'w': an input takes no inputs"),
    ("move of two", lambda d: _node(d, "z").update(inputs=["x", "y"]), "node 'z': a move takes exactly 1 input, got 2"),
    ("too many operands", lambda d: _node(d, "v").update(inputs=["x", "w"]), "node 'v': relu takes 1 operands, got 2"),
    ("unknown attribute", lambda d: _node(d, "v").update(attrs={"factor": 2.0}), "node 'v': relu has no attribute 'factor'"),
    ("attribute type", lambda d: _node(d, "v").update(op="scale", attrs={"factor": "big"}),
     "node 'v': attribute 'factor' must be a number, got 'big'"),
    ("missing attribute", lambda d: _node(d, "v").update(op="einsum"), "node 'v': einsum needs the attribute 'equation'"),
    ("bad einsum", lambda d: _node(d, "v").update(op="einsum", attrs={"equation": "ij->q"}),
     "node 'v': einsum output index 'q' is not in any operand"),
    ("duplicate id", lambda d: d["nodes"].append(dict(_node(d, "x"))), "node 'x': duplicate id"),
    ("id not a string", lambda d: d["nodes"].append({"id": 5, "op": "input"}), "node #5: field 'id' must be str, got 5"),
    ("node not an object", lambda d: d["nodes"].append([1]), "node #5: must be an object"),
    ("id not printable ASCII", lambda d: _node(d, "v").update(id="v\u00e9"), "node 'v\u00e9': an id must be printable ASCII (the IR text cannot carry other characters)"),
    ("unknown output", lambda d: d.update(outputs=["z", "nope"]), "output 'nope' is not a node id"),
    ("bad format string", lambda d: d.update(format="turnip.taskgraph/2"),
     "field 'format' must be 'turnip.taskgraph/1' or 'turnip.memgraph/1', got 'turnip.taskgraph/2'"),
    ("missing format", lambda d: d.pop("format"),
     "field 'format' must be 'turnip.taskgraph/1' or 'turnip.memgraph/1', got None"),
    ("devices not an integer", lambda d: d.update(devices="2"), "taskgraph: field 'devices' must be int, got '2'"),
    ("zero devices", lambda d: d.update(devices=0), "a taskgraph needs at least 1 device, got 0"),
    ("missing nodes", lambda d: d.pop("nodes"), "taskgraph: missing field 'nodes'"),
]


@pytest.mark.parametrize("change,message", [c[1:] for c in TASKGRAPH_CASES], ids=[c[0] for c in TASKGRAPH_CASES])
def test_taskgraph_field_errors(change, message) -> None:
    assert _error(ISSUE_TASKGRAPH, change, "g.json") == f"g.json: {message}"


def test_taskgraph_cycle_names_a_node_on_it() -> None:
    doc = copy.deepcopy(ISSUE_TASKGRAPH)
    doc["nodes"] += [
        {"id": "a", "op": "relu", "device": 0, "inputs": ["x"]},  # before the cycle, not on it
        {"id": "b", "op": "add", "device": 0, "inputs": ["a", "d"]},
        {"id": "c", "op": "exp", "device": 0, "inputs": ["b"]},
        {"id": "d", "op": "gelu", "device": 0, "inputs": ["c"]},
    ]
    doc["nodes"].reverse()
    message = _error(doc, lambda d: None, "g.json")
    assert message.startswith("g.json: node '") and message.endswith("': taskgraph has a cycle through it")
    assert message.split("'")[1] in {"b", "c", "d"}


def test_self_loop() -> None:
    message = _error(ISSUE_TASKGRAPH, lambda d: _node(d, "v").update(inputs=["v"]), "g.json")
    assert message == "g.json: node 'v': taskgraph has a cycle through it"


def test_json_syntax_error_has_line_and_column() -> None:
    with pytest.raises(InputError, match=r"^g.json:3:7: expecting value$"):
        parse_json('{"format":\n "turnip.taskgraph/1",\n "x": ,}', "g.json")
    with pytest.raises(InputError, match=r"^g.json: field 'format' must be"):
        parse_json("[1, 2]", "g.json")


MEMGRAPH_CASES = [
    ("negative device", lambda d: _node(d, 0).update(device=-1), "node 0: field 'device' must be a non-negative integer, got -1"),
    ("dtype not a string", lambda d: _node(d, 0).update(dtype=["float32"]),
     "node 0: field 'dtype' must be one of float16, bfloat16, float32, float64, got ['float32']"),
    ("loc past 64 bits", lambda d: _node(d, 0).update(loc=[0, 10**20]), f"node 0: field 'loc' must be [offset, size], got [0, {10**20}]"),
    ("loc too short", lambda d: _node(d, 0).update(loc=[0]), "node 0: field 'loc' must be [offset, size], got [0]"),
    ("negative loc", lambda d: _node(d, 0).update(loc=[-1, 16384]), "node 0: field 'loc' must be [offset, size], got [-1, 16384]"),
    ("loc not a list", lambda d: _node(d, 3).update(loc="0:16384"), "node 3: field 'loc' must be [offset, size], got '0:16384'"),
    ("missing loc", lambda d: _node(d, 3).pop("loc"), "node 3: a kernel needs 'device' and 'loc'"),
    ("input with neither", lambda d: _node(d, 0).pop("loc"), "node 0: an input needs 'device' and 'loc'"),
    ("bad storage", lambda d: _node(d, 5).update(storage=[1, 2, 3]), "node 5: field 'storage' must be [offset, size], got [1, 2, 3]"),
    ("offload without storage", lambda d: _node(d, 5).pop("storage"), "node 5: an offload needs 'device' and 'storage'"),
    ("unknown kernel", lambda d: _node(d, 3).update(kernel="tanh"),
     f"node 3: unknown kernel 'tanh' (known: {', '.join(KERNELS)})"),
    ("missing kernel", lambda d: _node(d, 6).pop("kernel"), "node 6: missing field 'kernel'"),
    ("unknown op", lambda d: _node(d, 3).update(op="fused"),
     "node 3: field 'op' must be one of input, kernel, move, offload, reload, got 'fused'"),
    ("dangling mem_dep", lambda d: _node(d, 6).update(mem_deps=[3, 42]), "node 6: refers to node 42, which does not exist"),
    ("dangling input", lambda d: _node(d, 4).update(inputs=[9]), "node 4: refers to node 9, which does not exist"),
    ("dangling redundant dep", lambda d: _node(d, 4).update(redundant_deps=[8]), "node 4: refers to node 8, which does not exist"),
    ("mem_deps not a list", lambda d: _node(d, 6).update(mem_deps=3), "node 6: field 'mem_deps' must be a list of node ids, got 3"),
    ("reload of nothing", lambda d: _node(d, 2).update(inputs=[]), "node 2: a reload takes 1 input(s), got 0"),
    ("kernel shape error", lambda d: _node(d, 3).update(inputs=[0]), "node 3 (matmul 'y'): matmul takes 2 operands, got 1"),
    ("duplicate id", lambda d: _node(d, 2).update(id=1), "node 1: duplicate id"),
    ("id not an integer", lambda d: _node(d, 2).update(id="2"), "node #2: field 'id' must be an integer, got '2'"),
    ("missing task", lambda d: _node(d, 4).pop("task"), "node 4: missing field 'task'"),
    ("bad dtype", lambda d: _node(d, 0).update(dtype="int8"),
     "node 0: field 'dtype' must be one of float16, bfloat16, float32, float64, got 'int8'"),
    ("unknown output node", lambda d: d.update(outputs={"z": 99}), "output 'z': node 99 does not exist"),
    ("budget not an integer", lambda d: d.update(budget="48k"), "memgraph: field 'budget' must be an integer, got '48k'"),
    ("missing budget", lambda d: d.pop("budget"), "memgraph: missing field 'budget'"),
    ("bad format string", lambda d: d.update(format="turnip.memgraph"),
     "field 'format' must be 'turnip.taskgraph/1' or 'turnip.memgraph/1', got 'turnip.memgraph'"),
]


@pytest.mark.parametrize("change,message", [c[1:] for c in MEMGRAPH_CASES], ids=[c[0] for c in MEMGRAPH_CASES])
def test_memgraph_field_errors(change, message) -> None:
    assert _error(ISSUE_MEMGRAPH, change, "m.json") == f"m.json: {message}"


def test_memgraph_cycle_names_a_node_on_it() -> None:
    message = _error(ISSUE_MEMGRAPH, lambda d: _node(d, 3).update(mem_deps=[6]), "m.json")
    assert message in ("m.json: node 3: memgraph has a cycle through it", "m.json: node 6: memgraph has a cycle through it")


def test_memgraph_nodes_in_any_order() -> None:
    doc = copy.deepcopy(ISSUE_MEMGRAPH)
    doc["nodes"].reverse()
    graph = parse_json(json.dumps(doc))
    position = {node.id: i for i, node in enumerate(graph.nodes)}
    assert sorted(position) == [0, 1, 2, 3, 4, 5, 6]
    assert all(position[dep] < position[node.id] for node in graph.nodes for dep in node.deps())
    assert position[3] < position[6]  # the memory dependency orders them too


@pytest.mark.parametrize("depth", [300, 5000, 100_000])
def test_json_nested_too_deep_is_one_line(depth) -> None:
    """Issue 27 item 10: deep nesting gave a RecursionError; now one line naming the file."""
    text = json.dumps(ISSUE_TASKGRAPH)[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(InputError) as caught:
        parse_json(text, "deep.json")
    assert str(caught.value) == "deep.json: arrays and objects nest too deep (at most 200 levels)"


def _depth(value) -> int:
    """Containers on the longest path from `value` down (a scalar has 0): the definition, on the parsed value."""
    if isinstance(value, dict):
        return 1 + max((_depth(child) for child in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(child) for child in value), default=0)
    return 0


def _nested(rng: random.Random, depth: int):
    """A value exactly `depth` containers deep, with siblings and strings full of brackets, quotes and escapes."""
    noise = ["[", "]]", "{", '"', "\\", "\\[", '\\"[', "\u005b", "", "[\"]"]
    if depth == 0:
        return rng.choice([1, 2.5, None, True, "".join(rng.choices(noise, k=3))])
    children = [_nested(rng, depth - 1)] + [_nested(rng, rng.randrange(min(depth, 3))) for _ in range(rng.randrange(3))]
    rng.shuffle(children)
    if rng.random() < 0.5:
        return children
    return {"".join(rng.choices(noise, k=2)) + str(i): child for i, child in enumerate(children)}


@pytest.mark.parametrize("seed", range(20))
def test_json_nesting_is_refused_exactly_past_the_limit(seed) -> None:
    """The text-level depth check agrees with the depth of the parsed value, at the limit and one past it,
    whatever brackets and escapes the strings hold."""
    rng = random.Random(seed)
    for depth in (rng.randrange(1, 8), MAX_NESTING - 1, MAX_NESTING):
        wrapped = {"format": "turnip.taskgraph/1", "extra": _nested(rng, depth)}
        assert _depth(wrapped) == depth + 1
        text = json.dumps(wrapped, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        with pytest.raises(InputError, match="field 'devices'"):  # past the depth check
            parse_json(text, "ok.json")
    too_deep = json.dumps({"format": "turnip.taskgraph/1", "extra": _nested(rng, MAX_NESTING + 1)})
    with pytest.raises(InputError, match="nest too deep"):
        parse_json(too_deep, "deep.json")


def test_shape_rank_is_bounded_in_both_formats() -> None:
    """Issue 27 item 11: a tensor of more than MAX_RANK dimensions is refused, with a short message."""
    taskgraph = _error(ISSUE_TASKGRAPH, lambda d: _node(d, "x").update(shape=[1] * 100_000), "t.json")
    assert taskgraph == "t.json: node 'x': field 'shape' has 100000 dimensions, more than the 64 a tensor may have"
    memgraph = _error(ISSUE_MEMGRAPH, lambda d: _node(d, 0).update(shape=[1] * 100_000), "m.json")
    assert memgraph.startswith("m.json: node 0: field 'shape' must be a list of at most 64 sizes, got [1, 1, 1")
    assert len(memgraph) < 200


def test_the_integer_bound_is_the_same_for_json_and_ir() -> None:
    """Issue 27 item 9: JSON refused 2**62 but IR text took any integer (OverflowError later)."""
    from turnip_ir.io import parse_ir
    from turnip_ir.limits import INT_LIMIT

    _error(ISSUE_MEMGRAPH, lambda d: _node(d, 5).update(storage=[INT_LIMIT, 16384]), "m.json")
    ir = ("builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4096 : i64} {\n"
          "  %a, %at = turnip.input in <OFFSET, 64> : tensor<4x4xf32>\n}\n")
    parse_ir(ir.replace("OFFSET", str(INT_LIMIT - 1)), "ok.mlir")
    with pytest.raises(InputError) as caught:
        parse_ir(ir.replace("OFFSET", str(INT_LIMIT)), "m.mlir")
    assert str(caught.value) == f"m.mlir:2:30: integer {INT_LIMIT} is out of range (magnitude must stay below 2**62)"


def test_an_integer_of_thousands_of_digits_is_one_line_in_both_formats() -> None:
    """Python refuses to read integers past 4300 digits with a ValueError: the readers say it in one line."""
    from turnip_ir.io import parse_ir

    with pytest.raises(InputError) as caught:
        parse_json('{"format": "turnip.taskgraph/1", "devices": ' + "1" * 5000 + "}", "big.json")
    assert str(caught.value) == "big.json: an integer has thousands of digits (magnitude must stay below 2**62)"
    ir = ("builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4096 : i64} {\n"
          "  %a, %at = turnip.input in <" + "9" * 5000 + ", 64> : tensor<4x4xf32>\n}\n")
    with pytest.raises(InputError) as caught:
        parse_ir(ir, "big.mlir")
    assert str(caught.value) == "big.mlir:2:5030: an integer has thousands of digits (magnitude must stay below 2**62)"

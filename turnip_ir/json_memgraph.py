"""Reading the `turnip.memgraph/1` JSON format, including hand-written memgraphs.

Fields are checked and every error names the node. Nodes may come in any order; they are stored in a
topological order of data and memory edges (a cycle is an error naming a node on it). Where `shape`
and `dtype` are absent they are inferred from the node's inputs when possible; a memgraph can be
verified without them, but only run with them. Where they are given, `check_types` holds them to the
kernels' shape rules.
"""

from __future__ import annotations

from turnip_ir.errors import InputError, TurnipError
from turnip_ir.json_taskgraph import checked_attrs, topo_order
from turnip_ir.kernels import DTYPE_BYTES, KERNELS, known_dtype
from turnip_ir.limits import MAX_RANK, int_in_range, shorten
from turnip_ir.memgraph import MEMGRAPH_FORMAT, MEMGRAPH_OPS, MemGraph, MemNode
from turnip_ir.memgraph_types import check_types, fill_types
from turnip_ir.taskgraph import valid_id


def _int(value) -> bool:
    return int_in_range(value)


def _get(node: dict, name: str, where: str, check, what: str, required: bool = False):
    if name not in node:
        if required:
            raise InputError(f"{where}: missing field '{name}'")
        return None
    value = node[name]
    if not check(value):
        raise InputError(f"{where}: field '{name}' must be {what}, got {shorten(repr(value))}")
    return value


def _region(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_int(v) and v >= 0 for v in value)


def _shape(value) -> bool:
    return _int_list(value) and len(value) <= MAX_RANK and all(d >= 0 for d in value)


def _int_list(value) -> bool:
    return isinstance(value, list) and all(_int(v) for v in value)


def memgraph_from_json(doc) -> MemGraph:
    if not isinstance(doc, dict):
        raise InputError("memgraph JSON must be an object")
    if doc.get("format") != MEMGRAPH_FORMAT:
        raise InputError(f"field 'format' must be '{MEMGRAPH_FORMAT}', got {doc.get('format')!r}")
    devices = _get(doc, "devices", "memgraph", _int, "an integer", required=True)
    budget = _get(doc, "budget", "memgraph", _int, "an integer", required=True)
    nodes = _get(doc, "nodes", "memgraph", lambda v: isinstance(v, list), "a list", required=True)
    outputs = _get(doc, "outputs", "memgraph", lambda v: isinstance(v, dict), "an object") or {}
    parsed: dict[int, MemNode] = {}
    for index, raw in enumerate(nodes):
        node = _parse_node(raw, index)
        if node.id in parsed:
            raise InputError(f"node {node.id}: duplicate id")
        parsed[node.id] = node
    for node in parsed.values():
        for ref in node.inputs + node.mem_deps + node.redundant_deps:
            if ref not in parsed:
                raise InputError(f"node {node.id}: refers to node {ref}, which does not exist")
    deps = {node_id: list(node.deps()) for node_id, node in parsed.items()}
    try:
        order = topo_order(deps)
    except InputError as err:
        raise InputError(str(err).replace("node '", "node ").replace("': taskgraph", ": memgraph")) from None
    graph = MemGraph(devices, budget)
    for node_id in order:
        graph.add(fill_types(parsed[node_id], parsed))
    for task, node_id in outputs.items():
        if not _int(node_id) or node_id not in parsed:
            raise InputError(f"output '{task}': node {node_id!r} does not exist")
        graph.outputs[task] = node_id
    check_types(graph)
    return graph


def _parse_node(raw, index: int) -> MemNode:
    if not isinstance(raw, dict):
        raise InputError(f"node #{index}: must be an object")
    where = f"node #{index}"
    node_id = _get(raw, "id", where, _int, "an integer", required=True)
    where = f"node {node_id}"
    op = _get(raw, "op", where, lambda v: v in MEMGRAPH_OPS, f"one of {', '.join(MEMGRAPH_OPS)}", required=True)
    kernel = _get(raw, "kernel", where, lambda v: isinstance(v, str), "a string", required=op == "kernel")
    if op == "kernel" and kernel not in KERNELS:
        raise InputError(f"{where}: unknown kernel '{kernel}' (known: {', '.join(KERNELS)})")
    task = _get(raw, "task", where, lambda v: isinstance(v, str) and valid_id(v), "a printable ASCII string", required=True)
    device = _get(raw, "device", where, lambda v: _int(v) and v >= 0, "a non-negative integer")
    loc = _get(raw, "loc", where, _region, "[offset, size]")
    storage = _get(raw, "storage", where, _region, "[offset, size]")
    shape = _get(raw, "shape", where, _shape, f"a list of at most {MAX_RANK} sizes")
    dtype = _get(raw, "dtype", where, lambda v: isinstance(v, str) and known_dtype(v), f"one of {', '.join(DTYPE_BYTES)}")
    attrs = _get(raw, "attrs", where, lambda v: isinstance(v, dict), "an object") or {}
    if attrs and op != "kernel":
        raise InputError(f"{where}: {_article(op)} {op} has no attributes")
    node = MemNode(
        id=node_id,
        op=op,
        task=task,
        device=device,
        loc=tuple(loc) if loc else None,
        storage=tuple(storage) if storage else None,
        inputs=tuple(_get(raw, "inputs", where, _int_list, "a list of node ids") or ()),
        mem_deps=tuple(_get(raw, "mem_deps", where, _int_list, "a list of node ids") or ()),
        kernel=kernel,
        shape=tuple(shape) if shape is not None else None,
        dtype=dtype,
        attrs=checked_attrs(kernel, attrs, f"{where} ({kernel} '{task}')") if attrs else {},
        redundant_deps=tuple(_get(raw, "redundant_deps", where, _int_list, "a list of node ids") or ()),
    )
    _check_placement(node, where)
    return node


def _check_placement(node: MemNode, where: str) -> None:
    if node.op == "offload":
        if node.storage is None or node.device is None:
            raise InputError(f"{where}: an offload needs 'device' and 'storage'")
    elif node.op == "input" and node.storage is not None and node.loc is None:
        pass
    else:
        if node.loc is None or node.device is None:
            raise InputError(f"{where}: {_article(node.op)} {node.op} needs 'device' and 'loc'")
    arity = {"input": (0, 0), "move": (1, 1), "offload": (1, 1), "reload": (1, 1)}.get(node.op)
    if arity and not arity[0] <= len(node.inputs) <= arity[1]:
        raise InputError(f"{where}: {_article(node.op)} {node.op} takes {arity[1]} input(s), got {len(node.inputs)}")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"

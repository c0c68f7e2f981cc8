"""An oracle for memgraphs, written from the seed's conditions alone, to check the fast verifier's verdicts.

It shares no code with what it checks: nothing from passes/, no `RegionMap`, no `written_region`, no
last-writer sweep, not the verifier's rules. It reads the `MemNode` fields (and the taskgraph) and checks
every pair of nodes whose memory overlaps (spans sorted by start, each paired with those starting before
it ends), with full ancestor sets for happens-before: quadratic, fine for a few hundred nodes.

- structure: ids unique, edges name existing nodes, inputs wait for nothing, locations on a real GPU
  inside the budget, regions large enough for the tensor, operands where the op reads them (a kernel
  or offload: a location on its own GPU; a move: a GPU location; a reload: CPU storage);
- (c) no cycle in the graph of data edges (`inputs`) and memory edges (`mem_deps`); `redundant_deps`
  are not edges, the runtime ignores them;
- happens-before: a happens before b in every execution when b is reachable from a, or when a is an
  input and b is not (inputs are in place before the run starts, so an input may wait for nothing);
- (b) for every two nodes whose memory overlaps (bytes of one GPU's locations, or of CPU storage), one
  happens before the other, and every reader of the earlier one (a node with it in `inputs`) happens
  before the later one, so no value is overwritten while it is still to be read;
- (a) every taskgraph node has a memgraph node that computes it (same op, kernel, attributes, device,
  shape and dtype), and each operand of that node holds the taskgraph operand's value, directly or through
  offload -> reload copies;
- outputs: each output's holder holds that task's value, and every node whose memory overlaps the
  holder's happens before it, so the value is still there when the run ends.

`violations(memgraph, taskgraph=None)` lists what is broken, one sentence each; empty means correct.
"""

from __future__ import annotations

import math

from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.memgraph import MemGraph, MemNode

COPIES = ("offload", "reload")


def violations(graph: MemGraph, taskgraph=None) -> list[str]:
    """Every broken condition of `graph` (and of `graph` implementing `taskgraph`, when given)."""
    nodes = {node.id: node for node in graph.nodes}
    problems = _references(graph, nodes)
    if problems:
        return problems
    problems = _structure(graph) + [p for node in graph.nodes for p in _reads_where_it_may(node, nodes)]
    order = _topological(nodes)
    if len(order) < len(nodes):
        stuck = sorted(set(nodes) - set(order))
        return [f"cycle: nodes {stuck[:8]} wait for each other through data and memory edges", *problems]
    hb = _HappensBefore(order, nodes)
    pairs = _sharing(nodes)
    problems += _overlaps(nodes, pairs, hb)
    problems += _outputs(graph, nodes, pairs, hb)
    if taskgraph is not None:
        problems += _implements(graph, nodes, taskgraph)
    return problems


def _name(node: MemNode) -> str:
    return f"node {node.id} ({node.kernel if node.op == 'kernel' else node.op} '{node.task}')"


def _references(graph: MemGraph, nodes: dict[int, MemNode]) -> list[str]:
    """Ids unique and edges naming existing nodes: without these there is no graph to check."""
    problems = [] if len(nodes) == len(graph.nodes) else ["two nodes share an id"]
    for node in graph.nodes:
        for dep in node.inputs + node.mem_deps:
            if dep not in nodes:
                problems.append(f"{_name(node)} depends on node {dep}, which does not exist")
    return problems


def _structure(graph: MemGraph) -> list[str]:
    """Inputs wait for nothing; locations on a real GPU, inside the budget; regions hold their tensors."""
    problems = []
    for node in graph.nodes:
        if node.op == "input" and node.mem_deps:
            problems.append(f"{_name(node)} is an input, in place before the run, but waits for {list(node.mem_deps)}")
        if node.loc is not None and (node.device is None or not 0 <= node.device < graph.devices):
            problems.append(f"{_name(node)} has a location on device {node.device}, not one of {graph.devices} GPUs")
        if node.loc is not None and not (0 <= node.loc[0] and node.loc[0] + node.loc[1] <= graph.budget):
            problems.append(f"{_name(node)} location {list(node.loc)} is outside the budget of {graph.budget} bytes")
        need = math.prod(node.shape) * DTYPE_BYTES[node.dtype] if node.shape is not None and node.dtype else 0
        for region in (node.loc, node.storage):
            if region is not None and region[1] < need:
                problems.append(f"{_name(node)}: region {list(region)} cannot hold {need} bytes")
    return problems


def _topological(nodes: dict[int, MemNode]) -> list[int]:
    """Node ids in an order where every edge goes forward; fewer than all of them when there is a cycle."""
    waiting = {node_id: len(set(node.inputs + node.mem_deps)) for node_id, node in nodes.items()}
    users: dict[int, list[int]] = {node_id: [] for node_id in nodes}
    for node in nodes.values():
        for dep in set(node.inputs + node.mem_deps):
            users[dep].append(node.id)
    ready = [node_id for node_id, count in waiting.items() if count == 0]
    order = []
    while ready:
        node_id = ready.pop()
        order.append(node_id)
        for user in users[node_id]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return order


class _HappensBefore:
    """a happens before b in every execution: b reachable from a, or a an input and b not."""

    def __init__(self, order: list[int], nodes: dict[int, MemNode]):
        self.nodes = nodes
        self.index = {node_id: i for i, node_id in enumerate(order)}
        self.ancestors: dict[int, int] = {}
        for node_id in order:
            bits = 0
            for dep in nodes[node_id].inputs + nodes[node_id].mem_deps:
                bits |= self.ancestors[dep] | (1 << self.index[dep])
            self.ancestors[node_id] = bits

    def __call__(self, a: int, b: int) -> bool:
        if a == b:
            return False
        if self.nodes[a].op == "input" and self.nodes[b].op != "input":
            return True
        return bool(self.ancestors[b] >> self.index[a] & 1)


def _memory(node: MemNode) -> list[tuple[str, int, int]]:
    """The bytes a node's value occupies, as (where, start, end): its GPU location and its CPU storage."""
    spans = []
    if node.loc is not None:
        spans.append((f"GPU {node.device}", node.loc[0], node.loc[0] + node.loc[1]))
    if node.storage is not None:
        spans.append(("CPU storage", node.storage[0], node.storage[0] + node.storage[1]))
    return [span for span in spans if span[1] < span[2]]


def _sharing(nodes: dict[int, MemNode]) -> list[tuple[int, int, str]]:
    """Every pair of nodes whose memory overlaps, with where: spans sorted by start per place, and each
    span paired with the later-starting spans that begin before it ends."""
    places: dict[str, list[tuple[int, int, int]]] = {}
    for node in nodes.values():
        for where, start, end in _memory(node):
            places.setdefault(where, []).append((start, end, node.id))
    pairs = []
    for where, spans in places.items():
        spans.sort()
        for i, (start, end, a) in enumerate(spans):
            for lo, hi, b in spans[i + 1 :]:
                if lo >= end:
                    break
                pairs.append((a, b, f"[{lo}, {min(end, hi)}) on {where}"))
    return pairs


def _overlaps(nodes: dict[int, MemNode], pairs, hb: _HappensBefore) -> list[str]:
    """(b): every two nodes sharing bytes are ordered, and the earlier one's readers come before the later."""
    readers: dict[int, list[int]] = {node_id: [] for node_id in nodes}
    for node in nodes.values():
        for dep in set(node.inputs):
            readers[dep].append(node.id)
    problems = []
    for a, b, where in pairs:
        if not hb(a, b) and not hb(b, a):
            problems.append(f"race: {_name(nodes[a])} and {_name(nodes[b])} both use {where} in either order")
            continue
        first, later = (a, b) if hb(a, b) else (b, a)
        for r in readers[first]:
            if not hb(r, later):
                problems.append(f"race: {_name(nodes[later])} may overwrite {where} before {_name(nodes[r])} reads {_name(nodes[first])}")
    return problems


def _value(node: MemNode, nodes: dict[int, MemNode]) -> str:
    """The taskgraph id of the value a node holds: copies hold their input's value."""
    while node.op in COPIES and len(node.inputs) == 1:
        node = nodes[node.inputs[0]]
    return node.task


def _outputs(graph: MemGraph, nodes: dict[int, MemNode], pairs, hb: _HappensBefore) -> list[str]:
    """Each holder holds its output's value, and everything sharing its memory happens before it."""
    problems = []
    holders = {}
    for task, holder_id in graph.outputs.items():
        holder = nodes.get(holder_id)
        if holder is None or _value(holder, nodes) != task or (not _memory(holder) and holder.nbytes > 0):
            problems.append(f"output '{task}': node {holder_id} does not hold it")
        else:
            holders.setdefault(holder_id, []).append(task)
    for a, b, where in pairs:
        for holder, other in ((a, b), (b, a)):
            for task in holders.get(holder, ()):
                if not hb(other, holder):
                    problems.append(f"output '{task}': {_name(nodes[other])} may overwrite {where} after {_name(nodes[holder])} wrote it")
    return problems


def _implements(graph: MemGraph, nodes: dict[int, MemNode], taskgraph) -> list[str]:
    """(a): every task computed, each operand holding the right value; every output held."""
    problems, computed = [], set()
    for node in nodes.values():
        if node.op in COPIES:
            if node.task != _value(node, nodes):
                problems.append(f"{_name(node)} copies the value of '{_value(node, nodes)}'")
            continue
        task = taskgraph.nodes.get(node.task)
        if task is None:
            problems.append(f"{_name(node)} computes no taskgraph node")
            continue
        computed.add(task.id)
        problems += _same_task(node, task)
        for k, (dep, want) in enumerate(zip(node.inputs, task.inputs)):
            if _value(nodes[dep], nodes) != want:
                problems.append(f"{_name(node)}: operand {k} holds '{_value(nodes[dep], nodes)}', not '{want}'")
    problems += [f"task '{t}' is computed by no memgraph node" for t in taskgraph.nodes if t not in computed]
    problems += [f"output '{t}' has no holder" for t in taskgraph.effective_outputs() if t not in graph.outputs]
    return problems


def _same_task(node: MemNode, task) -> list[str]:
    op = task.op if task.op in ("input", "move") else "kernel"
    got = (node.op, node.kernel, node.attrs, len(node.inputs), node.shape, node.dtype)
    want = (op, None if op != "kernel" else task.op, task.attrs, len(task.inputs), tuple(task.shape), task.dtype)
    problems = [] if got == want else [f"{_name(node)} is {got}, task '{task.id}' is {want}"]
    if node.loc is not None and node.device != task.device:
        problems.append(f"{_name(node)} is on GPU {node.device}, task '{task.id}' on GPU {task.device}")
    return problems


def _reads_where_it_may(node: MemNode, nodes: dict[int, MemNode]) -> list[str]:
    """A kernel or offload reads a location on its own GPU, a move any GPU location, a reload storage."""
    problems = []
    for dep in node.inputs:
        src = nodes[dep]
        if node.op == "reload":
            ok = src.storage is not None and src.op in ("offload", "input")
        elif node.op == "move":
            ok = src.loc is not None
        else:
            ok = src.loc is not None and src.device == node.device
        if not ok:
            problems.append(f"{_name(node)} reads {_name(src)}, which is not where a {node.op} reads")
    arity = {"input": 0, "move": 1, "offload": 1, "reload": 1}.get(node.op)
    if arity is not None and len(node.inputs) != arity:
        problems.append(f"{_name(node)} has {len(node.inputs)} inputs, a {node.op} takes {arity}")
    return problems

"""The memgraph verifier: proves the seed's conditions on any memgraph, planned or hand-written.

It lives in turnip_ir, below the passes, so that the compiler (passes/verify_memgraph.py), `turnip run` and
the runtime's `execute()` all prove plans with this one function.

Checks, each failing with a `VerifyError` that names the nodes and the location:
- structure: references exist, the graph is acyclic (c), devices and regions lie within bounds, regions
  hold their tensors, kernels and offloads read GPU copies on their own GPU, reloads read storage;
- (a) with a taskgraph: every operand of every kernel and move traces back, through reload -> offload
  chains, to the producer of the right task, and every output is held;
- (b) no race: a sweep in topological order keeps the last writer of every byte per space; a node that
  overwrites bytes must come after their last writer and after every reader of it, through `inputs`
  and `mem_deps` (never `redundant_deps`). Happens-before is a set of ancestors per node, freed after
  its last successor (`turnip_ir.ancestors`), over the nodes an overwrite can name: the last writers of
  bytes in a space where writes overlap, and their readers. It is exact for them; any other node has
  no bit and counts as not before, so a missed edge can only be reported, never overlooked;
- inputs are written before the run starts: they come first in the sweep and two of them may not overlap;
- outputs survive: at the end of the sweep an output's holder is still the last writer of its region.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numba import njit


from turnip_ir.ancestors import ancestor_answers
from turnip_ir.memarrays import STORAGE, MemArrays, csr_union, written_region
from turnip_ir.last_writer import Overwrites
from turnip_ir.errors import VerifyError
from turnip_ir.kernels import nbytes
from turnip_ir.memgraph import MemGraph, MemNode


def verify_memgraph(graph: MemGraph, taskgraph=None) -> None:
    """Raise `VerifyError` unless `graph` is a correct memgraph (and implements `taskgraph`, when given)."""
    nodes = _topological(graph)
    pos = {node.id: i for i, node in enumerate(nodes)}
    _check_nodes(graph, nodes, pos)
    _check_races(graph, nodes, pos)
    if taskgraph is not None:
        _check_taskgraph(graph, nodes, pos, taskgraph)


def _name(node: MemNode) -> str:
    what = node.kernel or node.op
    return f"node {node.id} ({what} '{node.task}')"


def _where(space: int, start: int, end: int) -> str:
    return f"[{start}, {end}) in CPU storage" if space == STORAGE else f"[{start}, {end}) on GPU {space}"


def _topological(graph: MemGraph) -> list[MemNode]:
    """The nodes in a topological order of inputs + mem_deps, or a `VerifyError` naming a node on a cycle."""
    if _in_order(graph.nodes):
        return list(graph.nodes)
    by_id = {}
    for node in graph.nodes:
        if node.id in by_id:
            raise VerifyError(f"node {node.id}: duplicate id")
        by_id[node.id] = node
    for node in graph.nodes:
        for dep in node.inputs + node.mem_deps + node.redundant_deps:
            if dep not in by_id:
                raise VerifyError(f"{_name(node)} depends on node {dep}, which does not exist")
    waiting, users = {}, {node.id: [] for node in graph.nodes}
    for node in graph.nodes:
        deps = set(node.deps())
        for dep in deps:
            users[dep].append(node.id)
        waiting[node.id] = len(deps)
    # inputs are in place before the run starts, so they come first: FIFO keeps them ahead of all users
    ready = deque(sorted((n.id for n in graph.nodes if waiting[n.id] == 0), key=lambda i: by_id[i].op != "input"))
    order = []
    while ready:
        node_id = ready.popleft()
        order.append(by_id[node_id])
        for user in users[node_id]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if len(order) < len(graph.nodes):
        stuck = min(node_id for node_id, count in waiting.items() if count > 0)
        raise VerifyError(f"cycle: {_name(by_id[stuck])} is on a dependency cycle")
    return order


def _in_order(nodes: list[MemNode]) -> bool:
    """Are `nodes` already a topological order with the inputs first (as the compiler writes them), their
    ids distinct and every dependency's id among them? Then `_topological` keeps them as they are; when
    not, it checks ids and dependencies one by one, for the diagnostic."""
    seen: set[int] = set()
    inputs_done = False
    for node in nodes:
        if node.op == "input":
            if inputs_done:
                return False
        else:
            inputs_done = True
        if node.id in seen or not (seen.issuperset(node.inputs) and seen.issuperset(node.mem_deps)):
            return False
        seen.add(node.id)
    return all(seen.issuperset(node.redundant_deps) for node in nodes if node.redundant_deps)


def _check_nodes(graph: MemGraph, nodes: list[MemNode], pos: dict) -> None:
    """Devices and regions in bounds and large enough; each operand where its reader reads it."""
    need: dict[tuple, int] = {}
    for node in nodes:
        if node.device is not None and not 0 <= node.device < graph.devices:
            raise VerifyError(f"{_name(node)}: device {node.device} is not in [0, {graph.devices})")
        key = (node.shape, node.dtype)
        if key not in need:
            need[key] = nbytes(node.shape, node.dtype) if node.shape is not None and node.dtype else 0
        _check_regions(graph, node, need[key])
        for dep in node.inputs:
            src = nodes[pos[dep]]
            if node.op == "reload":
                ok = src.storage is not None and src.op in ("offload", "input")
            elif node.op == "move":
                ok = src.loc is not None
            else:
                ok = src.loc is not None and src.op != "offload" and src.device == node.device
            if not ok:
                raise VerifyError(f"{_name(node)} cannot read {_name(src)}: it is not where a {node.op} reads")


def _check_regions(graph: MemGraph, node: MemNode, need: int) -> None:
    if node.loc is not None:
        start, size = node.loc
        if start < 0 or start + size > graph.budget:
            raise VerifyError(f"{_name(node)}: location [{start}, {start + size}) is outside the budget [0, {graph.budget})")
        if size < need:
            raise VerifyError(f"{_name(node)}: location size {size} cannot hold {need} bytes")
    if node.storage is not None and node.storage[1] < need:
        raise VerifyError(f"{_name(node)}: storage size {node.storage[1]} cannot hold {need} bytes")


def _check_races(graph: MemGraph, nodes: list[MemNode], pos: dict) -> None:
    """(b): every overwrite comes after the last writer of those bytes and all its readers."""
    arrays = MemArrays.build(nodes)
    over = Overwrites(arrays)
    preloaded = np.array([_preloaded(node) for node in nodes], dtype=np.bool_)
    ask_ptr, asked, record = _race_questions(over.ptr, over.writer, arrays.read_ptr, arrays.read_idx, preloaded)
    dep_ptr, dep_idx = csr_union(arrays.data_ptr, arrays.data_idx, arrays.mem_ptr, arrays.mem_idx)
    before = ancestor_answers(dep_ptr, dep_idx, ask_ptr, asked)
    both = np.flatnonzero(preloaded[over.writer] & preloaded[over.node])
    late = np.flatnonzero(~before)
    if len(both) or len(late):
        k = int(min(both[0] if len(both) else len(over.writer), record[late[0]] if len(late) else len(over.writer)))
        w, x = nodes[over.node[k]], nodes[over.writer[k]]
        where = _where(int(arrays.space[over.node[k]]), int(over.start[k]), int(over.end[k]))
        if len(both) and both[0] == k:
            raise VerifyError(f"race: {_name(w)} and {_name(x)} both start in {where}")
        first = int(asked[late[0]])
        if first == over.writer[k]:
            raise VerifyError(f"race: {_name(w)} overwrites {where} while {_name(x)} may still write it")
        raise VerifyError(f"race: {_name(w)} overwrites {where} before {_name(nodes[first])} has read node {x.id} ('{x.task}')")
    _check_outputs(graph, nodes, pos, over)


@njit(cache=True)
def _race_questions(over_ptr, writer, read_ptr, read_idx, preloaded):
    """Per overwrite record, in order: its writer unless preloaded, then every reader of the writer.
    Returns the questions by overwriting node (CSR) and the record each question belongs to."""
    n = over_ptr.shape[0] - 1
    total = 0
    for k in range(writer.shape[0]):
        x = writer[k]
        total += read_ptr[x + 1] - read_ptr[x] + (0 if preloaded[x] else 1)
    ptr = np.zeros(n + 1, np.int64)
    asked = np.empty(total, np.int64)
    record = np.empty(total, np.int64)
    m = 0
    for w in range(n):
        for k in range(over_ptr[w], over_ptr[w + 1]):
            x = writer[k]
            if not preloaded[x]:
                asked[m], record[m] = x, k
                m += 1
            for e in range(read_ptr[x], read_ptr[x + 1]):
                asked[m], record[m] = read_idx[e], k
                m += 1
        ptr[w + 1] = m
    return ptr, asked, record


def _preloaded(node: MemNode) -> bool:
    """An input without dependencies is written before the run starts."""
    return node.op == "input" and not node.mem_deps


def _check_outputs(graph: MemGraph, nodes: list[MemNode], pos: dict, over: Overwrites) -> None:
    for task, holder_id in graph.outputs.items():
        if holder_id not in pos:
            raise VerifyError(f"output '{task}': node {holder_id} does not exist")
        holder = nodes[pos[holder_id]]
        region = written_region(holder)
        if holder.task != task or region is None:
            raise VerifyError(f"output '{task}': {_name(holder)} does not hold it")
        for start, end, x in over.last_writers(*region):
            if x != pos[holder_id]:
                where = _where(region[0], max(start, region[1]), min(end, region[2]))
                raise VerifyError(f"output '{task}': {_name(nodes[x])} overwrites {where} held by {_name(holder)}")


def _sources(nodes: list[MemNode], pos: dict) -> list[MemNode]:
    """Per position, the node that computed the value it holds: reload -> offload -> ... followed back."""
    source: list[MemNode] = []
    for node in nodes:
        copies = node.op in ("reload", "offload") and node.inputs
        source.append(source[pos[node.inputs[0]]] if copies else node)
    return source


def _check_taskgraph(graph: MemGraph, nodes: list[MemNode], pos: dict, taskgraph) -> None:
    computed: set[str] = set()
    source_task = [node.task for node in _sources(nodes, pos)]
    for i, node in enumerate(nodes):
        if node.op in ("offload", "reload"):
            if source_task[i] != node.task:
                raise VerifyError(f"{_name(node)} copies a tensor of another task")
            continue
        task = taskgraph.nodes.get(node.task)
        want = None if task is None else ("kernel" if task.op not in ("input", "move") else task.op)
        if task is None or want != node.op or (node.op == "kernel" and node.kernel != task.op):
            raise VerifyError(f"{_name(node)} does not match a taskgraph node")
        computed.add(node.task)
        if len(node.inputs) != len(task.inputs):
            raise VerifyError(f"{_name(node)} has {len(node.inputs)} operands, task '{task.id}' has {len(task.inputs)}")
        got = tuple([source_task[pos[dep]] for dep in node.inputs])
        if got != tuple(task.inputs):  # name the first operand that differs
            k = next(k for k, want_task in enumerate(task.inputs) if got[k] != want_task)
            raise VerifyError(f"{_name(node)}: operand {k} comes from '{got[k]}', not '{task.inputs[k]}'")
    for task_id in taskgraph.nodes:
        if task_id not in computed:
            raise VerifyError(f"task '{task_id}' has no node in the memgraph")
    for task_id in taskgraph.effective_outputs():
        if task_id not in graph.outputs:
            raise VerifyError(f"output '{task_id}' has no holder in the memgraph")

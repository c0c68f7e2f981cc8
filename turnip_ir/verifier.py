"""The memgraph verifier: proves the seed's conditions on any memgraph, planned or hand-written.

Checks, each failing with a `VerifyError` that names the nodes and the location:
- structure: references exist, the graph is acyclic (c), devices and regions lie within bounds, regions
  hold their tensors, kernels and offloads read GPU copies on their own GPU, reloads read storage;
- (a) with a taskgraph: every operand of every kernel and move traces back, through reload -> offload
  chains, to the producer of the right task, and every output is held;
- (b) no race: a sweep in topological order keeps the last writer of every byte per space; a node that
  overwrites bytes must come after their last writer and after every reader of it, through `inputs`
  and `mem_deps` (never `redundant_deps`). Happens-before is a bitset of ancestors per node, freed after
  its last successor;
- inputs are written before the run starts: they come first in the sweep and two of them may not overlap;
- outputs survive: at the end of the sweep an output's holder is still the last writer of its region.
"""

from __future__ import annotations

from collections import deque

from turnip_ir.errors import VerifyError
from turnip_ir.kernels import nbytes
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.sweep import STORAGE, RegionMap, successor_counts, written_region


def verify_memgraph(graph: MemGraph, taskgraph=None) -> None:
    """Raise `VerifyError` unless `graph` is a correct memgraph (and implements `taskgraph`, when given)."""
    nodes = _topological(graph)
    pos = {node.id: i for i, node in enumerate(nodes)}
    for node in nodes:
        _check_node(graph, node, pos, nodes)
    _check_races(graph, nodes, pos)
    if taskgraph is not None:
        _check_taskgraph(graph, nodes, pos, taskgraph)


def _name(node: MemNode) -> str:
    return node.label()


def _where(space: int, start: int, end: int) -> str:
    return f"[{start}, {end}) in CPU storage" if space == STORAGE else f"[{start}, {end}) on GPU {space}"


def _topological(graph: MemGraph) -> list[MemNode]:
    """The nodes in a topological order of inputs + mem_deps, or a `VerifyError` naming a node on a cycle."""
    by_id = {}
    for node in graph.nodes:
        if node.id in by_id:
            raise VerifyError(f"node {node.id}: duplicate id")
        by_id[node.id] = node
    waiting, users = {}, {node.id: [] for node in graph.nodes}
    for node in graph.nodes:
        deps = set(node.deps())
        for dep in deps | set(node.redundant_deps):
            if dep not in by_id:
                raise VerifyError(f"{_name(node)} depends on node {dep}, which does not exist")
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


def _check_node(graph: MemGraph, node: MemNode, pos: dict, nodes: list[MemNode]) -> None:
    if node.device is not None and not 0 <= node.device < graph.devices:
        raise VerifyError(f"{_name(node)}: device {node.device} is not in [0, {graph.devices})")
    need = nbytes(node.shape, node.dtype) if node.shape is not None and node.dtype else 0
    if node.loc is not None:
        start, size = node.loc
        if start < 0 or start + size > graph.budget:
            raise VerifyError(f"{_name(node)}: location [{start}, {start + size}) is outside the budget [0, {graph.budget})")
        if size < need:
            raise VerifyError(f"{_name(node)}: location size {size} cannot hold {need} bytes")
    if node.storage is not None and node.storage[1] < need:
        raise VerifyError(f"{_name(node)}: storage size {node.storage[1]} cannot hold {need} bytes")
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


def _check_races(graph: MemGraph, nodes: list[MemNode], pos: dict) -> None:
    preds = [sorted({pos[d] for d in node.deps()}) for node in nodes]
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for d in dict.fromkeys(node.inputs):
            readers[pos[d]].append(i)
    left = successor_counts(preds)
    ancestors: list[int | None] = [None] * len(nodes)
    spaces: dict[int, RegionMap] = {}
    for w, node in enumerate(nodes):
        anc = 0
        for p in preds[w]:
            anc |= ancestors[p] | (1 << p)
            left[p] -= 1
            if left[p] == 0:
                ancestors[p] = None
        ancestors[w] = anc if left[w] else None
        region = written_region(node)
        if region is None:
            continue
        regions = spaces.setdefault(region[0], RegionMap())
        for start, end, x in regions.overlapping(region[1], region[2]):
            where = _where(region[0], max(start, region[1]), min(end, region[2]))
            if _preloaded(nodes[x]) and _preloaded(node):
                raise VerifyError(f"race: {_name(node)} and {_name(nodes[x])} both start in {where}")
            if not _preloaded(nodes[x]) and not (anc >> x) & 1:
                raise VerifyError(f"race: {_name(node)} overwrites {where} while {_name(nodes[x])} may still write it")
            for r in readers[x]:
                if not (anc >> r) & 1:
                    reader, old = _name(nodes[r]), f"node {nodes[x].id} ('{nodes[x].task}')"
                    raise VerifyError(f"race: {_name(node)} overwrites {where} before {reader} has read {old}")
        regions.write(region[1], region[2], w)
    _check_outputs(graph, nodes, pos, spaces)


def _preloaded(node: MemNode) -> bool:
    """An input without dependencies is written before the run starts."""
    return node.op == "input" and not node.mem_deps


def _check_outputs(graph: MemGraph, nodes: list[MemNode], pos: dict, spaces: dict[int, RegionMap]) -> None:
    for task, holder_id in graph.outputs.items():
        if holder_id not in pos:
            raise VerifyError(f"output '{task}': node {holder_id} does not exist")
        holder = nodes[pos[holder_id]]
        region = written_region(holder)
        if holder.task != task or region is None:
            raise VerifyError(f"output '{task}': {_name(holder)} does not hold it")
        for start, end, x in spaces.get(region[0], RegionMap()).overlapping(region[1], region[2]):
            if x != pos[holder_id]:
                where = _where(region[0], max(start, region[1]), min(end, region[2]))
                raise VerifyError(f"output '{task}': {_name(nodes[x])} overwrites {where} held by {_name(holder)}")


def _source(node: MemNode, nodes: list[MemNode], pos: dict) -> MemNode:
    """Follow reload -> offload -> ... back to the node that computed the value."""
    while node.op in ("reload", "offload"):
        node = nodes[pos[node.inputs[0]]]
    return node


def _check_taskgraph(graph: MemGraph, nodes: list[MemNode], pos: dict, taskgraph) -> None:
    computed: set[str] = set()
    for node in nodes:
        if node.op in ("offload", "reload"):
            if _source(node, nodes, pos).task != node.task:
                raise VerifyError(f"{_name(node)} copies a tensor of another task")
            continue
        task = taskgraph.nodes.get(node.task)
        want = None if task is None else ("kernel" if task.op not in ("input", "move") else task.op)
        if task is None or want != node.op or (node.op == "kernel" and node.kernel != task.op):
            raise VerifyError(f"{_name(node)} does not match a taskgraph node")
        computed.add(node.task)
        if len(node.inputs) != len(task.inputs):
            raise VerifyError(f"{_name(node)} has {len(node.inputs)} operands, task '{task.id}' has {len(task.inputs)}")
        for k, (dep, want_task) in enumerate(zip(node.inputs, task.inputs)):
            got = _source(nodes[pos[dep]], nodes, pos)
            if got.task != want_task:
                raise VerifyError(f"{_name(node)}: operand {k} comes from '{got.task}', not '{want_task}'")
    for task_id in taskgraph.nodes:
        if task_id not in computed:
            raise VerifyError(f"task '{task_id}' has no node in the memgraph")
    for task_id in taskgraph.effective_outputs():
        if task_id not in graph.outputs:
            raise VerifyError(f"output '{task_id}' has no holder in the memgraph")

"""Blocked causal attention: per query block and head group, a chain of `attention` tasks up to the diagonal.

q is [T, H*D] cut into token blocks and G head groups of H/G heads; k and v are [T, KV*D] cut into the
same token blocks and G groups of KV/G kv heads, so group g of q reads group g of k and v (HF's
repeat_kv: query head h reads kv head h // (H/KV)). For query block i and group g the chain is
    attention(q_i, k_0, v_0, final=False) -> attention(q_i, k_1, v_1, prev, final=False) -> ...
    -> attention(q_i, k_i, v_i, prev, causal=True)
Each link carries a packed float32 partial (normalised output and log-sum-exp per head), so the T x T
score matrix is never built and every task has one result. Blocks above the diagonal are never read.
With a sliding `window` (each query sees itself and the window - 1 keys before it), query block i chains
only over the key blocks some of its queries see: the blocks wholly behind the window are never read or
computed, and a link whose block the window covers only in part carries `window` and `offset` (the key
block's first position minus the query block's) so the kernel masks exactly the keys it hides.
A chain is one placement decision (coordinates t=i, h=g); its links run on that GPU and the k/v blocks
they read are moved there.

Packed sequences (`sequences`: their lengths, end to end along the tokens): no query sees a key of another
sequence. The token blocks must each hold whole sequences or a piece of one (partition.split_packed cuts
them so). Query block i then reads key block j < i only when one sequence spans both, so every row of
both is that sequence's and the link is a plain full one; a block of several whole sequences is its own
chain of one causal link, whose `segments` attribute (the rows where each sequence after the first
starts) masks each sequence from the others. One sequence, or none given, is the plain chain above.

Order: with the program's `group` at 1 a chain runs to its end before the next one starts, as written.
With `group` at M, link (i, j) is keyed after its query group by (j, i): the chains of M query blocks are
interleaved key block by key block (link j of each of them, then link j + 1), so each k/v block is read
by M links while it is on the GPU: under a budget that cannot hold a layer's k and v, a planner that
reloads them reloads each about M times less often.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from functools import partial
from itertools import product
from typing import TYPE_CHECKING

from frontend.placement import Placement, Site
from turnip_ir.errors import InputError
from turnip_ir.kernels import KERNELS, nbytes

if TYPE_CHECKING:
    from frontend.program import Blocked, Program


def lower(prog: Program, q: Blocked, k: Blocked, v: Blocked, name: str, heads: int, kv_heads: int,
          place: Placement, window: int | None = None, packed: bool = False,
          sequences: Sequence[int] | None = None) -> Blocked:
    """The attention output [T, H*D], cut like q; one chain per (query block, head group). With `packed`,
    the chains' last links keep the packed partial: [T, H*D + H] float32, each group's block its output
    then its heads' log-sum-exps (`unpack` makes the output; a backward pass reads both)."""
    groups = _check(q, k, v, name, heads, kv_heads)
    attrs = {"heads": heads // groups, "kv_heads": kv_heads // groups}
    if packed:
        widths = tuple(width + heads // groups for width in q.splits[1])
        result = prog._new(name, (q.shape[0], q.shape[1] + heads), "float32", (q.splits[0], widths))
    else:
        result = prog._new(name, q.shape, q.dtype, q.splits)
    starts = _starts(q.splits[0])
    firsts, segments = _packing(starts, sequences, name)
    index = 0
    for i in range(len(q.splits[0])):
        links = _links(starts, i, window, firsts[i], segments[i])
        for g in range(groups):
            prog.at({"t": i, "h": g})
            gpu = prog._place(place, lambda: _site(q, k, v, name, i, g, index, attrs, links), name)
            query = prog._read(q, (i, g), gpu)
            prev = None
            for j, masked in links:
                if prog.group > 1:  # a query group's chains run key block by key block
                    prog.at({"t": i, "h": g}, then=(j, i))
                diagonal = j == i
                operands = [query, prog._read(k, (j, g), gpu), prog._read(v, (j, g), gpu)]
                operands += [prev] if prev is not None else []
                link = {"causal": True} if diagonal else {"final": False}
                link |= masked | ({"final": False} if packed else {})
                task_id = result.block_id((i, g)) if diagonal else f"{result.block_id((i, g))}.k{j}"
                prev = prog.graph.kernel("attention", *operands, device=gpu, id=task_id, **attrs, **link)
            result.blocks[(i, g)] = prev
            index += 1
    return result


def _starts(sizes: tuple[int, ...]) -> list[int]:
    """The first token of each block, and the end of the last."""
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    return starts


def _links(starts: list[int], i: int, window: int | None, first: int = 0, segments: str = "") -> list[tuple[int, dict]]:
    """The key blocks query block i reads, in order, each with the attributes it needs beside `causal`
    (the window's, and on the diagonal the `segments` of packed sequences).

    Query block i holds positions [starts[i], starts[i+1]) and reads key blocks first..i (`first`: the
    first block of its sequence); key block j is read when its last key is seen by the first query
    (last > first - window), and masked when its first key is hidden from the last query (first <= last
    - window)."""
    links = []
    for j in range(first, i + 1):
        if window is not None and starts[j + 1] - 1 <= starts[i] - window:
            continue
        masked = window is not None and starts[j] <= starts[i + 1] - 1 - window
        extra = {"window": window, "offset": starts[j] - starts[i]} if masked else {}
        links.append((j, extra | ({"segments": segments} if j == i and segments else {})))
    return links


def _packing(starts: list[int], sequences: Sequence[int] | None, name: str) -> tuple[list[int], list[str]]:
    """Per token block, the first key block its chain reads and its `segments` ("" for one sequence).

    Block i's chain starts at the first block that holds the sequence of its first row; it must hold
    either whole sequences (then it reads itself alone) or rows of one sequence only."""
    blocks = len(starts) - 1
    if sequences is None:
        return [0] * blocks, [""] * blocks
    bounds = _starts(tuple(sequences))
    if bounds[-1] != starts[-1]:
        raise InputError(f"attention '{name}': sequences add up to {bounds[-1]} tokens, q has {starts[-1]}")
    owner = lambda row: bisect_right(bounds, row) - 1  # noqa: E731  (the sequence of a token)
    firsts, segments = [], []
    for i in range(blocks):
        begin, end = starts[i], starts[i + 1]
        inside = [b - begin for b in bounds if begin < b < end]
        if inside and (begin not in bounds or end not in bounds):
            raise InputError(f"attention '{name}': token block {i} [{begin}, {end}) holds a piece of a sequence beside "
                             "others; cut the blocks so that each holds whole sequences or one piece of one")
        firsts.append(i if inside else next(j for j in range(i + 1) if owner(starts[j + 1] - 1) == owner(begin)))
        segments.append(",".join(map(str, inside)))
    return firsts, segments


def _check(q: Blocked, k: Blocked, v: Blocked, name: str, heads: int, kv_heads: int) -> int:
    """The number of head groups, after checking that q, k and v are cut compatibly."""
    if len(q.shape) != 2 or q.shape[1] % heads:
        raise InputError(f"attention '{name}': q {list(q.shape)} is not [tokens, {heads} heads x head dim]")
    head_dim = q.shape[1] // heads
    groups = len(q.splits[1])
    if heads % kv_heads or heads % groups or kv_heads % groups:
        raise InputError(f"attention '{name}': {groups} head groups do not divide {heads} heads and {kv_heads} kv heads")
    for x, count in ((q, heads), (k, kv_heads), (v, kv_heads)):
        want = ((count // groups) * head_dim,) * groups
        if x.shape[1] != count * head_dim or x.splits[1] != want:
            raise InputError(f"attention '{name}': '{x.name}' features are cut {list(x.splits[1])}, want {list(want)}")
        if x.splits[0] != q.splits[0]:
            raise InputError(f"attention '{name}': '{x.name}' token blocks {list(x.splits[0])} differ from q's {list(q.splits[0])}")
    return groups


def _site(q: Blocked, k: Blocked, v: Blocked, name: str, i: int, g: int, index: int, attrs: dict,
          links: list[tuple[int, dict]]) -> Site:
    """The whole chain as one task: the FLOPs of all its links, and q, k and v blocks as operands."""
    spec = KERNELS["attention"]
    flops = 0
    where = [(q.device((i, g)), nbytes(q.block_shape((i, g)), q.dtype))]
    for j, masked in links:
        shapes = [q.block_shape((i, g)), k.block_shape((j, g)), v.block_shape((j, g))]
        link = dict(attrs, causal=j == i, **masked)
        out, _ = spec.infer(shapes, [q.dtype] * 3, link)
        flops += spec.flops(shapes, out, link)
        where += [(x.device((j, g)), nbytes(x.block_shape((j, g)), x.dtype)) for x in (k, v)]
    return Site(name, {"t": i, "h": g}, index, flops, tuple(where))


# ----- training: the output from the packed partial, and the backward pass (docs/training.md) --------------


def unpack(prog: Program, packed: Blocked, name: str, heads: int, dtype: str) -> Blocked:
    """The attention output [T, H*D] in `dtype`, one `attention_unpack` task per block of `packed`."""
    per = heads // len(packed.splits[1])
    widths = tuple(width - per for width in packed.splits[1])
    result = prog._new(name, (packed.shape[0], packed.shape[1] - heads), dtype, (packed.splits[0], widths))
    for (i, g), block in packed.blocks.items():
        prog.at({"t": i, "h": g})
        result.blocks[(i, g)] = prog.graph.kernel("attention_unpack", block, device=block.device,
                                                  id=result.block_id((i, g)), heads=per, dtype=dtype)
    return result


def lower_grad(prog: Program, step, d_out: Blocked, names: dict[int, str]) -> dict[int, Blocked]:
    """The gradients of attention step `step` (a `Step` of a training program) for the operands named in
    `names` (0: q, 1: k, 2: v -> the gradient's name), from `d_out`, cut like the output. Flash attention's
    backward, block by block from the saved log-sum-exp: per (query block, group) a chain of
    `attention_grad` wrt q over the key blocks the forward read; per (key block, group) a chain wrt kv over
    the query blocks that read it, from the diagonal down, whose last link's dK over dV rows are cut apart
    by `rows`. The score matrix is never built; the links carry the forward's causal and window masks.
    The links are written key block by key block, each pair's dQ link and then its dK/dV link, so a plan
    reads the same operand nodes for both (the cuda backend may share their fused backward:
    attention_grad.GradShare): every dQ chain advances one link a key block (their float32 partials live
    together) while each dK/dV chain runs to its end in its key block's turn. 7b's 16k LoRA step was
    1.105x the hand trainer with chain after chain and 1.037-1.044x with this order, on two H100 hosts
    (docs/training.md)."""
    q, k, v = step.operands
    packed, heads, kv_heads = step.attrs["packed"], step.attrs["heads"], step.attrs["kv_heads"]
    if packed is None:
        raise InputError(f"attention '{step.result.name}': its program was not built with training=True, so it kept no log-sum-exp")
    if any("segments" in prog.graph.nodes[block.id].attrs for block in packed.blocks.values()):
        raise InputError(f"attention '{step.result.name}': blocks of several sequences (segments) have no backward yet; "
                         "give each sequence its own token blocks")
    groups = len(q.splits[1])
    attrs = {"heads": heads // groups, "kv_heads": kv_heads // groups}
    starts = _starts(q.splits[0])
    firsts, _ = _packing(starts, step.attrs["sequences"], step.result.name)
    links = [_links(starts, i, step.attrs["window"], firsts[i]) for i in range(len(starts) - 1)]

    def operands(i: int, j: int, g: int, gpu: int) -> list:
        blocks = ((q, (i, g)), (k, (j, g)), (v, (j, g)), (packed, (i, g)), (d_out, (i, g)))
        return [prog._read(x, key, gpu) for x, key in blocks]

    grads = {}
    readers: dict[int, list] = {}
    for i, seen in enumerate(links):
        for j, masked in seen:
            readers.setdefault(j, []).append((i, j, masked))
    wants_q, wants_kv = 0 in names, 1 in names or 2 in names
    if wants_q:
        grads[0] = prog._new(names[0], q.shape, q.dtype, q.splits)
    kv = {n: prog._new(names[n], x.shape, x.dtype, x.splits) for n, x in ((1, k), (2, v)) if n in names}
    for g in range(groups):
        q_sites = {i: _grad_site(prog, step, i, g, (q, packed, d_out)) for i in range(len(links))} if wants_q else {}
        q_chains = {i: _Chain("q", len(links[i]), grads[0].block_id((i, g))) for i in q_sites}
        for j in sorted(readers):  # key block by key block: a pair's two links one after the other (docstring)
            kv_site = _grad_site(prog, step, j, g, (k, v)) if wants_kv else None
            prog.at({"t": j, "h": g})  # the column's links run in key block j's turn (as _grad_site keys kv's)
            kv_chain = _Chain("kv", len(readers[j]), f"{step.result.name}.dkv[{j},{g}]")
            for i, _, masked in readers[j]:
                if wants_q:
                    q_chains[i].link(prog, i, j, masked, partial(operands, g=g, gpu=q_sites[i]), q_sites[i], attrs)
                if wants_kv:
                    kv_chain.link(prog, i, j, masked, partial(operands, g=g, gpu=kv_site), kv_site, attrs)
            if wants_kv:
                rows = k.block_shape((j, g))[0]
                for n, x in kv.items():
                    span = {"start": 0, "stop": rows} if n == 1 else {"start": rows, "stop": 2 * rows}
                    x.blocks[(j, g)] = prog.graph.kernel("rows", kv_chain.prev, device=kv_site, id=x.block_id((j, g)), **span)
        for i, chain in q_chains.items():
            grads[0].blocks[(i, g)] = chain.prev
    return grads | kv


class _Chain:
    """One chain of `attention_grad` links (wrt `wrt`: q over the key blocks, or kv over the query blocks), built
    a link at a time: `length` links, the last one final and named `task_id`."""

    def __init__(self, wrt: str, length: int, task_id: str):
        self.wrt, self.length, self.task_id = wrt, length, task_id
        self.prev, self.count = None, 0

    def link(self, prog: Program, i: int, j: int, masked: dict, operands, gpu: int, attrs: dict) -> None:
        """The next link, for query block i and key block j; `operands(i, j)` reads its five operands on `gpu`."""
        self.count += 1
        last = self.count == self.length
        link = attrs | masked | {"wrt": self.wrt} | ({"causal": True} if i == j else {}) | ({} if last else {"final": False})
        args = operands(i, j) + ([self.prev] if self.prev is not None else [])
        link_id = self.task_id if last else f"{self.task_id}.{self.wrt}{j if self.wrt == 'q' else i}"
        self.prev = prog.graph.kernel("attention_grad", *args, device=gpu, id=link_id, **link)


def _grad_site(prog: Program, step, t: int, g: int, reads: tuple[Blocked, ...]) -> int:
    """The GPU of a backward chain: the forward's placement asked for token block t and group g."""
    prog.at({"t": t, "h": g})

    def site() -> Site:
        where = tuple((x.device((t, g)), nbytes(x.block_shape((t, g)), x.dtype)) for x in reads)
        return Site(step.result.name, {"t": t, "h": g}, t, 0, where)

    return prog._place(step.place, site, step.result.name)

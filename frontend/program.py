"""`Program`: whole-tensor ops, cut into blocks and lowered to a taskgraph as they are written.

State: the `TaskGraph` being built, the whole tensors (`Blocked`: a split per dimension and the
taskgraph tensor of each block), a cache of moves `(block, GPU) -> copy`, and a default placement.
Lowering rules, applied by each op at once (there is no second pass):
- an op's index letters each get one split; an operand's split along a letter must equal the op's
  (there is no repartitioning, so a mismatch is an `InputError` naming the operand and the letter);
- one kernel task per block of the op's grid (output letters times contracted letters);
- an operand block on another GPU is moved there once per GPU and the copy is reused;
- where a contracted letter is split, the partial products are summed by a balanced tree of `add`
  tasks, each on the GPU of its left operand; the root carries the output block's id;
- an input block is created on the GPU of its first reader unless the input was given a placement;
- with one GPU every task is on GPU 0 and an op's placement is not asked (its site would cost a shape
  inference and a FLOP count per task).
Ids: a whole tensor of one block keeps its name; block (i, j) of `x` is `x[i,j]`; partial products
are `x[i,j].pK` (cast to an einsum's `acc` dtype: `x[i,j].cK`), inner sums `x[i,j].sK`, moves `<block>.to<gpu>`.
The tape: every whole-tensor op is also recorded as a `Step` (its kind, result, operands, attributes,
phase and placement) in `Program.tape`, in the order written; frontend/autodiff.py reads it backwards to
append a backward pass. A `Program(training=True)` also keeps what that pass needs: its attention ends
each chain with the packed partial (output and log-sum-exp) and unpacks the output from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product

import numpy as np

from frontend import attention, loss
from frontend.lazy import LazyTensor
from frontend.order import ordered
from frontend.partition import Split, SplitSpec, as_split, block_slice
from frontend.placement import Placement, Site, follow, round_robin
from turnip_ir.errors import InputError
from turnip_ir.kernels import KERNELS, Shape, nbytes, numpy_dtype, parse_equation
from turnip_ir.taskgraph import TaskGraph, Tensor

Coords = tuple[int, ...]
KINDS = ("input", "einsum", "map", "attention", "cross_entropy", "output")
"""What a tape step may record."""
ROW_KERNELS = ("rmsnorm", "softmax")
"""Kernels that reduce over the last axis: `map` needs that axis in one block."""


@dataclass(frozen=True)
class Pending:
    """An input block not created yet: it appears on the GPU of its first reader."""

    id: str
    shape: Shape
    dtype: str


@dataclass
class Blocked:
    """A whole tensor: its shape, a split per dimension, and each block's taskgraph tensor."""

    name: str
    shape: Shape
    dtype: str
    splits: tuple[Split, ...]
    blocks: dict[Coords, Tensor | Pending] = field(default_factory=dict)

    @property
    def grid(self) -> Coords:
        return tuple(len(split) for split in self.splits)

    def block_shape(self, coords: Coords) -> Shape:
        return tuple(split[c] for split, c in zip(self.splits, coords))

    def slices(self, coords: Coords) -> tuple[slice, ...]:
        return tuple(block_slice(split, c) for split, c in zip(self.splits, coords))

    def block_id(self, coords: Coords) -> str:
        return block_id(self.name, self.grid, coords)

    def device(self, coords: Coords) -> int | None:
        block = self.blocks[coords]
        return block.device if isinstance(block, Tensor) else None


@dataclass(frozen=True)
class Step:
    """One whole-tensor op as written: `attrs` holds what its backward rule needs (frontend/autodiff.py):
    einsum `equation`; map `kernel`, `ins`, `out` (each operand's letters, the result's) and the kernel's
    `attrs`; attention `heads`, `kv_heads`, `window`, `sequences` and the `packed` partials (training only);
    cross_entropy its `stats` and `total` (frontend/loss.py)."""

    kind: str
    result: Blocked
    operands: tuple[Blocked, ...]
    attrs: dict
    phase: int
    place: Placement | None


def block_id(name: str, grid: Coords, coords: Coords) -> str:
    """`name` for a tensor of one block, else `name[i,j]`."""
    if all(n == 1 for n in grid):
        return name
    return f"{name}[{','.join(map(str, coords))}]"


class Program:
    """Whole-tensor ops over `gpus` GPUs, lowered block by block into `self.graph`."""

    def __init__(self, gpus: int = 1, placement: Placement | None = None, order_by: Sequence[str] = (),
                 training: bool = False):
        self.graph = TaskGraph(gpus)
        self.training = training
        """Keep what a backward pass needs (attention's log-sum-exp); see the module docstring."""
        self.tape: list[Step] = []
        self.placement = placement or round_robin(gpus)
        self.phase = 0
        """The builder's coarse step (a layer, or half of one): tasks run in (phase, block along `order_by`) order."""
        self.order_by = tuple(order_by)
        self.group = 1
        """Blocks along the first `order_by` letter that share one key: with 4, the tasks of blocks 0-3 run
        before those of block 4, in the order they were written (the llama frontend's query groups)."""
        self._marks: list[tuple[int, tuple]] = []
        self.inputs: dict[str, Blocked] = {}
        self.outputs: dict[str, Blocked] = {}
        self._moves: dict[tuple[str, int], Tensor] = {}
        self._names: set[str] = set()

    # ----- whole-tensor ops -------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str, splits: Sequence[SplitSpec | None] = (),
              place: Placement | None = None, index: str | None = None) -> Blocked:
        """An input cut by `splits` (one spec per dimension, missing = one block).

        With `place`, block coordinates are named by `index` (default 'abc...') and each block is placed
        now; without, each block appears on the GPU of its first reader."""
        shape = tuple(shape)
        specs = list(splits) + [None] * (len(shape) - len(splits))
        cut = tuple(as_split(size, spec, f"input '{name}'") for size, spec in zip(shape, specs))
        x = self._new(name, shape, dtype, cut)
        letters = index or "abcdefgh"[: len(shape)]
        for i, coords in enumerate(product(*(range(n) for n in x.grid))):
            block = Pending(x.block_id(coords), x.block_shape(coords), dtype)
            if place is not None:
                self.at({})
                site = Site(name, dict(zip(letters, coords)), i, 0, ())
                block = self.graph.input(block.shape, dtype, device=self._gpu(place(site), name), id=block.id)
            x.blocks[coords] = block
        self.inputs[name] = x
        self.record("input", x, (), place=place)
        return x

    def einsum(self, equation: str, *operands: Blocked, name: str, splits: Mapping[str, SplitSpec] | None = None,
               place: Placement | None = None, acc: str | None = None) -> Blocked:
        """An einsum cut along its letters; a split contracted letter adds a sum tree per output block.

        Letters not in `splits` keep their operands' cut. 'ik,kj->ij' lowers to the `matmul` kernel. With
        `acc` (a dtype other than the operands'), each partial product is cast to it and summed in it."""
        ins, out = parse_equation(equation, len(operands))
        cut = self._letter_splits(name, ins, operands, splits or {})
        contracted = [letter for letter in dict.fromkeys("".join(ins)) if letter not in out]
        kernel, attrs = ("matmul", {}) if _is_matmul(ins, out) else ("einsum", {"equation": equation})
        cast = acc is not None and acc != operands[0].dtype
        dtype = acc if cast else operands[0].dtype
        result = self._new(name, tuple(sum(cut[l]) for l in out), dtype, tuple(cut[l] for l in out))
        self.record("einsum", result, operands, place=place, equation=equation)
        place = place or self.placement
        index = 0
        for out_coords in product(*(range(len(cut[l])) for l in out)):
            root_id = result.block_id(out_coords)
            inner = list(product(*(range(len(cut[l])) for l in contracted)))
            parts = []
            for k, inner_coords in enumerate(inner):
                coords = dict(zip(out, out_coords)) | dict(zip(contracted, inner_coords))
                self.at(coords)
                keys = [tuple(coords[l] for l in letters) for letters in ins]
                gpu = self._decide(place, name, coords, index, kernel, operands, keys, attrs)
                args = [self._read(x, key, gpu) for x, key in zip(operands, keys)]
                task_id = root_id if len(inner) == 1 and not cast else f"{root_id}.p{k}"
                part = self.graph.kernel(kernel, *args, device=gpu, id=task_id, **attrs)
                if cast:
                    cast_id = root_id if len(inner) == 1 else f"{root_id}.c{k}"
                    part = self.graph.kernel("cast", part, device=gpu, id=cast_id, dtype=dtype)
                parts.append(part)
                index += 1
            result.blocks[out_coords] = self._sum(parts, root_id)
        return result

    def map(self, kernel: str, *operands: Blocked, name: str, signature: str | None = None,
            place: Placement | None = None, **attrs) -> Blocked:
        """A blockwise kernel: one task per block of the output letters, no reduction.

        `signature` names each operand's dimensions ('tn,td,td->tn'); without it the operands align on
        their trailing dimensions with the first one's (numpy broadcasting of a weight vector). An output
        letter no operand has (a packed partial's 'p' in 'tn,tk->tp') is one block, as long as the kernel makes it."""
        ins, out = parse_equation(signature, len(operands)) if signature else _trailing(operands)
        cut = self._letter_splits(name, ins, operands, {})
        for letter, split in cut.items():
            if letter not in out and len(split) > 1:
                raise InputError(f"op '{name}': '{letter}' is split but {kernel} does not reduce over it")
        if kernel in ROW_KERNELS and len(operands[0].splits[-1]) > 1:
            raise InputError(f"op '{name}': {kernel} reduces over the last axis, which is cut in {len(operands[0].splits[-1])} blocks")
        place = place or follow
        grid = tuple(len(cut[l]) if l in cut else 1 for l in out)
        blocks: dict[Coords, Tensor] = {}
        for index, out_coords in enumerate(product(*(range(n) for n in grid))):
            coords = dict(zip(out, out_coords))
            self.at(coords)
            keys = [tuple(coords.get(l, 0) for l in letters) for letters in ins]
            gpu = self._decide(place, name, coords, index, kernel, operands, keys, attrs)
            args = [self._read(x, key, gpu) for x, key in zip(operands, keys)]
            task_id = block_id(name, grid, out_coords)
            blocks[out_coords] = self.graph.kernel(kernel, *args, device=gpu, id=task_id, **attrs)
        dtype = next(iter(blocks.values())).dtype
        cut |= _made(name, kernel, out, cut, blocks)
        result = self._new(name, tuple(sum(cut[l]) for l in out), dtype, tuple(cut[l] for l in out))
        result.blocks.update(blocks)
        self.record("map", result, operands, place=place, kernel=kernel, ins=ins, out=out, attrs=attrs)
        return result

    def attention(self, q: Blocked, k: Blocked, v: Blocked, *, name: str, heads: int, kv_heads: int,
                  place: Placement | None = None, window: int | None = None,
                  sequences: Sequence[int] | None = None) -> Blocked:
        """Causal attention over token blocks, as chains of `attention` tasks below the diagonal; with
        `window`, each query sees only itself and the window - 1 keys before it; with `sequences` (lengths
        packed end to end: a block holds whole sequences, `segments`, or a piece of one), only keys of its own
        sequence. A training program ends each chain with the packed partial `<name>.packed` and unpacks the
        output from it."""
        place = place or follow
        sequences = None if sequences is None else tuple(sequences)
        if not self.training:
            result = attention.lower(self, q, k, v, name, heads, kv_heads, place, window, sequences=sequences)
            self.record("attention", result, (q, k, v), place=place, heads=heads, kv_heads=kv_heads, window=window,
                        sequences=sequences, packed=None)
            return result
        packed = attention.lower(self, q, k, v, name + ".packed", heads, kv_heads, place, window, packed=True, sequences=sequences)
        result = attention.unpack(self, packed, name, heads, q.dtype)
        self.record("attention", result, (q, k, v), place=place, heads=heads, kv_heads=kv_heads, window=window,
                    sequences=sequences, packed=packed)
        return result

    def cross_entropy(self, logits: Blocked, labels: Blocked, *, name: str) -> Blocked:
        """The blocked cross-entropy of `logits` [N, V] against float32 `labels` [N] (-100: ignored), as
        `total` [2] = (summed loss, token count): frontend/loss.py; `loss.mean_loss` gives the mean."""
        return loss.cross_entropy(self, logits, labels, name)

    def output(self, *xs: Blocked) -> None:
        """Mark whole tensors as outputs: every block survives to the end of the run."""
        for x in xs:
            self.graph.output(*(self._tensor(x, coords).id for coords in x.blocks))
            self.outputs[x.name] = x
            self.record("output", x, (x,))

    def record(self, kind: str, result: Blocked, operands: Sequence[Blocked], place: Placement | None = None, **attrs) -> None:
        """Append a step to the tape (an op's lowering calls this; see `Step`)."""
        assert kind in KINDS, kind
        self.tape.append(Step(kind, result, tuple(operands), attrs, self.phase, place))

    def at(self, coords: Mapping[str, int], then: tuple[int, ...] = ()) -> None:
        """Key the tasks created from now on by the current phase and `coords` along `order_by` (the first
        letter's coordinate divided by `group`), then by `then`: tasks of equal keys keep the order they
        were written in, and `then` orders tasks written apart (attention's links, by key block)."""
        along = [coords.get(letter, 0) for letter in self.order_by]
        if along and self.group > 1:
            along[0] //= self.group
        self._marks.append((len(self.graph.nodes), (self.phase, tuple(along) + then)))

    def taskgraph(self) -> TaskGraph:
        """The built taskgraph, its nodes in key order where their operands allow (see `at`)."""
        if self.order_by and self._marks:
            self.graph.nodes = ordered(self.graph, self._marks)
            self._marks = []  # the positions they name are gone
        return self.graph

    # ----- data ---------------------------------------------------------------------------------------
    def feed(self, values: Mapping[str, np.ndarray], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """The run's input arrays by taskgraph id, cut from whole arrays by input name (those of `names`
        alone when given). A `LazyTensor` (frontend/lazy.py: a checkpoint's tensor, random weights) is cut
        into lazy blocks, read or drawn only when the backend writes them into its buffers."""
        arrays = {}
        inputs = self.inputs.items() if names is None else ((name, self.inputs[name]) for name in names)
        for name, x in inputs:
            created = [c for c, block in x.blocks.items() if isinstance(block, Tensor)]
            if not created:
                continue  # an input nobody read
            if name not in values:
                raise InputError(f"no value given for input '{name}'")
            whole = values[name]
            if tuple(whole.shape) != x.shape:
                raise InputError(f"input '{name}': shape {list(whole.shape)} is not the graph's {list(x.shape)}")
            for coords in created:
                arrays[x.block_id(coords)] = _block(name, whole, x.slices(coords), x.dtype)
        return arrays

    def input_ids(self, names: Iterable[str]) -> set[str]:
        """The taskgraph ids of the named inputs' blocks (those some op reads); an unknown name is an error."""
        ids = set()
        for name in names:
            if name not in self.inputs:
                raise InputError(f"no input named '{name}' (inputs: {', '.join(self.inputs)})")
            x = self.inputs[name]
            ids.update(x.block_id(c) for c, block in x.blocks.items() if isinstance(block, Tensor))
        return ids

    def gather(self, x: Blocked, results: Mapping[str, np.ndarray]) -> np.ndarray:
        """The whole tensor `x`, assembled from a run's outputs (keyed by taskgraph id)."""
        first = results[self._tensor(x, next(iter(x.blocks))).id]
        whole = np.empty(x.shape, dtype=first.dtype)
        for coords in x.blocks:
            whole[x.slices(coords)] = results[self._tensor(x, coords).id]
        return whole

    # ----- lowering helpers (also used by attention.lower) -------------------------------------------
    def _new(self, name: str, shape: Shape, dtype: str, splits: tuple[Split, ...]) -> Blocked:
        if name in self._names:
            raise InputError(f"tensor '{name}' is defined twice")
        self._names.add(name)
        return Blocked(name, shape, dtype, splits)

    def _letter_splits(self, name: str, ins: list[str], operands: Sequence[Blocked],
                       given: Mapping[str, SplitSpec]) -> dict[str, Split]:
        """One split per letter, from `given` or the operands; operands must agree with it."""
        sizes: dict[str, int] = {}
        cut: dict[str, Split] = {}
        for letters, x in zip(ins, operands):
            if len(letters) != len(x.shape):
                raise InputError(f"op '{name}': subscripts '{letters}' do not match operand '{x.name}' of rank {len(x.shape)}")
            for letter, size, split in zip(letters, x.shape, x.splits):
                if sizes.setdefault(letter, size) != size:
                    raise InputError(f"op '{name}': index '{letter}' has sizes {sizes[letter]} and {size}")
                want = as_split(size, given[letter], f"op '{name}' index '{letter}'") if letter in given else cut.get(letter, split)
                if split != want:
                    raise InputError(f"op '{name}': operand '{x.name}' is cut {list(split)} along '{letter}' "
                                     f"but the op cuts it {list(want)} (repartitioning is not supported)")
                cut[letter] = want
        return cut

    def _decide(self, place: Placement, op: str, coords: dict, index: int, kernel: str,
                operands: Sequence[Blocked], keys: list[Coords], attrs: dict) -> int:
        def site() -> Site:
            shapes = [x.block_shape(key) for x, key in zip(operands, keys)]
            spec = KERNELS[kernel]
            out, _ = spec.infer(shapes, [x.dtype for x in operands], attrs)
            where = tuple((x.device(key), nbytes(shape, x.dtype)) for x, key, shape in zip(operands, keys, shapes))
            return Site(op, coords, index, spec.flops(shapes, out, attrs), where)

        return self._place(place, site, op)

    def _place(self, place: Placement, site: Callable[[], Site], op: str) -> int:
        """The GPU `place` chooses for the site `site()` describes; with one GPU, 0 without making the site or
        asking (module docstring)."""
        if self.graph.devices == 1:
            return 0
        return self._gpu(place(site()), op)

    def _gpu(self, gpu: int, op: str) -> int:
        if not isinstance(gpu, int) or not 0 <= gpu < self.graph.devices:
            raise InputError(f"op '{op}': placement chose GPU {gpu!r}, not in [0, {self.graph.devices})")
        return gpu

    def _read(self, x: Blocked, coords: Coords, gpu: int) -> Tensor:
        """Block `coords` of `x` on `gpu`: created there if a pending input, else moved there once."""
        block = x.blocks[coords]
        if isinstance(block, Pending):
            block = self.graph.input(block.shape, block.dtype, device=gpu, id=block.id)
            x.blocks[coords] = block
        return self._on(block, gpu)

    def _on(self, t: Tensor, gpu: int) -> Tensor:
        if t.device == gpu:
            return t
        key = (t.id, gpu)
        if key not in self._moves:
            self._moves[key] = self.graph.move(t, gpu, id=f"{t.id}.to{gpu}")
        return self._moves[key]

    def _tensor(self, x: Blocked, coords: Coords) -> Tensor:
        block = x.blocks[coords]
        if isinstance(block, Pending):
            raise InputError(f"input block '{block.id}' is never read, so it cannot be an output")
        return block

    def _sum(self, parts: list[Tensor], root_id: str) -> Tensor:
        """A balanced tree of adds, each on its left operand's GPU; the root is named `root_id`."""
        count = 0
        while len(parts) > 1:
            paired = []
            for left, right in zip(parts[::2], parts[1::2]):
                last = len(parts) == 2
                add_id = root_id if last else f"{root_id}.s{count}"
                count += 1
                paired.append(self.graph.add(left, self._on(right, left.device), device=left.device, id=add_id))
            parts = paired + parts[len(parts) // 2 * 2:]
        return parts[0]


def _is_matmul(ins: list[str], out: str) -> bool:
    """'ik,kj->ij' with distinct letters: the plain matrix product, which every backend has as `matmul`."""
    if len(ins) != 2 or len(ins[0]) != 2 or len(ins[1]) != 2:
        return False
    (i, k), (k2, j) = ins
    return k == k2 and out == i + j and len({i, j, k}) == 3


def _made(name: str, kernel: str, out: str, cut: Mapping[str, Split], blocks: Mapping[Coords, Tensor]) -> dict[str, Split]:
    """The split of each output letter of a map that no operand has: one block, of the size the kernel made."""
    made = {}
    for position, letter in enumerate(out):
        if letter not in cut:
            sizes = {block.shape[position] for block in blocks.values()}
            assert len(sizes) == 1, f"op '{name}': {kernel} makes output index '{letter}' of sizes {sorted(sizes)}"
            made[letter] = (sizes.pop(),)
    return made


def _trailing(operands: Sequence[Blocked]) -> tuple[list[str], str]:
    """Subscripts that align every operand's trailing dimensions with the first operand's."""
    out = "abcdefgh"[: len(operands[0].shape)]
    ins = [out[len(out) - len(x.shape):] if len(x.shape) <= len(out) else "" for x in operands]
    for letters, x in zip(ins, operands):
        if len(letters) != len(x.shape):
            raise InputError(f"operand '{x.name}' has more dimensions than '{operands[0].name}'")
    return ins, out


def _block(name: str, whole, index: tuple[slice, ...], dtype: str):
    """Block `index` of input `name`'s value: a C-contiguous array in `dtype`, or a lazy block of a lazy
    value, which must already be in `dtype` (a conversion is its reader's job, done as it writes)."""
    if not isinstance(whole, LazyTensor):
        return np.ascontiguousarray(whole[index], dtype=numpy_dtype(dtype))
    if whole.dtype.name != dtype:
        raise InputError(f"input '{name}': a lazy value of dtype {whole.dtype.name} cannot feed a {dtype} input")
    cut = tuple(len(range(*s.indices(n))) for s, n in zip(index, whole.shape))
    return whole if cut == tuple(whole.shape[: len(cut)]) else whole[index]

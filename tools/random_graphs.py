"""Random taskgraphs for property tests and benchmarks: `random_taskgraph(seed, ...)`.

By default a graph is made of square tiles (`s x s` for `s` in `sizes`), which is what the benchmarks
measure. With `mixed=True` it also holds every kind of tensor and op the kernels allow, so that property
tests compile and run them all: rectangles, vectors, rows, columns, batches (rank 3) and zero-size
tensors; binary ops whose operands broadcast (either side); matmul and einsum (transposes, reductions,
contractions, outer products, batched products); rmsnorm with a weight. Operands a step needs and no
earlier tensor has (a matmul's right side, a broadcast partner, a weight) become new inputs.
Values stay bounded: contractions are scaled by one over the contracted size and exp only follows a
squashing op, so float32 runs compare closely with a float64 reference.
"""

from __future__ import annotations

import math
import random

from turnip_ir.taskgraph import TaskGraph, Tensor

UNARY = ("relu", "gelu", "silu", "exp", "softmax", "rmsnorm", "scale")
BINARY = ("add", "sub", "mul", "matmul")


def random_taskgraph(
    seed: int,
    tasks: int = 30,
    devices: int = 2,
    sizes: tuple[int, ...] = (8, 16),
    inputs: int | None = None,
    move_prob: float = 0.15,
    window: int | None = None,
    dtype: str = "float32",
    mixed: bool = False,
) -> TaskGraph:
    """A random DAG of `tasks` kernels and moves over `devices` GPUs, its unread tensors marked as outputs.

    An operand is taken from the last `window` tensors of its shape (all when None), which keeps the graph
    local like a real model. `inputs` is the number of inputs made up front (default tasks // 5, at least 2).
    """
    maker = _Mixed if mixed else _Tiles
    g = maker(seed, devices, sizes, window, dtype).build(tasks, inputs, move_prob)
    users = g.consumers()
    g.output(*[node_id for node_id, readers in users.items() if not readers and g.nodes[node_id].op != "input"])
    return g


class _Tiles:
    """Square tiles only: inputs, unary and elementwise kernels, matmuls and moves."""

    squashing = ("softmax", "rmsnorm", "relu", "scale", "exp")
    """Ops whose result exp may take without a softmax first: loose (relu and scale are not bounded), kept
    so that tile graphs stay the ones the benchmarks measured."""

    def __init__(self, seed: int, devices: int, sizes: tuple[int, ...], window: int | None, dtype: str):
        self.rng = random.Random(seed)
        self.g = TaskGraph(devices)
        self.devices, self.sizes, self.window, self.dtype = devices, sizes, window, dtype
        self.pools: dict[tuple[int, ...], list[Tensor]] = {}
        self.squashed: set[str] = set()

    def build(self, tasks: int, inputs: int | None, move_prob: float) -> TaskGraph:
        for i in range(inputs if inputs is not None else max(2, tasks // 5)):
            self._add(self.g.input(self._input_shape(i), self.dtype, device=self.rng.randrange(self.devices), id=f"in{i}"))
        for i in range(tasks):
            a = self._operand()
            if self.rng.random() < move_prob and self.devices > 1:
                dest = self.rng.choice([d for d in range(self.devices) if d != a.device])
                self._add(self.g.move(a, dest, id=f"t{i}"))
                continue
            dev = a.device if self.rng.random() < 0.8 else self.rng.randrange(self.devices)
            self._add(self._step(i, self._on(a, dev), dev))
        return self.g

    def _input_shape(self, i: int) -> tuple[int, ...]:
        s = self.sizes[i % len(self.sizes)]
        return (s, s)

    def _operand(self) -> Tensor:
        """A tensor for the next step; scalars only ever serve as broadcast partners."""
        shape = self.rng.choice([s for s in self.pools if self.pools[s] and s])
        return self.rng.choice(self._pool(shape))

    def _pool(self, shape: tuple[int, ...]) -> list[Tensor]:
        pool = self.pools.get(shape, [])
        return pool if self.window is None else pool[-self.window :]

    def _add(self, t: Tensor) -> Tensor:
        self.pools.setdefault(t.shape, []).append(t)
        return t

    def _on(self, x: Tensor, device: int) -> Tensor:
        """`x` on `device`, moving it there once (the move is reused by later steps)."""
        if x.device == device:
            return x
        name = f"{x.id}.to{device}"
        return self.g.tensor(name) if name in self.g.nodes else self.g.move(x, device, id=name)

    def _step(self, i: int, a: Tensor, dev: int) -> Tensor:
        op = self.rng.choice(UNARY + BINARY)
        if op in BINARY:
            b = self._on(self.rng.choice(self._pool(a.shape)), dev)
            out = self.g.kernel(op, a, b, device=dev, id=f"t{i}")
            return self.g.scale(out, 1.0 / a.shape[0], device=dev, id=f"t{i}s") if op == "matmul" else out
        return self._unary(i, op, a, dev)

    def _unary(self, i: int, op: str, a: Tensor, dev: int, *weight: Tensor) -> Tensor:
        if op == "exp":
            src = a if a.id in self.squashed else self.g.softmax(a, device=dev, id=f"t{i}q")
            out = self.g.exp(src, device=dev, id=f"t{i}")
        elif op == "scale":
            out = self.g.scale(a, 0.5, device=dev, id=f"t{i}")
        else:
            out = self.g.kernel(op, a, *weight, device=dev, id=f"t{i}")
        if op in self.squashing and not weight:
            self.squashed.add(out.id)
        return out


class _Mixed(_Tiles):
    """Every tensor kind and op: see the module docstring."""

    squashing = ("softmax", "rmsnorm")
    """Bounded results: softmax in [0, 1], rmsnorm without a weight at most sqrt(row length)."""

    def _input_shape(self, i: int) -> tuple[int, ...]:
        s, t = self.rng.choice(self.sizes), self.rng.choice(self.sizes)
        menu = [(s, s), (s, s), (s, s), (s, t), (s, t), (s,), (1, s), (s, 1), (2, s, t), self.rng.choice([(0, s), (s, 0)])]
        return menu[0] if i == 0 else self.rng.choice(menu)

    def _step(self, i: int, a: Tensor, dev: int) -> Tensor:
        op = self.rng.choice(UNARY + ("add", "sub", "mul", "matmul", "einsum", "rmsnorm"))
        if op in ("add", "sub", "mul"):
            b = self._given(self._partner_shape(a.shape), dev)
            a, b = (b, a) if self.rng.random() < 0.5 else (a, b)
            return self.g.kernel(op, a, b, device=dev, id=f"t{i}")
        if op == "matmul" and len(a.shape) == 2:
            b = self._given((a.shape[1], self.rng.choice(self.sizes)), dev)
            return self._scaled(i, self.g.matmul(a, b, device=dev, id=f"t{i}m"), a.shape[1], dev)
        if op == "einsum":
            return self._einsum(i, a, dev)
        if op == "rmsnorm" and self.rng.random() < 0.5:
            return self._unary(i, "rmsnorm", a, dev, self._given(a.shape[-1:], dev))
        return self._unary(i, op if op != "matmul" else "relu", a, dev)  # matmul needs a 2-D operand

    def _partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against `shape` to `shape`: itself, or one with fewer or unit dimensions
        (down to a scalar)."""
        partners = [shape, shape, shape[-1:], shape[1:]]
        if len(shape) >= 2:
            partners += [(1, *shape[1:]), (*shape[:-1], 1)]
        return self.rng.choice(partners)

    def _given(self, shape: tuple[int, ...], dev: int) -> Tensor:
        """An earlier tensor of `shape` on `dev` (moved there if needed), or a new input of that shape."""
        pool = self._pool(shape)
        if pool and self.rng.random() < 0.8:
            return self._on(self.rng.choice(pool), dev)
        return self._add(self.g.input(shape, self.dtype, device=dev, id=f"in{len(self.g.nodes)}"))

    def _scaled(self, i: int, x: Tensor, contracted: int, dev: int) -> Tensor:
        return self.g.scale(x, 1.0 / max(contracted, 1), device=dev, id=f"t{i}")

    def _einsum(self, i: int, a: Tensor, dev: int) -> Tensor:
        """A random equation that `a`'s rank allows, its second operand found or made, scaled by 1/contracted."""
        equation, other = self.rng.choice(_einsum_forms(a.shape, self.rng.choice(self.sizes)))
        operands = [a] if other is None else [a, self._given(other, dev)]
        out = self.g.einsum(equation, *operands, device=dev, id=f"t{i}e")
        inputs, output = equation.split("->")
        extent = dict(zip(inputs.replace(",", ""), [d for x in operands for d in x.shape]))
        return self._scaled(i, out, math.prod(n for letter, n in extent.items() if letter not in output), dev)


def _einsum_forms(shape: tuple[int, ...], s: int) -> list[tuple[str, tuple[int, ...] | None]]:
    """Equations whose first operand has `shape`, each with the second operand's shape (None: no second)."""
    if len(shape) == 1:
        return [("i,j->ij", (s,)), ("i,i->i", shape)]
    if len(shape) == 2:
        return [("ij->ji", None), ("ij->j", None), ("ij,jk->ik", (shape[1], s)), ("ij,ij->i", shape), ("ij,j->i", shape[1:])]
    return [("bij->bji", None), ("bij,bjk->bik", (shape[0], shape[2], s)), ("bij->bj", None)]

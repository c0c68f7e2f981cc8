"""Random taskgraphs for tests and benchmarks; the real models are in `turnip_ir.workloads`.

Each function returns a `TaskGraph` built with the builder, with its outputs marked.
"""

from __future__ import annotations

import random

from turnip_ir.taskgraph import TaskGraph, Tensor


def _on(g: TaskGraph, x: Tensor, device: int, name: str) -> Tensor:
    """`x` on `device`, moving it there once (the move is reused by later callers)."""
    if x.device == device:
        return x
    if name in g.nodes:
        return g.tensor(name)
    return g.move(x, device, id=name)


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
) -> TaskGraph:
    """A random DAG of square tiles: inputs, unary and binary kernels, matmuls and moves over `devices` GPUs.

    Tiles are `s x s` for `s` drawn from `sizes`, so tensors have mixed sizes. An operand is taken from
    the last `window` tensors of the same size (all when None), which keeps the graph local like a real
    model. Values stay bounded (exp is applied only after a squashing op) so float32 runs compare
    closely with a float64 reference.
    """
    rng = random.Random(seed)
    g = TaskGraph(devices)
    pools: dict[int, list[Tensor]] = {s: [] for s in sizes}
    squashed: set[str] = set()
    count = inputs if inputs is not None else max(2, tasks // 5)
    for i in range(count):
        s = sizes[i % len(sizes)]
        pools[s].append(g.input((s, s), dtype, device=rng.randrange(devices), id=f"in{i}"))
    for i in range(tasks):
        s = rng.choice([size for size in sizes if pools[size]])
        pool = pools[s] if window is None else pools[s][-window:]
        a = rng.choice(pool)
        if rng.random() < move_prob and devices > 1:
            dest = rng.choice([d for d in range(devices) if d != a.device])
            pools[s].append(g.move(a, dest, id=f"t{i}"))
            continue
        dev = a.device if rng.random() < 0.8 else rng.randrange(devices)
        a = _on(g, a, dev, f"{a.id}.to{dev}")
        op = rng.choice(UNARY + BINARY)
        if op in BINARY:
            b = rng.choice(pool)
            b = _on(g, b, dev, f"{b.id}.to{dev}")
            out = g.kernel(op, a, b, device=dev, id=f"t{i}")
            if op == "matmul":
                out = g.scale(out, 1.0 / s, device=dev, id=f"t{i}s")
        elif op == "exp":
            src = a if a.id in squashed else g.softmax(a, device=dev, id=f"t{i}q")
            out = g.exp(src, device=dev, id=f"t{i}")
        elif op == "scale":
            out = g.scale(a, 0.5, device=dev, id=f"t{i}")
        else:
            out = g.kernel(op, a, device=dev, id=f"t{i}")
        if op in ("softmax", "rmsnorm", "relu", "scale") or op == "exp":
            squashed.add(out.id)
        pools[s].append(out)
    users = g.consumers()
    g.output(*[node_id for node_id, readers in users.items() if not readers and g.nodes[node_id].op != "input"])
    return g

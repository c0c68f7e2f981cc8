"""Taskgraph generators: the seed's blocked matmul, an FFN stack, and random graphs for tests and benchmarks.

Each function returns a `TaskGraph` built with the builder, with its outputs marked.
"""

from __future__ import annotations

import random

from turnip_ir.taskgraph import TaskGraph, Tensor


def blocked_matmul(n: int = 256, blocks: int = 2, devices: int = 3, dtype: str = "float32") -> TaskGraph:
    """C = A @ B with A split into `blocks` x `blocks` tiles, each tile product on a GPU in turn.

    Partial products C[i,j] = sum_k A[i,k] @ B[k,j] are moved to the GPU that owns C[i,j] and summed
    there: the seed's running example (GPU-to-GPU moves and a final sum).
    """
    if n % blocks:
        raise ValueError(f"n={n} is not divisible by blocks={blocks}")
    tile = n // blocks
    g = TaskGraph(devices)
    a = {(i, k): g.input((tile, tile), dtype, device=(i + k) % devices, id=f"A{i}{k}") for i in range(blocks) for k in range(blocks)}
    b = {(k, j): g.input((tile, tile), dtype, device=(k + j) % devices, id=f"B{k}{j}") for k in range(blocks) for j in range(blocks)}
    for i in range(blocks):
        for j in range(blocks):
            owner = (i + j) % devices
            total = None
            for k in range(blocks):
                dev = (i + k + j) % devices
                lhs = _on(g, a[i, k], dev, f"A{i}{k}.to{dev}")
                rhs = _on(g, b[k, j], dev, f"B{k}{j}.to{dev}")
                part = g.matmul(lhs, rhs, device=dev, id=f"P{i}{j}{k}")
                part = _on(g, part, owner, f"P{i}{j}{k}.to{owner}")
                total = part if total is None else g.add(total, part, device=owner, id=f"S{i}{j}{k}")
            g.output(total)
    return g


def _on(g: TaskGraph, x: Tensor, device: int, name: str) -> Tensor:
    """`x` on `device`, moving it there once (the move is reused by later callers)."""
    if x.device == device:
        return x
    if name in g.nodes:
        return g.tensor(name)
    return g.move(x, device, id=name)


def ffn_stack(layers: int = 4, tokens: int = 64, hidden: int = 128, ffn: int = 256, devices: int = 1, dtype: str = "float32") -> TaskGraph:
    """A stack of FFN blocks x + W2 @ gelu(W1 @ rmsnorm(x)), with layers spread over devices in turn.

    Activations are (tokens, hidden); weights (hidden, ffn) and (ffn, hidden) are inputs on the layer's GPU.
    """
    g = TaskGraph(devices)
    x = g.input((tokens, hidden), dtype, device=0, id="x")
    for layer in range(layers):
        dev = layer * devices // layers
        if x.device != dev:
            x = g.move(x, dev, id=f"x{layer}.to{dev}")
        w1 = g.input((hidden, ffn), dtype, device=dev, id=f"w1.{layer}")
        w2 = g.input((ffn, hidden), dtype, device=dev, id=f"w2.{layer}")
        h = g.rmsnorm(x, device=dev, id=f"norm{layer}")
        h = g.matmul(h, w1, device=dev, id=f"up{layer}")
        h = g.gelu(h, device=dev, id=f"act{layer}")
        h = g.matmul(h, w2, device=dev, id=f"down{layer}")
        x = g.add(x, h, device=dev, id=f"res{layer}")
    g.output(x)
    return g


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

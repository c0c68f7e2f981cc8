"""The seed's reference graphs that the compiler benchmarks (bench/bench_plans.py, bench/bench_compile.py)
were measured on: a blocked matmul with its own tile placement, and an FFN stack with a norm and a residual
per layer. Models that users run are built with the frontend (frontend/workloads); these stay fixed so
that plan-quality figures compare across changes.
"""

from __future__ import annotations

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

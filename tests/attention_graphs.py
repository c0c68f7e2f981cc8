"""A blocked causal attention taskgraph for the cuda tests: q, k, v cut into token blocks, each query block
a chain over key blocks 0..i, the llama decomposition (diagonal blocks causal and final)."""

from __future__ import annotations

from turnip_ir.taskgraph import TaskGraph


def attention_graph(tokens: int, block: int, heads: int, kv_heads: int, width: int, dtype: str) -> TaskGraph:
    g = TaskGraph(devices=1)
    q = [g.input((block, heads * width), dtype, device=0, id=f"q{i}") for i in range(tokens // block)]
    k = [g.input((block, kv_heads * width), dtype, device=0, id=f"k{i}") for i in range(tokens // block)]
    v = [g.input((block, kv_heads * width), dtype, device=0, id=f"v{i}") for i in range(tokens // block)]
    for i in range(len(q)):
        partial = None
        for j in range(i + 1):
            last = j == i
            partial = g.attention(q[i], k[j], v[j], partial, heads=heads, kv_heads=kv_heads, causal=last, final=last, device=0, id=f"a{i}.{j}")
        g.output(partial)
    return g


def packed_attention_graph(lengths: list[int], heads: int, kv_heads: int, width: int, dtype: str, prev: bool = False) -> TaskGraph:
    """One causal block of sequences of `lengths` packed end to end (`segments`), its output `a`; with
    `prev`, merged into the partial a full key block `k0`, `v0` leaves (`p`), which the kernel allows."""
    g = TaskGraph(devices=1)
    rows = sum(lengths)
    q = g.input((rows, heads * width), dtype, device=0, id="q")
    k, v = (g.input((rows, kv_heads * width), dtype, device=0, id=name) for name in "kv")
    partial = None
    if prev:
        k0, v0 = (g.input((rows, kv_heads * width), dtype, device=0, id=name) for name in ("k0", "v0"))
        partial = g.attention(q, k0, v0, heads=heads, kv_heads=kv_heads, final=False, device=0, id="p")
    cuts = ",".join(str(sum(lengths[:i])) for i in range(1, len(lengths)))
    g.output(g.attention(q, k, v, partial, heads=heads, kv_heads=kv_heads, causal=True, segments=cuts, device=0, id="a"))
    return g


def per_sequence_attention(q, k, v, heads: int, kv_heads: int, lengths: list[int]):
    """The float64 reference of a packed block: causal attention over each sequence alone, stacked."""
    import numpy as np

    from tests import formulas_llama as formulas

    bounds = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    return np.concatenate([formulas.attention(q[a:b], k[a:b], v[a:b], heads, kv_heads, causal=True)
                           for a, b in zip(bounds, bounds[1:])])

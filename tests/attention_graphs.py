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

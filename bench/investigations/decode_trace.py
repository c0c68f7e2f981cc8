"""Where a 7b decode step's time goes on the GPU: one Session, random KV caches (shared rows), 2 steps,
the last step's trace written and summarised (vertices, GPU busy share, time per kind of vertex).
Usage: python3 bench/investigations/decode_trace.py [GiB [batch [prompt]]] (default 16 16 2048)."""
import json, os, sys, time
import numpy as np
from turnip import Session
from runtime.summary import summarize

gib = float(sys.argv[1]) if len(sys.argv) > 1 else 16
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
out = os.environ.get("OUT", ".")
began = time.perf_counter()
with Session(config="7b", memory=int(gib * 2**30), backend="cuda") as session:
    rows = np.random.default_rng(0).standard_normal((prompt - 1, 4096)).astype(np.float16) * 0.1
    caches = [[(rows, rows)] * 32 for _ in range(batch)]
    print(f"session ready {time.perf_counter() - began:.1f} s", flush=True)
    result = session.generate([np.arange(prompt) % 1000] * batch, 2, caches=caches)
    print("step s", result.step_seconds, "run s", getattr(result, "step_run_seconds", None), "compile", result.compile_seconds, flush=True)
    rec = result.recorder
    rec.write_trace(f"{out}/decode-{gib:g}gib-{batch}x{prompt}.json")
    graph, comps = rec.graph, rec.completions
    by = {}
    for c in comps:
        node = graph.node(c.vertex)
        kind = node.kernel or node.op
        entry = by.setdefault(kind, [0, 0.0])
        entry[0] += 1
        entry[1] += c.end - c.start
    print("vertices", len(comps), json.dumps({k: [v[0], round(v[1] * 1e3, 2)] for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])}))
    start, end = min(c.start for c in comps), max(c.end for c in comps)
    spans = sorted((c.start, c.end) for c in comps if graph.lanes[c.lane].kind == "compute")
    busy, top = 0.0, start
    for a, b in spans:
        if b > top:
            busy += b - max(a, top)
            top = b
    h2d = sum(c.end - c.start for c in comps if graph.node(c.vertex).op == "reload")
    lag = sorted(c.start - rec.started[c.vertex] for c in comps if c.vertex in rec.started)
    print(f"span {(end - start) * 1e3:.1f} ms, compute busy {busy * 1e3:.1f} ms, h2d busy {h2d * 1e3:.1f} ms, "
          f"submit-to-start lag median {lag[len(lag) // 2] * 1e6:.0f} us")
print(f"total {time.perf_counter() - began:.1f} s")

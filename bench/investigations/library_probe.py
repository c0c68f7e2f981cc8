"""What the libraries take on the GPU beside the arena, by attention provider, compute lanes and block size.

Each case runs in a fresh process (a process's first plan pays the libraries' start-up, which a later plan
finds taken already): a one-layer graph of `tests/test_cuda_gpu.py`'s kind (a GEMM, rmsnorm, rope,
attention of SIZE x SIZE in float16 with 64-wide heads, swiglu) planned with room to spare, run once under
nondet. It prints, per case, the library memory the backend measured after warm-up (`library_bytes`), the
largest drop in free GPU memory while running less the arena and workspace, and the allowance
`devices.library_allowance` holds back for it. Usage: python3 bench/investigations/library_probe.py
With OUT set, writes the lines to $OUT/library_probe.json.
"""
import json
import os
import subprocess
import sys

CASE = r'''
import json, sys
from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.backends.cuda import CudaBackend
from runtime.backends.cuda.devices import library_allowance
from turnip_ir.taskgraph import TaskGraph

provider, streams, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g = TaskGraph(devices=1)
x = g.input((size, size), "float16", device=0, id="x")
w = g.input((size, size), "float16", device=0, id="w")
c = g.input((size, 64), "float16", device=0, id="cos")
s = g.input((size, 64), "float16", device=0, id="sin")
h = g.rmsnorm(g.einsum("ti,oi->to", x, w, device=0), device=0)
q = g.rope(h, c, s, device=0)
a = g.attention(q, h, h, heads=size // 64, kv_heads=size // 64, causal=True, device=0)
g.output(g.swiglu(a, h, device=0))
memgraph = compile_taskgraph(g, 16 * size * size * 2)
backend = CudaBackend(attention_provider=provider, sample_memory=0.0002)
execute(memgraph, backend=backend, order="nondet", streams=streams)
st = backend.stats
allowance = library_allowance(memgraph.nodes, streams, backend.attention, st["pinned_bytes"])
print(json.dumps({"provider": backend.attention, "streams": streams, "size": size, "library": st["library_bytes"],
                  "peak_beside": st["peak_drop"] - st["arena_bytes"] - st["workspace_bytes"], "allowance": allowance,
                  "pinned": st["pinned_bytes"]}))
'''


def main() -> None:
    rows = []
    for provider in ("torch-cudnn", "triton"):
        for size in (2048, 4096):
            for streams in (1, 2, 3):
                proc = subprocess.run([sys.executable, "-c", CASE, provider, str(streams), str(size)], capture_output=True, text=True, timeout=120)
                line = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None
                if line is None:
                    print(f"{provider} streams {streams} size {size}: failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
                row = json.loads(line)
                rows.append(row)
                mib = {k: row[k] / 2**20 for k in ("library", "peak_beside", "allowance")}
                print(f"{row['provider']:12s} streams {streams} size {size}: library {mib['library']:.1f} MiB, peak beside the arena "
                      f"{mib['peak_beside']:.1f} MiB, allowance {mib['allowance']:.1f} MiB", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "library_probe.json"), "w") as out:
            json.dump({"machine": "NVIDIA H200", "command": "bench/investigations/library_probe.py", "cases": rows}, out, indent=1)


if __name__ == "__main__":
    main()

"""What the libraries take on the GPU beside the arena, by attention provider, compute lanes and block size.

Each case runs in a fresh process (a process's first plan pays the libraries' start-up, which a later plan
finds taken already): a one-layer graph of `tests/test_cuda_gpu.py`'s kind (a GEMM, rmsnorm, rope,
attention of SIZE x SIZE in float16 with 64-wide heads, swiglu) planned with room to spare, run once under
nondet. It prints, per case, the library memory the backend measured after warm-up (`library_bytes`), the
largest drop in free GPU memory while running less the arena and workspace, and the allowance
`devices.library_allowance` holds back for it. With OUT set, writes the lines to $OUT/library_probe.json.

    python3 bench/investigations/library_probe.py
    python3 bench/investigations/library_probe.py --providers torch-cudnn --sizes 4096 --streams 1 2 3
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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


def measure(provider: str, streams: int, size: int) -> dict:
    """One case in a fresh process: its row, or {"error": the last line of its stderr}."""
    proc = subprocess.run([sys.executable, "-c", CASE, provider, str(streams), str(size)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", nargs="+", default=["torch-cudnn", "triton"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[2048, 4096])
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 2, 3])
    args = parser.parse_args(argv)
    rows = []
    for provider in args.providers:
        for size in args.sizes:
            for streams in args.streams:
                row = measure(provider, streams, size)
                if "error" in row:
                    print(f"{provider} streams {streams} size {size}: failed: {row['error']}", flush=True)
                    continue
                rows.append(row)
                mib = {k: row[k] / 2**20 for k in ("library", "peak_beside", "allowance")}
                print(f"{row['provider']:12s} streams {streams} size {size}: library {mib['library']:.1f} MiB, peak beside the arena "
                      f"{mib['peak_beside']:.1f} MiB, allowance {mib['allowance']:.1f} MiB", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "library_probe.json"), "w") as out:
            json.dump({"machine": "NVIDIA H200", "command": "bench/investigations/library_probe.py", "cases": rows}, out, indent=1)


if __name__ == "__main__":
    main()

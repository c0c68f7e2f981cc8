"""Sim predictions of llama prefill over 1-8 GPUs (docs/benchmarks-log.md, "Predictions for 4 and 8 GPUs").

    .venv/bin/python bench/predict_gpus.py    # needs bench/llama70b.json beside it for the 70B-shaped row
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed

from frontend.workloads import llama
from passes.pipeline import compile_taskgraph
from runtime import execute
MiB = 1 << 20
cfg = llama.load_config("7b")
reserve = 2 * (32 * MiB + 4096 * 4096 * 2 + 32 * 4096 * 4 + 64 * MiB)
base = {}
for T in (32768, 131072):
    for gpus, placement in ((1, "sequence"), (2, "sequence"), (2, "zigzag"), (4, "sequence"), (4, "zigzag"), (8, "sequence"), (8, "zigzag")):
        b = llama.build_llama(cfg, T, gpus=gpus, placement=placement)
        m = compile_taskgraph(b.graph, 4 * 2**30 - reserve, inputs="host")
        r = execute(m, backend="sim", order="nondet", verify=False).summary
        base.setdefault(T, r.makespan)
        print(f"| 7b | {T} | {gpus} | {placement} | 4 | {r.makespan:.3f} | {base[T] / r.makespan:.2f} | {base[T] / r.makespan / gpus:.2f} | {min(r.busy):.0%}-{max(r.busy):.0%} | {r.bytes_moved / 2**30:.0f} | {r.bytes_reloaded / 2**30:.1f} |", flush=True)
cfg = llama.load_config("bench/llama70b.json")
for gib in (16,):
    b = llama.build_llama(cfg, 32768, gpus=8, placement="zigzag", block=2048)
    reserve70 = 2 * (32 * MiB + 2048 * 8192 * 2 + 64 * 2048 * 4 + 64 * MiB)
    m = compile_taskgraph(b.graph, gib * 2**30 - reserve70, inputs="host")
    r = execute(m, backend="sim", order="nondet", verify=False).summary
    print(f"| 70B-shaped | 32768 | 8 | zigzag, blocks of 2048 | {gib} | {r.makespan:.3f} | | | {min(r.busy):.0%}-{max(r.busy):.0%} | {r.bytes_moved / 2**30:.0f} | {r.bytes_reloaded / 2**30:.1f} |", flush=True)

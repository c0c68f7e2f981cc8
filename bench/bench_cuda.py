"""GPU benchmarks of the cuda backend, each figure a ratio to a ceiling or baseline measured in the same run.

    python3 bench/bench_cuda.py SECTION... [--json results.json] [--quick] [--peer-n N]

Sections: ceilings (H2D, D2H, both at once, HBM copy, fp16 GEMM), notifiers (completion latency and a
100,000-vertex stress test per notifier), lookahead (idle gap between dependent GEMMs, queued ahead or
not), dispatch (host cost per tiny vertex), kernels (memory-bound kernels against the HBM copy rate),
merge (the attention merge alone), attention (providers on 7B blocks against
torch's best SDPA), copies (reload-bound and duplex chains),
ffn (16 layers 8192x32768 fp16 at 8 GiB: turnip nondet and fixed, a synchronous layer-by-layer copy, a
hand-written double-buffered prefetch, and the PCIe floor), sim (the sim prediction beside the measured run),
triton (the triton provider's tile sweep), contention (H2D alone and under GEMMs), peer (two GPUs: the
peer-copy ceiling, then the seed's blocked matmul, 49152^3 fp32 by default, at 16 and 6 GiB per GPU).
Run on the GPU machine after `source bench/gpu_setup.sh` (bench/gpu_bench.sh has the stages).
The sections live by subject in bench/cuda_copies.py (ceilings, copies, contention, notifiers, lookahead,
dispatch), bench/cuda_kernels.py (kernels, merge, triton, attention) and bench/cuda_workloads.py (ffn, sim,
peer), on bench/cuda_common.py; this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import cuda_copies  # first: cuda_common puts the repository on sys.path
import cuda_kernels
import cuda_workloads

SECTIONS = ("ceilings", "notifiers", "lookahead", "dispatch", "kernels", "merge", "triton", "attention", "contention", "copies", "ffn", "sim", "peer")


def run_section(name: str, quick: bool, ceiling: dict | None, peer_n: int | None) -> dict:
    """One section's figures; `ceiling` is the ceilings section's, measured first in every call."""
    if name == "ceilings":
        return cuda_copies.ceilings(quick)
    if name == "kernels":
        return cuda_kernels.kernels(quick, ceiling["hbm"])
    if name == "copies":
        return cuda_copies.copies(quick, ceiling)
    if name == "ffn":
        return cuda_workloads.ffn(quick, ceiling)
    if name == "peer":
        return cuda_workloads.peer(quick, peer_n)
    plain = {"notifiers": cuda_copies.notifiers, "lookahead": cuda_copies.lookahead, "dispatch": cuda_copies.dispatch,
             "contention": cuda_copies.contention, "merge": cuda_kernels.merge, "triton": cuda_kernels.triton_sweep,
             "attention": cuda_kernels.attention_bench, "sim": cuda_workloads.sim}
    return plain[name](quick)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", default=list(SECTIONS), help="any of: " + ", ".join(SECTIONS))
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a first smoke run")
    parser.add_argument("--peer-n", type=int, help="the peer section's matmul edge (default 49152, 16384 with --quick)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}: choose from {', '.join(SECTIONS)}")
    import torch

    results = {"machine": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d")}
    for section in (["ceilings"] if "ceilings" not in args.sections else []) + list(args.sections):
        began = time.perf_counter()
        try:
            results[section] = run_section(section, args.quick, results.get("ceilings"), args.peer_n)
        except Exception:
            results[section] = {"error": traceback.format_exc()}
            print(f"\n{section} FAILED:\n{traceback.format_exc()}", flush=True)
        print(f"({section}: {time.perf_counter() - began:.1f} s)", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A quick look at a 7b generation session on the GPU: the budget as the driver sees it, the packed prefill, the phases.

    source bench/gpu_setup.sh && python3 bench/investigations/session_budget.py [--steps 4] [--json $OUT/session.json]

Runs `turnip.Session(config="7b", memory=4GiB)` (random fp16 weights) on 16 x 2048 prompts, then the same call
again (nothing compiled, one backend), then 64 x 512; samples this process's device memory with nvidia-smi
every 100 ms (bench_generation.py's DeviceSampler) beside the session's own NVML figure; prints each call's phases and the verdict against budget +
context. For the issue 44 figures use bench/bench_generation.py; this is the short check a first GPU call makes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_generation import DeviceSampler  # noqa: E402  (nvidia-smi sampling, as the benchmark does)
from frontend.workloads import llama  # noqa: E402
from turnip import Session  # noqa: E402

GIB = 1 << 30


def call(session: Session, prompts: list, steps: int) -> dict:
    result = session.generate(prompts, steps)
    figures = {"batch": len(prompts), "prompt": len(prompts[0]), "steps": steps, "prefill_s": result.prefill_seconds,
               "first_token_s": result.first_token_seconds, "call_s": result.call_seconds, "compile_s": result.compile_seconds,
               "prepare_s": result.prepare_seconds, "compiles": result.compiles, "step_s": result.step_seconds,
               "steady_step_s": result.steady_step_seconds, "device_peak": result.device_peak, "device_context": result.device_context,
               "written_straight": result.bytes_written_straight, "copied_after": result.bytes_copied_after,
               "backends_built": session.backends_built, "arena": session.arena, "peak_arena": result.peak_arena}
    print(json.dumps({k: v for k, v in figures.items() if k != "step_s"}), flush=True)
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="7b")
    parser.add_argument("--memory", type=float, default=4.0, help="GiB")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=["16x2048", "16x2048", "64x512"], help="B x P of each call, in order")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    config = llama.load_config(args.config)
    rng = np.random.default_rng(0)
    runs = []
    began = time.perf_counter()
    with DeviceSampler() as smi:
        smi.watch(os.getpid())
        with Session(config=args.config, memory=int(args.memory * GIB), backend=args.backend) as session:
            for batch, length in (tuple(int(n) for n in shape.split("x")) for shape in args.shapes):
                prompts = list(rng.integers(0, config.vocab_size, size=(batch, length)))
                runs.append(call(session, prompts, args.steps))
    peak, how = smi.peak()
    context = next((r["device_context"] for r in runs if r["device_context"]), None)
    budget = int(args.memory * GIB)
    verdict = {"smi_peak": peak, "smi": how, "smi_samples": smi.samples, "nvml_peak": max((r["device_peak"] or 0) for r in runs),
               "context": context, "budget": budget, "wall_s": time.perf_counter() - began}
    if context:
        verdict["within_budget_plus_context"] = max(peak or 0, verdict["nvml_peak"]) <= budget + context
    print(json.dumps(verdict), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "verdict": verdict}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a `turnip finetune` step's wall time goes beyond its run (issue 46): a 7b LoRA session on the GPU,
each step's record beside its run's phases (the executor's prepare, the loop's wall, the device makespan,
the host work inside the loop), then a cProfile of a few steps (the main thread), printed.

    python3 bench/investigations/finetune_profile.py --seq-len 4096 --memory 8GiB --steps 4
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from turnip import Session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--memory", default="8GiB")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    session = Session(config=args.config, memory=args.memory, backend=args.backend)
    ids = np.random.default_rng(0).integers(0, session.config.vocab_size, (args.steps + 1, args.seq_len))
    runs = []
    original = session._run

    def timed_run(*a, **k):
        began = time.perf_counter()
        result, seconds, whole = original(*a, **k)
        s = result.summary
        runs.append({"session_run_s": time.perf_counter() - began, "prepare_s": s.prepare_time, "loop_wall_s": s.wall_time,
                     "makespan_s": s.makespan, "host": {k: round(v, 4) for k, v in s.host_seconds.items()}})
        return result, seconds, whole

    session._run = timed_run
    options = dict(rank=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"), seq_len=args.seq_len)
    began = time.perf_counter()
    first = session.finetune(ids[:1], steps=1, **options)
    print(f"first step: {time.perf_counter() - began:.3f} s in all, record {first.steps[0].seconds:.3f} s; {runs[-1]}", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    result = session.finetune(ids[1:], steps=args.steps, adapter=first.adapter, state=first.state, **options)
    profile.disable()
    for record, run in zip(result.steps, runs[1:]):
        print(f"step {record.step}: record {record.seconds:.3f} s; {run}", flush=True)
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    session.close()


if __name__ == "__main__":
    main()

"""Where a `turnip finetune` step's wall time goes beyond its run (issue 46): a 7b LoRA session on the GPU,
each step's record beside its run's phases (the executor's prepare, the loop's wall, the device makespan,
the host work inside the loop), then as many steps again under cProfile (the main thread) with the garbage
collector's pauses, printed.

    python3 bench/investigations/finetune_profile.py --seq-len 4096 --memory 8GiB --steps 4
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import resource
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
    ids = np.random.default_rng(0).integers(0, session.config.vocab_size, (2 * args.steps, args.seq_len))
    runs = []
    original = session._run

    faults = [resource.getrusage(resource.RUSAGE_SELF).ru_minflt]

    def timed_run(*a, **k):
        began, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result, seconds, whole = original(*a, **k)
        s = result.summary
        runs.append({"session_run_s": time.perf_counter() - began, "prepare_s": s.prepare_time, "loop_wall_s": s.wall_time,
                     "makespan_s": s.makespan, "host": {k: round(v, 4) for k, v in s.host_seconds.items()},
                     "page_faults_in_run": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before})
        return result, seconds, whole

    def step_faults(record):  # minor page faults of the whole step (fresh pages of large arrays: malloc's maps)
        now = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        runs[-1]["page_faults_in_step"] = now - faults[0]
        faults[0] = now

    session._run = timed_run
    options = {"rank": 16, "targets": ("q_proj", "k_proj", "v_proj", "o_proj"), "seq_len": args.seq_len}
    began = time.perf_counter()
    first = session.finetune(ids[:args.steps], steps=args.steps, on_step=step_faults, **options)  # unprofiled: the first, then steady steps
    print(f"unprofiled call: {time.perf_counter() - began:.3f} s in all", flush=True)
    for record, run in zip(first.steps, runs):
        print(f"step {record.step}: record {record.seconds:.3f} s; {run}", flush=True)
    runs.clear()
    paused = {"seconds": 0.0, "collections": [0, 0, 0]}
    start = [0.0]

    def garbage(phase, info):  # the collector's pauses during the profiled steps
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            paused["seconds"] += time.perf_counter() - start[0]
            paused["collections"][info["generation"]] += 1

    gc.callbacks.append(garbage)
    profile = cProfile.Profile()
    profile.enable()
    result = session.finetune(ids[args.steps:], steps=args.steps, adapter=first.adapter, state=first.state, **options)
    profile.disable()
    gc.callbacks.remove(garbage)
    print(f"garbage collection during the profiled steps: {paused['seconds']:.3f} s, collections by generation {paused['collections']}")
    for record, run in zip(result.steps, runs):
        print(f"profiled step {record.step}: record {record.seconds:.3f} s; {run}", flush=True)
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    session.close()


if __name__ == "__main__":
    main()

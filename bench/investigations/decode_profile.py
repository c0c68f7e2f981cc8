"""Where a 7b decode step's wall time goes outside the executor's run, on the GPU: one Session per budget,
random KV caches in one shared buffer (KvCache.wrap), a few warm steps, then cProfile over the next steps;
prints step and run ms and the top functions by cumulative and own time (the run's loop included, so its
share is visible). Usage: python3 bench/investigations/decode_profile.py [GiB ...] (default 40 16)."""
import cProfile, io, os, pstats, sys, time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from frontend.workloads.llama.decode import KV_BLOCK  # noqa: E402
from frontend.workloads.llama.kv_cache import KvCache  # noqa: E402
from turnip import Session  # noqa: E402

batch, prompt, warm, profiled = 16, 2048, 3, 6
budgets = [float(a) for a in sys.argv[1:]] or [40.0, 16.0]
out = os.environ.get("OUT", ".")
capacity = ((prompt + warm + profiled) // KV_BLOCK + 2) * KV_BLOCK
rows = (np.random.default_rng(0).standard_normal((capacity, batch, 4096), dtype=np.float32) * 0.1).astype(np.float16)
for gib in budgets:
    began = time.perf_counter()
    with Session(config="7b", memory=int(gib * 2**30), backend="cuda") as session:
        prompts = [np.arange(prompt) % 1000] * batch
        kv = [(rows, rows.copy()) for _ in range(32)]
        cache = KvCache.wrap(kv, [prompt - 1] * batch, KV_BLOCK)
        forced = np.zeros((batch, warm + profiled), dtype=np.int64)
        first = session.generate(prompts, warm, caches=cache, forced=forced[:, :warm])
        print(f"{gib:g} GiB: ready + {warm} warm steps in {time.perf_counter() - began:.1f} s; "
              f"steps ms {[round(s * 1e3, 1) for s in first.step_seconds]}", flush=True)
        # the same buffers, continued: the cache now holds prompt - 1 + warm rows
        cache2 = KvCache.wrap(kv, [prompt - 1 + warm] * batch, KV_BLOCK)
        prompts2 = [np.arange(prompt + warm) % 1000] * batch
        profile = cProfile.Profile()
        profile.enable()
        result = session.generate(prompts2, profiled, caches=cache2, forced=forced[:, warm:])
        profile.disable()
        step = [round(s * 1e3, 1) for s in result.step_seconds]
        run = [round(s * 1e3, 1) for s in result.step_run_seconds]
        print(f"{gib:g} GiB: step ms {step}\n  run ms {run}\n  placed MiB {[round(b / 2**20, 1) for b in result.step_bytes_placed]} "
              f"compiles {result.compiles}", flush=True)
        for key in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(key).print_stats(35)
            print("\n".join(line[:160] for line in text.getvalue().splitlines()[6:]), flush=True)
        profile.dump_stats(f"{out}/decode-profile-{gib:g}gib.prof")

"""Where a 7b decode step's wall time goes outside the executor's run, on the GPU: one Session per budget,
random KV caches in one shared buffer (KvCache.wrap), one generate call whose steps after the warm ones are profiled;
prints step and run ms and the top functions by cumulative and own time (the run's loop included, so its
share is visible). Usage: python3 bench/investigations/decode_profile.py [GiB[@BxP] ...] (default 40 16; B x P
16 x 2048 unless given, e.g. 4@64x512)."""
import cProfile, io, os, pstats, sys, time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from frontend.workloads.llama.decode import KV_BLOCK  # noqa: E402
from frontend.workloads.llama.kv_cache import KvCache  # noqa: E402
from turnip import Session  # noqa: E402

warm, profiled = 3, 6
out = os.environ.get("OUT", ".")
points = []
for arg in sys.argv[1:] or ["40", "16"]:
    gib, _, shape = arg.partition("@")
    batch, _, prompt = (shape or "16x2048").partition("x")
    points.append((float(gib), int(batch), int(prompt)))
for gib, batch, prompt in points:
    capacity = ((prompt + warm + profiled) // KV_BLOCK + 2) * KV_BLOCK
    rows = (np.random.default_rng(0).standard_normal((capacity, batch, 4096), dtype=np.float32) * 0.1).astype(np.float16)
    began = time.perf_counter()
    with Session(config="7b", memory=int(gib * 2**30), backend="cuda") as session:
        prompts = [np.arange(prompt) % 1000] * batch
        pair = [session.host.empty(rows.shape, rows.dtype) for _ in range(2)]  # page-locked on cuda: read in place
        for buffer in pair:
            buffer[...] = rows
        kv = [tuple(pair)] * 32  # every layer's columns in the same two buffers (the values do not matter here)
        cache = KvCache.wrap(kv, [prompt - 1] * batch, KV_BLOCK)
        forced = np.zeros((batch, warm + profiled), dtype=np.int64)
        profile, first, calls, decode = cProfile.Profile(), cProfile.Profile(), [-(warm + 12)], session._decode

        def profiled_decode(*args, **kwargs):  # `first` profiles the warm steps (compiles), `profile` the rest
            calls[0] += 1
            if calls[0] == 1:
                first.enable()
            if calls[0] == warm + 1:
                first.disable()
                profile.enable()
            return decode(*args, **kwargs)

        session._decode = profiled_decode
        plain = session.generate(prompts, warm + 12, caches=cache, forced=np.zeros((batch, warm + 12), dtype=np.int64))
        host = plain.step_host_seconds[warm:]
        parts = {part: float(np.median([h[part] for h in host])) * 1e3 for part in host[0]}
        steady = np.median(plain.step_seconds[warm:]) * 1e3
        ran = np.median(plain.step_run_seconds[warm:]) * 1e3
        print(f"{gib:g} GiB, no profiler, {len(host)} steps: step {steady:.2f} ms, run {ran:.2f} ms ({steady / ran:.3f}x); "
              f"host outside the run by part (median ms): " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
              + f"; sum {sum(parts.values()):.3f}; the last prepare: "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in session._machine.stats.get("rerun_steps", {}).items()), flush=True)
        cache = KvCache.wrap(kv, [prompt - 1] * batch, KV_BLOCK)
        result = session.generate(prompts, warm + profiled, caches=cache, forced=forced)
        profile.disable()
        step = [round(s * 1e3, 1) for s in result.step_seconds]
        run = [round(s * 1e3, 1) for s in result.step_run_seconds]
        rec, lanes = result.recorder, result.recorder.graph.lanes
        spans = sorted((c.start, c.end) for c in rec.completions if lanes[c.lane].kind == "compute")
        busy, top = 0.0, spans[0][0]
        for a, b in spans:
            if b > top:
                busy += b - max(a, top)
                top = b
        print(f"{gib:g} GiB (set-up {time.perf_counter() - began:.1f} s): step ms {step}\n  run ms {run}\n"
              f"  placed MiB {[round(b / 2**20, 1) for b in result.step_bytes_placed]} compiles {result.compiles}; last step: "
              f"{len(rec.completions)} vertices, compute busy {busy * 1e3:.1f} ms of {(spans[-1][1] - spans[0][0]) * 1e3:.1f}", flush=True)
        text = io.StringIO()
        pstats.Stats(first, stream=text).sort_stats("cumulative").print_stats("passes|session|api|arena|reserve|scratch", 25)
        print(f"warm steps (compile {result.compile_seconds:.1f} s):")
        print("\n".join(line[:150] for line in text.getvalue().splitlines()[6:]), flush=True)
        first.dump_stats(f"{out}/decode-warm-{gib:g}gib-{batch}x{prompt}.prof")
        for key in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(key).print_stats(18)
            print("\n".join(line[:150] for line in text.getvalue().splitlines()[6:]), flush=True)
        profile.dump_stats(f"{out}/decode-profile-{gib:g}gib-{batch}x{prompt}.prof")

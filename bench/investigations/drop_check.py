"""Does a session's dropped cuda backend give its device memory back? A GPU check of `Session._drop_backend`.

    source bench/gpu_setup.sh && python3 bench/investigations/drop_check.py [--memory-mib 512] [--json $OUT/drop.json]

A small llama (hidden 1024, 4 layers) in a session at --memory-mib: one generate call, then the arena is
shrunk by a MiB (what a later call with a larger workspace does), which drops the backend. Before and after,
it reads the driver's free memory (cuMemGetInfo) and this process's NVML figure, and whether the dropped
arenas' device arrays are still alive (weak references); for any alive, the chain of referrers that keeps
it (types and attribute names, frames excluded) and numba's pending deallocations. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import types
import weakref
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runtime import process_memory  # noqa: E402
from turnip import Session  # noqa: E402

CONFIG = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "dtype": "float16"}


def free_bytes() -> int:
    from numba import cuda

    return int(cuda.current_context().get_memory_info()[0])


def pending() -> list[int]:
    """Deferred frees waiting in each of the context's queues (its own, its memory manager's)."""
    from numba import cuda

    from runtime.backends.cuda.driver import pending_queues

    return [len(getattr(queue, "_cons", ())) for queue in pending_queues(cuda.current_context())]


def holders(target, roots: dict, depth: int = 10) -> list[str]:
    """Chains of referrers from `target` up to a named root (a module's globals, the session), frames left out."""
    found, queue, seen = [], deque([(target, [])]), {id(target)}
    me = sys._getframe()
    while queue and len(found) < 3:
        obj, path = queue.popleft()
        for ref in gc.get_referrers(obj):
            if id(ref) in seen or ref is queue or ref is path or isinstance(ref, types.FrameType) or ref is me:
                continue
            seen.add(id(ref))
            label = type(ref).__name__
            if isinstance(ref, dict):
                label += str([k for k, v in ref.items() if v is obj][:2])
            elif isinstance(ref, types.FunctionType):
                label += " " + ref.__qualname__
            chain = path + [label]
            if id(ref) in roots:
                found.append(roots[id(ref)] + " <- " + " <- ".join(reversed(chain)))
            elif len(chain) < depth and not isinstance(ref, (str, bytes)):
                queue.append((ref, chain))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-mib", type=int, default=512)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    config = Path("/tmp/drop_check_config.json")
    config.write_text(json.dumps(CONFIG))
    report = {}
    with Session(config=str(config), memory=args.memory_mib << 20, backend="cuda") as session:
        prompts = [np.arange(1, 513) % 32000, np.arange(7, 300) % 32000]
        session.generate(prompts, 2)
        machine = session._machine
        arenas = [weakref.ref(a) for a in machine.devices.arenas] + [weakref.ref(w.buffer) if hasattr(w, "buffer") else None
                                                                     for w in machine.devices.workspaces]
        arenas = [a for a in arenas if a is not None]
        del machine
        gc.collect()
        report["free_before_drop"], report["nvml_before_drop"] = free_bytes(), process_memory.current().now()
        session._shrink_arena(session.arena - (1 << 20))
        gc.collect()
        report["free_after_drop"], report["nvml_after_drop"] = free_bytes(), process_memory.current().now()
        report["returned"] = report["free_after_drop"] - report["free_before_drop"]
        report["alive"] = [a() is not None for a in arenas]
        report["pending_deallocations"] = pending()
        roots = {id(session): "session"} | {id(vars(m)): f"module {n}" for n, m in list(sys.modules.items()) if m is not None}
        report["holders"] = [holders(a(), roots) for a in arenas if a() is not None]
        session.generate(prompts, 2)
        report["free_after_next_call"], report["nvml_after_next_call"] = free_bytes(), process_memory.current().now()
        report["backends_built"] = session.backends_built
    print(json.dumps(report), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

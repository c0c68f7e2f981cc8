"""Warm numba's on-disk cache of the compiler's compiled sweeps: `python -m tools.warm_cache`.

The sweeps (turnip_ir/ancestors.py, last_writer.py, verifier.py and the memory passes) are `@njit(cache=True)`:
compiled once, about 15 s, then loaded from `__pycache__` beside their sources. `make install` runs this
module so that the first user command and the test suite load them instead of paying that compile in a
timed step. It compiles one small random taskgraph under a tight budget, which calls every sweep (numba
compiles per argument types, and the arrays are int64 at every size), then names any compiled function
that is still missing from the cache. It never fails the install: a problem is one line of note, and
exit status 0.

On a machine with a GPU it also warms the cuda backend's kernel cache (runtime/backends/cuda/compat.py,
`cached_kernel`): a one-layer model of LLaMA-7b's widths prefills 8192 tokens (two query blocks, so the
merges with a running partial too) and decodes two tokens, in float16 and in bfloat16, so the first `turnip llama` or `turnip generate` loads the
kernels instead of compiling them (3.5-4.6 s of a cold 7b prefill on the H200). Without a GPU it
does nothing more.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

from numba.core.registry import CPUDispatcher

MODULES = (
    "turnip_ir.ancestors",
    "turnip_ir.last_writer",
    "turnip_ir.verifier",
    "passes.insert_memory_deps",
    "passes.minimize_memory_deps",
)
"""The modules whose `@njit(cache=True)` functions the compiler runs."""


def warm() -> list[str]:
    """Compile a small graph through the whole pipeline; returns the compiled functions still not cached."""
    from passes.insert_offload import minimum_budget
    from passes.pipeline import compile_taskgraph
    from passes.place_devices import place_devices
    from tools.random_graphs import random_taskgraph

    graph = random_taskgraph(0, tasks=60, devices=2, sizes=(8, 16), window=10)
    compile_taskgraph(graph, int(minimum_budget(place_devices(graph)) * 1.2))
    modules = [importlib.import_module(name) for name in MODULES]
    return [f"{module.__name__}.{name}" for module in modules for name, value in vars(module).items()
            if isinstance(value, CPUDispatcher) and not _cached(value)]


def _cached(dispatcher: CPUDispatcher) -> bool:
    """Is the function in numba's on-disk cache? Its index file is there once it has been compiled
    (a function only called from compiled code is cached with its own index, but loads no signature
    into this process when its caller comes from the cache). True when numba does not say."""
    index = getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None), "_index_path", None)
    return index is None or Path(index).exists()


def warm_kernels() -> bool:
    """Compile the cuda kernels a LLaMA prefill and decode use into their disk cache; False without a GPU."""
    from runtime.backends.cuda.compat import gpu_count, simulated

    if simulated() or gpu_count() == 0:
        return False
    from dataclasses import replace

    import numpy as np

    from frontend.workloads import llama
    from turnip import Session

    base = llama.load_config("7b")
    for dtype in ("float16", "bfloat16"):
        config = replace(base, num_hidden_layers=1, dtype=dtype)
        with Session(config=config, memory=8 << 30, backend="cuda") as session:
            session.generate([np.arange(8193) % config.vocab_size], 2)
    return True


def main() -> int:
    start = time.perf_counter()
    try:
        cold = warm()
    except Exception as err:  # a cold cache only costs time later: never fail the install
        print(f"note: numba's cache was not warmed ({type(err).__name__}: {err}); the first compile will take longer")
        return 0
    if cold:
        print(f"note: not cached by the warm-up: {', '.join(cold)}")
    print(f"warmed numba's cache of the compiler's sweeps in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    try:
        if warm_kernels():
            print(f"warmed the cuda kernels' cache in {time.perf_counter() - start:.1f} s")
    except Exception as err:  # as above: the first GPU run compiles them instead
        print(f"note: the cuda kernels' cache was not warmed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

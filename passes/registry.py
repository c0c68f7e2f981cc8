"""The pass registry: pass name -> a factory that imports the pass class lazily.

The CLI calls `all_passes()` and registers each entry; importing a pass module happens only when a
pipeline names it, which keeps `turnip-opt` start-up short.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from xdsl.passes import ModulePass


_PASSES: dict[str, tuple[str, str]] = {
    "turnip-memgraph": ("passes.pipeline", "MemgraphPipelinePass"),
    "turnip-place-devices": ("passes.place_devices", "PlaceDevicesPass"),
    "turnip-insert-offload": ("passes.insert_offload", "InsertOffloadPass"),
    "turnip-insert-memory-deps": ("passes.insert_memory_deps", "InsertMemoryDepsPass"),
    "turnip-minimize-memory-deps": ("passes.minimize_memory_deps", "MinimizeMemoryDepsPass"),
    "turnip-reduce-memory-deps": ("passes.reduce_memory_deps", "ReduceMemoryDepsPass"),
    "turnip-verify-memgraph": ("passes.verify_memgraph", "VerifyMemgraphPass"),
}
"""Pass name -> (module, class): the named pipeline, then its stages in the order it runs them.
docs/passes.md lists them in this order (tools/pass_docs.py)."""


def _load(module: str, cls: str) -> type[ModulePass]:
    return getattr(importlib.import_module(module), cls)


def all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every turnip pass by its kebab-case name, as a factory returning the pass class."""
    return {name: functools.partial(_load, module, cls) for name, (module, cls) in _PASSES.items()}

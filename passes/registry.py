"""The pass registry: pass name -> a factory that imports the pass class lazily.

The CLI calls `all_passes()` and registers each entry; importing a pass module happens only when a
pipeline names it, which keeps `turnip-opt` start-up short.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _place_devices() -> type[ModulePass]:
    from passes.place_devices import PlaceDevicesPass

    return PlaceDevicesPass


def _insert_offload() -> type[ModulePass]:
    from passes.insert_offload import InsertOffloadPass

    return InsertOffloadPass


def _insert_memory_deps() -> type[ModulePass]:
    from passes.insert_memory_deps import InsertMemoryDepsPass

    return InsertMemoryDepsPass


def _minimize_memory_deps() -> type[ModulePass]:
    from passes.minimize_memory_deps import MinimizeMemoryDepsPass

    return MinimizeMemoryDepsPass


def _reduce_memory_deps() -> type[ModulePass]:
    from passes.reduce_memory_deps import ReduceMemoryDepsPass

    return ReduceMemoryDepsPass


def _verify_memgraph() -> type[ModulePass]:
    from passes.verify_memgraph import VerifyMemgraphPass

    return VerifyMemgraphPass


def _memgraph() -> type[ModulePass]:
    from passes.pipeline import MemgraphPipelinePass

    return MemgraphPipelinePass


def all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every turnip pass by its kebab-case name, as a factory returning the pass class."""
    return {
        "turnip-place-devices": _place_devices,
        "turnip-insert-offload": _insert_offload,
        "turnip-insert-memory-deps": _insert_memory_deps,
        "turnip-minimize-memory-deps": _minimize_memory_deps,
        "turnip-reduce-memory-deps": _reduce_memory_deps,
        "turnip-verify-memgraph": _verify_memgraph,
        "turnip-memgraph": _memgraph,
    }

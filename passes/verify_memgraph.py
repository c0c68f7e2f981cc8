"""`turnip-verify-memgraph`: the verifier as a pass; it leaves the module unchanged.

The proof itself is `turnip_ir.verifier.verify_memgraph`: it lives in `turnip_ir`, below the passes,
so that the runtime's `execute()` can verify a plan before running it without importing a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.compilation import Compilation
from passes.compile_stats import timed
from passes.graph_pass import GraphPass, memgraph_of
from turnip_ir.verifier import verify_memgraph


@dataclass(frozen=True)
class VerifyMemgraphPass(GraphPass):
    """Prove a memgraph race-free, acyclic, in bounds, and that its outputs survive.

    Any two nodes that write overlapping bytes (on a GPU or in CPU storage) must be ordered, and every
    reader of the earlier one must happen before the later one, through inputs and memory edges.
    With `taskgraph=FILE` (the taskgraph the memgraph was compiled from, placed as the compiler places
    it), condition (a) is proved too: every data dependency of the taskgraph is present, directly or
    through offload -> reload. Fails with a diagnostic naming the nodes and the location; leaves the
    module unchanged.
    """

    name = "turnip-verify-memgraph"
    reads = ("graph", "source")
    taskgraph: str = ""
    """The taskgraph file the memgraph was compiled from, to prove condition (a) as well; empty: the
    memgraph alone."""

    def run(self, state: Compilation) -> None:
        """The taskgraph of condition (a) is the `taskgraph=` file if given, else `state.source` if any."""
        graph = memgraph_of(state.graph, self.name)
        source = self._taskgraph(graph.devices) if self.taskgraph else state.source
        with timed(state.stats, "verify"):
            verify_memgraph(graph, source)

    def _taskgraph(self, devices: int):
        from passes.place_devices import place_devices
        from turnip_ir.io import load_taskgraph

        return place_devices(load_taskgraph(self.taskgraph), devices)

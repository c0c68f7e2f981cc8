"""`Compilation`, the one state every pass reads and extends: the stage contract of the pipeline.

A compilation starts from a graph and its stats. Each stage (a `GraphPass`, passes/graph_pass.py)
reads some fields and adds or replaces others, and says which in its `reads` and `adds`:

- `graph`: the graph so far, a `TaskGraph` until turnip-insert-offload replaces it with a `MemGraph`;
- `stats`: where every stage records its counts and seconds (passes/compile_stats.py);
- `source`: the placed taskgraph the memgraph was compiled from, added by turnip-insert-offload and
  read by turnip-verify-memgraph to prove condition (a);
- `arrays`: the memgraph as CSR arrays (turnip_ir/memarrays.py), added by the first memory pass that
  needs them and kept in step by the others, so they are built once per memgraph;
- `cost`: the cost model (turnip_ir/cost.py, the H200 defaults unless the caller gives another) that
  turnip-insert-offload's `remat` weighs recomputing against moving with;
- `kept`: where a prepared backend still holds inputs from its last run (task -> (GPU, offset, bytes),
  runtime/residency.py); a plan with inputs=recur starts those inputs there again when the room is free,
  so a session's new plan finds them in place instead of copying them;
- `start_on_gpu`: with inputs=host, the inputs that start on their GPU all the same (while they fit):
  the activations a run is fed from GPU work before it, where only the weights live in host memory.

A stage that replaces the graph calls `replace_graph`, which drops the arrays of the old one.
`compile_taskgraph` (passes/pipeline.py) and `turnip-opt` run their stages on one `Compilation`, in
order, as xDSL's `PassPipeline` runs `ModulePass`es on one module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from passes.compile_stats import CompileStats
from turnip_ir.cost import CostModel
from turnip_ir.memarrays import MemArrays
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

@dataclass
class Compilation:
    """The state of one compilation; stages read it and extend it in place."""

    graph: TaskGraph | MemGraph
    stats: CompileStats = field(default_factory=CompileStats)
    source: TaskGraph | None = None
    arrays: MemArrays | None = None
    cost: CostModel = field(default_factory=CostModel)
    kept: dict = field(default_factory=dict)
    start_on_gpu: frozenset[str] = frozenset()

    def replace_graph(self, graph: TaskGraph | MemGraph) -> None:
        """Make `graph` the graph so far; the arrays of the old one no longer describe it."""
        self.graph = graph
        self.arrays = None

    def run(self, stage) -> None:
        """Run `stage` (a `GraphPass`) on this state; it must have set every field it `adds`."""
        stage.run(self)
        missing = [name for name in stage.adds if getattr(self, name) is None]
        assert not missing, f"{stage.name} did not add {', '.join(missing)}"

    def memarrays(self) -> MemArrays:
        """The memgraph's arrays, built on first use and kept in `arrays` for the stages after."""
        if self.arrays is None:
            self.arrays = MemArrays.build(self.graph.nodes)
        return self.arrays

"""The frontend: whole-tensor ops, a partition spec per op and a placement, lowered into a taskgraph.

A user writes a model as ops on whole tensors (`Program.einsum`, `Program.map` for elementwise and
norm kernels, `Program.attention` for blocked causal attention) and says, per op, how each index is cut
into blocks (`partition`) and which GPU runs each block (`placement`). Each op is lowered at once: one
kernel task per block, a move for each operand block that lives on another GPU (once per GPU), and a
tree of adds where a contracted index is cut. The result is an ordinary `TaskGraph`; nothing here
compiles or runs it. `Program.feed` cuts whole input arrays into the blocks' inputs and
`Program.gather` puts output blocks back together, so a workload's float64 forward pass works on whole tensors.
A `Program` records its ops on a tape; `frontend.autodiff.grad` appends their backward pass (docs/training.md).
"""

from frontend.partition import split_block, split_count
from frontend.placement import LoadBalanced, Site, follow, given, on, round_robin, strategy
from frontend.program import Blocked, Program

__all__ = [
    "Blocked",
    "LoadBalanced",
    "Program",
    "Site",
    "follow",
    "given",
    "on",
    "round_robin",
    "split_block",
    "split_count",
    "strategy",
]

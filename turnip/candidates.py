"""What the llama prefill's plan search chooses among: the candidates (layer order, token block, query group,
schedule: `DIMENSIONS`), what a prefill graph is built from beside them (`LlamaPrefill`) and what its plans
are for (`PlanTarget`: the budget, the backend and its attention provider, or a session's fixed arena).
The search is turnip/search.py's, its entry point turnip/choose.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from frontend.workloads import llama
from passes.schedules import SCHEDULES
from runtime import arena_budget
from turnip_ir.errors import BudgetError
from turnip_ir.units import format_size

DIMENSIONS = ("layer_order", "block", "query_group", "schedule")
"""What the search chooses, in the order it ranks them."""
BLOCKS = (1024, 2048, 4096, 8192)
"""The token blocks ranked, each clamped to the token count."""
QUERY_GROUPS = (1, 2, 4, 8)
"""The query groups ranked, those up to the number of token blocks."""

def block_candidates(tokens: int) -> list[int]:
    """`BLOCKS` clamped to `tokens`; below 4096 tokens also T/4 and T/2 (small models' blocks)."""
    small = {max(1, tokens // 4), max(1, tokens // 2)} if tokens < 4096 else set()
    return sorted({min(block, tokens) for block in BLOCKS} | small)


@dataclass(frozen=True)
class Candidate:
    """One plan the search can choose: how the graph is built and the schedule it is compiled under."""

    layer_order: str
    block: int
    query_group: int
    schedule: str

    def describe(self) -> str:
        return (f"layers in {self.layer_order}, blocks of {self.block}, query groups of {self.query_group}, "
                f"schedule {self.schedule}")


@dataclass(frozen=True)
class LlamaPrefill:
    """What a prefill graph is built from beside the candidate (`llama.build_llama`'s other arguments)."""

    config: llama.LlamaConfig
    tokens: int
    gpus: int = 1
    placement: str = "sequence"
    kv_outputs: bool = False
    sequences: tuple[int, ...] | None = None
    """Packed prompts' lengths (a session's prefill); None: one sequence of `tokens`."""
    hidden: bool = True
    """False: a KV cache's prefill, without the final hidden states (`build_llama`'s `hidden`)."""

    def build(self, candidate: Candidate) -> llama.LlamaGraph:
        return llama.build_llama(self.config, self.tokens, candidate.block, self.gpus, self.placement, self.kv_outputs,
                                 candidate.layer_order, candidate.query_group, self.sequences, self.hidden)

    def tasks(self, candidate: Candidate) -> int:
        """About how many tasks `build(candidate)` makes, cheaply: one layer's graph built, times the layers."""
        one = replace(self, config=replace(self.config, num_hidden_layers=1), hidden=True)  # a lone last layer is kv-only
        return self.config.num_hidden_layers * len(one.build(candidate).graph)

    def start(self, given: Mapping[str, object]) -> Candidate:
        """The candidate the search starts from: `given`'s values, the frontend's defaults for the rest and
        for those given as None, the block clamped to the token count."""
        values = {name: value for name, value in given.items() if value not in ("auto", None)}
        block = values.get("block", llama.default_block(self.config, self.tokens))
        return Candidate(values.get("layer_order", llama.LAYER_ORDERS[0]), min(block, self.tokens),
                         values.get("query_group", 1), values.get("schedule", SCHEDULES[0]))

    def candidates(self, dimension: str, around: Candidate) -> list[Candidate]:
        """`around` with `dimension` set to each value the search ranks, in the order ties are broken."""
        if dimension == "layer_order":
            values = list(llama.LAYER_ORDERS)
        elif dimension == "block":
            values = block_candidates(self.tokens)
        elif dimension == "query_group":
            values = [group for group in QUERY_GROUPS if group <= -(-self.tokens // around.block)]
        else:
            values = list(SCHEDULES)
        return [replace(around, **{dimension: value}) for value in values]

    def key(self) -> dict:
        return {"model": asdict(self.config), "tokens": self.tokens, "gpus": self.gpus, "placement": self.placement,
                "kv_outputs": self.kv_outputs, "sequences": None if self.sequences is None else list(self.sequences),
                "hidden": self.hidden}


@dataclass(frozen=True)
class PlanTarget:
    """What the plans are for: `memory` bytes per GPU in all, on `backend` (its attention provider for the
    cuda backend's workspace) with `streams` compute streams, or a fixed `arena` for every graph (a session's,
    whose backend is prepared for it: a graph fits only where its workspace, with the page tables of
    `pinned` host bytes, leaves that much of `memory`)."""

    memory: int
    backend: str = "sim"
    attention: str = "auto"
    streams: int = 2
    arena: int | None = None
    pinned: int | None = None
    """Page-locked host bytes the cuda workspace's page tables map (`runtime.arena_budget`; None: its estimate)."""

    def arena_of(self, graph) -> int:
        """The bytes the planner may give tensors (`runtime.arena_budget`); a BudgetError when none are left,
        or, with a fixed `arena`, when `graph`'s workspace leaves less than it."""
        room = arena_budget(graph, self.memory, self.backend, self.streams, self.attention, self.pinned)
        if self.arena is None:
            return room
        if room < self.arena:
            raise BudgetError(f"its cuda workspace leaves {format_size(room)} of the {format_size(self.memory)} budget, less than "
                              f"the arena of {format_size(self.arena)} the session's backend is prepared for")
        return self.arena

    def resolved(self) -> PlanTarget:
        """The cuda backend's `auto` resolved to its first candidate (whose workspace `auto` plans with) here,
        before any fork: a forked process does not ask the GPU's driver."""
        if self.backend != "cuda" or self.attention != "auto":
            return self
        from runtime.backends.cuda import CudaBackend

        return replace(self, attention=CudaBackend.attention_candidates("auto")[0])

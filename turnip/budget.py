"""The memory a whole command needs, for the budget error it gives (issue 45, 47).

The planner refuses a graph whose largest operation does not fit its arena, and says what arena would
do; but a command compiles several graphs (a generate: a prefill per prompt length and a decode step
per cache shape), and on the cuda backend the arena is the budget less a workspace (per-lane scratch,
libraries, the page tables of pinned host memory: `runtime.arena_budget`). So a budget error a user
sees names the budget to pass for the whole command: the largest working set of any of its graphs
(`passes.insert_offload.minimum_budget`) plus the largest workspace the backend holds back beside any
of their arenas (none on the cpu and sim backends). Worked out only once a compile has failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from passes.insert_offload import minimum_budget
from runtime import arena_budget
from turnip_ir.errors import BudgetError
from turnip_ir.limits import INT_LIMIT
from turnip_ir.taskgraph import TaskGraph
from turnip_ir.units import format_size

_LARGE = INT_LIMIT - 1
"""A budget every workspace fits in: `arena_budget` at it is this less the workspace."""


def memory_needed(graphs: Iterable[TaskGraph], backend: str, attention: str = "auto", pinned: int | None = None) -> tuple[int, int]:
    """(the smallest per-GPU budget under which every graph of `graphs` compiles on `backend`, the
    largest workspace in it); `pinned`: the page-locked host bytes whose page tables the workspace holds
    (a session's estimate for the call; None: each graph's own, `runtime.arena_budget`)."""
    floor, workspace = 0, 0
    for graph in graphs:
        floor = max(floor, minimum_budget(graph))
        workspace = max(workspace, _LARGE - arena_budget(graph, _LARGE, backend, attention=attention, pinned=pinned))
    return floor + workspace, workspace


def too_small(error: BudgetError, memory: int, graphs: Iterable[TaskGraph], backend: str, what: str, attention: str = "auto",
              pinned: int | None = None) -> BudgetError:
    """`error` (a graph of `what` did not fit under `memory`) as the budget `what` needs in all, on one line;
    `error` itself when that budget is no larger than `memory` (the refusal was not the budget's size)."""
    needed, workspace = memory_needed(graphs, backend, attention, pinned)
    if needed <= memory:
        return error
    held = f", the {format_size(workspace)} the cuda backend holds back beside its arena included" if workspace else ""
    return BudgetError(f"a budget of {memory} bytes ({format_size(memory)}) per GPU is too small for {what}: it needs "
                       f"{needed} bytes ({format_size(needed)}) or more (--memory {needed}){held}")


@contextmanager
def naming_the_budget(memory: int, graphs: Callable[[], Iterable[TaskGraph]], backend: str, what: str,
                      attention: str = "auto", pinned: Callable[[], int | None] | None = None) -> Iterator[None]:
    """A budget error inside as the budget `what` needs in all (`too_small`); `graphs()` lists its graphs
    and `pinned()` the page-locked bytes the arena was sized for (both asked only once an error came)."""
    try:
        yield
    except BudgetError as err:
        raise too_small(err, memory, graphs(), backend, what, attention, pinned() if pinned else None) from None

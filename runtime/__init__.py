"""The Turnip runtime: executes a memgraph with an event-driven, nondeterministic executor.

`execute(memgraph, backend="cpu", order="nondet", ...)` is the entry point; see runtime/executor.py for
the design (states, resources, invariants, policies) and docs/runtime.md for a guide.
"""

from runtime.api import RunResult, arena_budget, execute, sim_makespan

__all__ = ["RunResult", "arena_budget", "execute", "sim_makespan"]

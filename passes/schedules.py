"""Schedules the offload planner can simulate: `given`, `dfs` and `memory`.

A schedule is the compile-time order of one simulated run (the run-time dispatch order is the
runtime's policy, `runtime/policies.py`, a separate choice). Every schedule lists the non-input tasks
of a `TaskView`, each after its operands.
- `given`: the taskgraph's own order.
- `dfs`: a depth-first post-order from the outputs, which finishes one branch before starting the next
  and so keeps few tensors live.
- `memory`: greedy; among the ready tasks run the one whose output size minus the operand bytes it frees
  is smallest. Keys only fall as readers finish, so a task is pushed again when its key drops.
"""

from __future__ import annotations

import heapq

from passes.compact import TaskView
from turnip_ir.errors import InputError

SCHEDULES = ("given", "dfs", "memory")


def scheduled_tasks(view: TaskView, schedule: str) -> list[int]:
    """The positions of the non-input tasks of `view` in the named schedule."""
    if schedule == "given":
        return [i for i, op in enumerate(view.ops) if op != "input"]
    if schedule == "dfs":
        return _dfs(view)
    if schedule == "memory":
        return _memory(view)
    raise InputError(f"unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")


def _dfs(view: TaskView) -> list[int]:
    done = [False] * len(view)
    result: list[int] = []
    sinks = [i for i in range(len(view)) if not view.readers[i]]
    for root in list(dict.fromkeys(view.outputs + sinks)):
        if done[root]:
            continue
        stack = [(root, iter(view.inputs[root]))]
        done[root] = True
        while stack:
            node, operands = stack[-1]
            child = next(operands, None)
            if child is None:
                stack.pop()
                if view.ops[node] != "input":
                    result.append(node)
            elif not done[child]:
                done[child] = True
                stack.append((child, iter(view.inputs[child])))
    return result


def _memory(view: TaskView) -> list[int]:
    waiting = [len(set(ops)) for ops in view.inputs]
    left = [len(r) for r in view.readers]
    output = set(view.outputs)

    def key(i: int) -> int:
        freed = sum(view.nbytes[o] for o in set(view.inputs[i]) if left[o] == 1 and o not in output)
        return view.nbytes[i] - freed

    heap = [(key(i), i) for i, ops in enumerate(view.inputs) if not ops and view.ops[i] != "input"]
    heapq.heapify(heap)
    done = [False] * len(view)
    for i, op in enumerate(view.ops):
        if op == "input":
            done[i] = True
            _release(view, i, waiting, heap, key, done)
    result: list[int] = []
    while heap:
        k, i = heapq.heappop(heap)
        if done[i] or k != key(i):
            continue
        done[i] = True
        result.append(i)
        for o in set(view.inputs[i]):
            left[o] -= 1
            if left[o] == 1:
                last = next(r for r in view.readers[o] if not done[r])
                if waiting[last] == 0:
                    heapq.heappush(heap, (key(last), last))
        _release(view, i, waiting, heap, key, done)
    return result


def _release(view: TaskView, i: int, waiting: list[int], heap: list, key, done: list[bool]) -> None:
    """Count `i` as finished for its readers and push those that became ready."""
    for r in view.readers[i]:
        waiting[r] -= 1
        if waiting[r] == 0 and not done[r]:
            heapq.heappush(heap, (key(r), r))

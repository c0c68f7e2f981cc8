"""A float64 numpy evaluation of a taskgraph, with no memory plan: what a run of a plan should give.

It runs the same kernel implementations as the cpu backend, on fresh float64 arrays, in the
taskgraph's order, so it checks a plan and a schedule (examples/demo.py uses it), not the kernels.
Tests compare against tests/kernel_formulas.py, which writes every kernel again from its formula.
"""

from __future__ import annotations

import numpy as np

from runtime.kernels_numpy import NUMPY_KERNELS
from turnip_ir.errors import InputError
from turnip_ir.taskgraph import TaskGraph


def evaluate(graph: TaskGraph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of `graph` (its effective outputs), in float64, by taskgraph id."""
    values: dict[str, np.ndarray] = {}
    for node in graph.nodes.values():
        if node.op == "input":
            if node.id not in inputs:
                raise InputError(f"input '{node.id}': no value given")
            values[node.id] = np.asarray(inputs[node.id], dtype=np.float64)
        elif node.op == "move":
            values[node.id] = values[node.inputs[0]]
        else:
            out = np.empty(node.shape, dtype=np.float64)
            NUMPY_KERNELS[node.op]([values[i] for i in node.inputs], out, node.attrs)
            values[node.id] = out
    return {task: values[task] for task in graph.effective_outputs()}

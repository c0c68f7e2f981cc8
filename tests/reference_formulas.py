"""The tests' ground truth: every kernel written from its formula, in float64, independently of the runtime.

`runtime/kernels_numpy.py` (what the cpu backend runs) builds results in place with `out=` and ufunc
tricks; these are the textbook formulas, written differently on purpose so that a test comparing the two
can see a kernel bug: matmul as a sum of products, einsum by indexing one grid of all its letters,
silu through tanh, softmax and rmsnorm from sums. `FORMULAS` maps a kernel name to `f(xs, attrs)`;
`evaluate(taskgraph, inputs)` runs a taskgraph on fresh float64 arrays, with no memory plan.
"""

from __future__ import annotations

import math

import numpy as np

from turnip_ir.taskgraph import TaskGraph


def _matmul(xs, attrs):
    a, b = xs
    return (a[:, :, None] * b[None, :, :]).sum(axis=1)


def _einsum(xs, attrs):
    """Index a grid of every letter's range with each operand's letters, multiply, sum the letters dropped."""
    inputs, output = attrs["equation"].replace(" ", "").split("->")
    operands = inputs.split(",")
    sizes: dict[str, int] = {}
    for letters, x in zip(operands, xs):
        sizes.update(zip(letters, x.shape))
    letters = sorted(sizes)
    grid = np.ix_(*[np.arange(sizes[letter]) for letter in letters]) if letters else ()
    product = np.ones([sizes[letter] for letter in letters])
    for subscripts, x in zip(operands, xs):
        product = product * x[tuple(grid[letters.index(letter)] for letter in subscripts)]
    dropped = tuple(i for i, letter in enumerate(letters) if letter not in output)
    kept = [letter for letter in letters if letter in output]
    return product.sum(axis=dropped).transpose([kept.index(letter) for letter in output])


def _gelu(xs, attrs):
    x = xs[0]
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _silu(xs, attrs):
    x = xs[0]
    return x * 0.5 * (1.0 + np.tanh(x / 2.0))  # x * sigmoid(x), with sigmoid(x) = (1 + tanh(x/2)) / 2


def _softmax(xs, attrs):
    x = xs[0]
    top = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(x - top) if x.size else x.copy()
    return e / e.sum(axis=-1, keepdims=True)


def _rmsnorm(xs, attrs):
    x = xs[0]
    n = max(x.shape[-1], 1)
    out = x / np.sqrt((x * x).sum(axis=-1, keepdims=True) / n + attrs.get("eps", 1e-6))
    return out * xs[1] if len(xs) == 2 else out


FORMULAS = {
    "matmul": _matmul,
    "einsum": _einsum,
    "add": lambda xs, attrs: xs[0] + xs[1],
    "sub": lambda xs, attrs: xs[0] - xs[1],
    "mul": lambda xs, attrs: xs[0] * xs[1],
    "relu": lambda xs, attrs: np.where(xs[0] > 0, xs[0], 0.0),
    "gelu": _gelu,
    "silu": _silu,
    "exp": lambda xs, attrs: np.exp(xs[0]),
    "scale": lambda xs, attrs: xs[0] * float(attrs["factor"]),
    "softmax": _softmax,
    "rmsnorm": _rmsnorm,
}


def apply(kernel: str, xs: list[np.ndarray], attrs: dict) -> np.ndarray:
    """One kernel's formula on float64 copies of `xs`."""
    return np.asarray(FORMULAS[kernel]([np.asarray(x, dtype=np.float64) for x in xs], attrs), dtype=np.float64)


def evaluate(graph: TaskGraph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of `graph` (its effective outputs) in float64, by taskgraph id."""
    values: dict[str, np.ndarray] = {}
    for node in graph.nodes.values():
        if node.op == "input":
            values[node.id] = np.asarray(inputs[node.id], dtype=np.float64)
        elif node.op == "move":
            values[node.id] = values[node.inputs[0]]
        else:
            values[node.id] = apply(node.op, [values[i] for i in node.inputs], node.attrs)
        assert values[node.id].shape == tuple(node.shape), f"{node.id}: formula gives {values[node.id].shape}, taskgraph says {node.shape}"
    return {task: values[task] for task in graph.effective_outputs()}

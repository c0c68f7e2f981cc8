"""The blocked cross-entropy loss over the vocabulary, and its backward (frontend/autodiff.py calls it).

logits [N, V] are cut into token blocks and vocabulary blocks, so the LM head never has to fit one GPU.
Per token block i, a chain over the vocabulary blocks carries each token's running statistics, a
[t, 3] partial (float32; float64 for float64 logits): the max logit m, the sum of exp(logit - m) s, and
the label's logit z (0 until the block that holds the label):
    xent(logits[i, 0], labels[i], start=0) -> xent(logits[i, 1], labels[i], prev, start=V0) -> ...
Then `xent_loss` gives the block's (sum over its tokens of m + log s - z, count of tokens), leaving out
labels of -100, and a tree of adds sums the blocks' pairs: the result `total` [2]. The loss is the mean,
total[0] / total[1] (`mean_loss`), transformers' causal-LM loss when labels are the shifted ids.
Labels are a float32 input [N] (tensor dtypes are float only; ids are exact in float32 up to 2^24).

Backward, seeded by d(mean loss) = factor (a number, or a [1] tensor such as a loss scale fed as data,
so one plan serves every scale): for every (token block, vocabulary block) one `xent_grad` task gives
factor / total[1] * (softmax - onehot) from the logits block, the labels, the block's final statistics
and `total`, in the logits' dtype; rows whose label is -100 get zeros. The chain's links run
on the GPU of their token block's first logits block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from frontend.partition import starts
from turnip_ir.errors import InputError
from turnip_ir.kernels import partial_dtype

if TYPE_CHECKING:
    from frontend.program import Blocked, Program, Step

IGNORE = -100
"""A label that does not count (transformers' ignore_index)."""


def cross_entropy(prog: Program, logits: Blocked, labels: Blocked, name: str) -> Blocked:
    """`total` [2], one block named `name`: the summed loss of the tokens and their count (module docstring)."""
    _check(logits, labels, name)
    tokens = logits.splits[0]
    dtype = partial_dtype(logits.dtype)
    stats = prog._new(f"{name}.stats", (logits.shape[0], 3), dtype, (tokens, (3,)))
    columns = starts(logits.splits[1])
    parts = []
    for i in range(len(tokens)):
        prog.at({"t": i})
        gpu = _gpu(logits, i)
        label = prog._read(labels, (i,), gpu)
        prev = None
        for c, start in enumerate(columns):
            block = prog._read(logits, (i, c), gpu)
            last_id = stats.block_id((i, 0))
            task_id = last_id if c == len(columns) - 1 else f"{last_id}.v{c}"
            prev = prog.graph.kernel("xent", block, label, *([prev] if prev else []), device=gpu, id=task_id, start=start)
        stats.blocks[(i, 0)] = prev
        parts.append(prog.graph.kernel("xent_loss", prev, label, device=gpu, id=name if len(tokens) == 1 else f"{name}.p{i}"))
    total = prog._new(name, (2,), dtype, ((2,),))
    total.blocks[(0,)] = prog._sum(parts, name)
    prog.record("cross_entropy", total, (logits, labels), stats=stats)
    return total


def lower_grad(prog: Program, step: Step, seed: float | Blocked, name: str) -> Blocked:
    """d(seed * mean loss) / d logits, cut like the logits (module docstring); `seed` is a number (the
    `factor` attribute) or a tensor [1] that every task reads (a loss scale fed as data)."""
    logits, labels = step.operands
    stats, total = step.attrs["stats"], step.result
    grad = prog._new(name, logits.shape, logits.dtype, logits.splits)
    columns = starts(logits.splits[1])
    factor, scale = (1.0, [(seed, (0,))]) if not isinstance(seed, float) else (seed, [])
    for i, c in sorted(logits.blocks):
        prog.at({"t": i})
        gpu = _gpu(logits, i)
        reads = ((logits, (i, c)), (labels, (i,)), (stats, (i, 0)), (total, (0,)), *scale)
        operands = [prog._read(x, key, gpu) for x, key in reads]
        grad.blocks[(i, c)] = prog.graph.kernel("xent_grad", *operands, device=gpu, id=grad.block_id((i, c)),
                                                start=columns[c], factor=factor)
    return grad


def mean_loss(total: np.ndarray) -> float:
    """The mean loss from `total` (NaN when every label is ignored, as transformers gives)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.float64(total[0]) / np.float64(total[1]))


def _gpu(logits: Blocked, i: int) -> int:
    device = logits.device((i, 0))
    return 0 if device is None else device


def _check(logits: Blocked, labels: Blocked, name: str) -> None:
    if len(logits.shape) != 2 or labels.shape != logits.shape[:1]:
        raise InputError(f"cross_entropy '{name}': logits {list(logits.shape)} must be [tokens, vocab] and labels {list(labels.shape)} [tokens]")
    if labels.dtype != "float32":
        raise InputError(f"cross_entropy '{name}': labels must be float32 token ids, got {labels.dtype}")
    if labels.splits[0] != logits.splits[0]:
        raise InputError(f"cross_entropy '{name}': labels are cut {list(labels.splits[0])}, the logits' tokens {list(logits.splits[0])}")

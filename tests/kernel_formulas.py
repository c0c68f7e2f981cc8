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

from tests import formulas_llama as llama
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


def _attention(xs, attrs):
    """One (query block, key block) step from its definition: with the previous keys' normalised output
    o_p and log-sum-exp l_p, out = (o_p e^(l_p) + sum_j e^(s_j) v_j) / (e^(l_p) + sum_j e^(s_j)) per head,
    s_j = scale q.k_j (masked to j <= i on a causal block, to keys inside a sliding `window`, and to keys of
    query i's own sequence where `segments` packs several); the packed partial appends log of the denominator."""
    q, k, v = xs[:3]
    prev = xs[3] if len(xs) > 3 else None
    heads, kv_heads = int(attrs["heads"]), int(attrs["kv_heads"])
    width = q.shape[1] // heads
    scale = attrs.get("softmax_scale")
    scale = 1.0 / math.sqrt(width) if scale is None else float(scale)
    outs, lses = [], []
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = q[:, h * width : (h + 1) * width] @ k[:, g * width : (g + 1) * width].T * scale
        if attrs.get("causal", False):
            scores = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], scores, -np.inf)
        if "segments" in attrs:  # packed sequences: a key of another sequence is masked like a future one
            sequence = _sequence_of_rows(attrs["segments"], q.shape[0])
            scores = np.where(sequence[None, :] == sequence[:, None], scores, -np.inf)
        if "window" in attrs:  # transformers' sliding window: key position > query position - window
            q_pos, k_pos = np.arange(q.shape[0])[:, None], attrs.get("offset", 0) + np.arange(k.shape[0])[None, :]
            scores = np.where(k_pos > q_pos - attrs["window"], scores, -np.inf)
        top = scores.max(axis=1, initial=-np.inf)
        if prev is not None:
            top = np.maximum(top, prev[:, heads * width + h])
        top = np.where(np.isfinite(top), top, 0.0)  # a row that sees no key yet: zeros, log-sum-exp -inf
        weights = np.exp(scores - top[:, None])
        numerator, denominator = weights @ v[:, g * width : (g + 1) * width], weights.sum(axis=1)
        if prev is not None:
            carried = np.exp(prev[:, heads * width + h] - top)
            numerator = numerator + prev[:, h * width : (h + 1) * width] * carried[:, None]
            denominator = denominator + carried
        with np.errstate(divide="ignore", invalid="ignore"):
            outs.append(np.where(denominator[:, None] > 0, numerator / denominator[:, None], 0.0))
            lses.append(top + np.log(denominator))
    out = np.concatenate(outs, axis=1)
    return out if attrs.get("final", True) else np.concatenate([out, np.stack(lses, axis=1)], axis=1)


def _sequence_of_rows(segments: str, rows: int) -> np.ndarray:
    """Which sequence each row of a packed block belongs to: the count of sequence starts at or before it."""
    starts = np.array([int(x) for x in segments.split(",")])
    return (np.arange(rows)[:, None] >= starts[None, :]).sum(axis=1)


def _decode_attention(xs, attrs):
    """Row b is sequence b's new token, at position lengths[b]: the attention formula above over the key
    rows it sees, by masking the others' scores (key row r sits at position start + r, or at the token's
    own position when `own`; it is seen when before the token, or the token itself, and inside `window`)."""
    q, k, v, lengths = xs[:4]
    prev = xs[4] if len(xs) > 4 else None
    rows = []
    for b in range(q.shape[0]):
        keys, values = (k[b : b + 1], v[b : b + 1]) if attrs.get("own", False) else (k[:, b], v[:, b])
        position = lengths[b]
        key_positions = np.full(len(keys), position) if attrs.get("own", False) else attrs.get("start", 0) + np.arange(len(keys))
        seen = (key_positions <= position) & ((key_positions < position) | attrs.get("own", False))
        if "window" in attrs:
            seen &= position - key_positions < attrs["window"]
        one = {name: value for name, value in attrs.items() if name in ("heads", "kv_heads", "softmax_scale", "final")}
        part = _attention([q[b : b + 1], keys[seen], values[seen], *([] if prev is None else [prev[b : b + 1]])], one)
        rows.append(part)
    return np.concatenate(rows, axis=0)


def _rmsnorm_grad(xs, attrs):
    """dx = J^T dy with the Jacobian of one row written out: dy_j/dx_i = w_j (delta_ij r - x_j x_i r^3 / n)."""
    x, dy = xs[0], xs[-1]
    w = xs[1] if len(xs) == 3 else np.ones(x.shape[-1])
    n = x.shape[-1]
    rows_x, rows_dy = x.reshape(-1, n), dy.reshape(-1, n)
    out = np.empty_like(rows_x)
    for row, (xr, gr) in enumerate(zip(rows_x, rows_dy)):
        r = 1.0 / math.sqrt(sum(xr * xr) / n + attrs.get("eps", 1e-6))
        jacobian = w[:, None] * (np.eye(n) * r - np.outer(xr, xr) * r**3 / n)  # [j, i]
        out[row] = jacobian.T @ gr
    return out.reshape(x.shape)


def _swiglu_grad(xs, attrs):
    gate, up, dy = xs
    sigmoid = 0.5 * (1.0 + np.tanh(gate / 2.0))
    return dy * up * (sigmoid + gate * sigmoid * (1.0 - sigmoid))  # d/dg of g sigmoid(g), times up


def _attention_grad(xs, attrs):
    """Head by head from the softmax's Jacobian: p = exp(s - lse) over the keys this block shows, D = dO . O,
    dS = p (dO v^T - D); dq = scale dS k, dk = scale dS^T q, dv = p^T dO, each kv head summing its query heads."""
    q, k, v, packed, d_out = xs[:5]
    heads, kv_heads = int(attrs["heads"]), int(attrs["kv_heads"])
    width = q.shape[1] // heads
    scale = attrs.get("softmax_scale")
    scale = 1.0 / math.sqrt(width) if scale is None else float(scale)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    q_pos, k_pos = np.arange(q.shape[0])[:, None], attrs.get("offset", 0) + np.arange(k.shape[0])[None, :]
    seen = np.ones((q.shape[0], k.shape[0]), dtype=bool)
    if attrs.get("causal", False):
        seen &= k_pos <= q_pos
    if "window" in attrs:
        seen &= k_pos > q_pos - attrs["window"]
    for h in range(heads):
        g = h // (heads // kv_heads)
        cols, kv_cols = slice(h * width, (h + 1) * width), slice(g * width, (g + 1) * width)
        lse = packed[:, heads * width + h]
        p = np.exp(np.where(seen, q[:, cols] @ k[:, kv_cols].T * scale - lse[:, None], -np.inf))
        delta = (d_out[:, cols] * packed[:, cols]).sum(axis=1)
        ds = p * (d_out[:, cols] @ v[:, kv_cols].T - delta[:, None])
        dq[:, cols] = scale * ds @ k[:, kv_cols]
        dk[:, kv_cols] += scale * ds.T @ q[:, cols]
        dv[:, kv_cols] += p.T @ d_out[:, cols]
    grad = dq if attrs["wrt"] == "q" else np.concatenate([dk, dv])
    return grad + xs[5] if len(xs) == 6 else grad


def _xent(xs, attrs):
    """Row by row: the block's max, sum of exp and label logit, merged with prev's as a log-sum-exp would be."""
    logits, labels = xs[0], xs[1]
    out = np.zeros((logits.shape[0], 3))
    for t, row in enumerate(logits):
        label = int(labels[t]) - attrs.get("start", 0)
        m, s, z = (row.max(), np.exp(row - row.max()).sum(), row[label] if 0 <= label < len(row) else 0.0)
        if len(xs) == 3:
            m0, s0, z0 = xs[2][t]
            top = max(m, m0)
            m, s, z = top, s * math.exp(m - top) + s0 * math.exp(m0 - top), z + z0
        out[t] = m, s, z
    return out


def _xent_loss(xs, attrs):
    stats, labels = xs
    losses = [math.log(s) + m - z for (m, s, z), label in zip(stats, labels) if label != -100]
    return np.array([sum(losses), len(losses)])


def _xent_grad(xs, attrs):
    logits, labels, stats, total = xs[:4]
    grad = np.zeros(logits.shape)
    for t, row in enumerate(logits):
        if labels[t] == -100:
            continue
        m, s, _ = stats[t]
        grad[t] = np.exp(row - m) / s
        label = int(labels[t]) - attrs.get("start", 0)
        if 0 <= label < len(row):
            grad[t, label] -= 1.0
    return grad * attrs.get("factor", 1.0) * (xs[4][0] if len(xs) == 5 else 1.0) / total[1]


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
    "rope": lambda xs, attrs: llama.rope(*xs),
    "swiglu": lambda xs, attrs: llama.swiglu(*xs),
    "attention": _attention,
    "decode_attention": _decode_attention,
    "rows": lambda xs, attrs: np.array([xs[0][i] for i in range(attrs["start"], attrs["stop"])]).reshape(
        (attrs["stop"] - attrs["start"], *xs[0].shape[1:])
    ),
    "concat": lambda xs, attrs: np.array([row for x in xs for row in x]).reshape((sum(len(x) for x in xs), *xs[0].shape[1:])),
    "cast": lambda xs, attrs: xs[0],
    "rmsnorm_grad": _rmsnorm_grad,
    "swiglu_grad": _swiglu_grad,
    "attention_unpack": lambda xs, attrs: xs[0][:, : xs[0].shape[1] - int(attrs["heads"])],
    "attention_grad": _attention_grad,
    "xent": _xent,
    "xent_loss": _xent_loss,
    "xent_grad": _xent_grad,
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

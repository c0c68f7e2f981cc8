"""numpy implementations of every kernel in the kernel table, writing into a preallocated output.

Each function is `impl(inputs, out, attrs)`: `out` is a view into a GPU arena (or a fresh float64 array
for the reference), so results go straight to their planned location with `out=`. softmax and rmsnorm
allocate one small temporary of the reduced shape (a row max or a row mean); elementwise kernels work in
place in `out`. rope allocates half-width products, and attention the scores of `QUERY_ROWS` query rows
at a time, [heads, rows, keys] in float32 (float64 for float64 inputs), as a GPU kernel keeps its tile in
registers. The training kernels (at the end) work in float32 temporaries of their block (float64 for
float64 operands): attention_grad its probabilities and their gradient [heads, tq, tk], the cross-entropy
kernels their block of logits.

Matrix products (matmul, an einsum that is one matrix product, `MatmulForm`, and attention's two) go to
BLAS through runtime/blas.py's `product`: one at a time in the process, a large one cut over the threads
the cpu backend gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from runtime.blas import product
from turnip_ir.kernels import KERNELS, parse_equation, segment_rows, softmax_scale

KernelImpl = Callable[[list[np.ndarray], np.ndarray, dict], None]


def _matmul(xs, out, attrs):
    if out.dtype == np.float16:
        out[...] = product(*_float32(xs))
        return
    product(xs[0], xs[1], out=out)


def _einsum(xs, out, attrs):
    """A matmul-shaped einsum (`MatmulForm`) goes to BLAS; any other to numpy's einsum."""
    form = matmul_form(attrs["equation"]) if len(xs) == 2 else None
    if form is not None:
        form.run(*xs, out)
    elif out.dtype == np.float16:
        out[...] = np.einsum(attrs["equation"], *_float32(xs), optimize=True)
    else:
        np.einsum(attrs["equation"], *xs, out=out)


@dataclass(frozen=True)
class MatmulForm:
    """A two-operand einsum as one (batched) matrix product: the letters in both operands and the output
    are batch letters, those in both operands only are contracted, the rest (each in one operand and the
    output) are the rows and columns. `run` transposes the operands to [batch, rows, contracted] and
    [batch, contracted, columns] (views; numpy's BLAS takes a transposed 2-D view as it is, so
    'ti,oi->to' is x @ w.T with no copy), merges each group into one axis (a copy only where the axes of
    a group are not adjacent in memory), calls `product`, and writes the product into `out` in the
    output's letter order (straight into `out` when that order is batch, rows, columns)."""

    left: tuple[int, ...]
    right: tuple[int, ...]
    back: tuple[int, ...]
    """The output's axes, taken from the product's [batch, rows, columns] axes."""
    batch: int
    rows: int
    contracted: int

    def run(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        half = out.dtype == np.float16
        a, b = a.transpose(self.left), b.transpose(self.right)
        if half:
            a, b = _float32([a, b])
        batch, rows = a.shape[: self.batch], a.shape[self.batch : self.batch + self.rows]
        columns = b.shape[self.batch + self.contracted :]
        k = math.prod(a.shape[self.batch + self.rows :])
        lead = (math.prod(batch),) if self.batch else ()
        a = a.reshape((*lead, math.prod(rows), k))
        b = b.reshape((*lead, k, math.prod(columns)))
        if not half and self.back == tuple(range(out.ndim)) and out.flags.c_contiguous:
            product(a, b, out=out.reshape((*lead, a.shape[-2], b.shape[-1])))
            return
        out[...] = product(a, b).reshape((*batch, *rows, *columns)).transpose(self.back)


@lru_cache(maxsize=None)
def matmul_form(equation: str) -> MatmulForm | None:
    """The equation as a `MatmulForm`, or None when it is not one matrix product (a letter twice in one
    operand, or summed within one operand alone)."""
    (x, y), z = parse_equation(equation, 2)
    if len(set(x)) < len(x) or len(set(y)) < len(y) or not set(x) | set(y) >= set(z):
        return None
    if any(c not in z and c not in y for c in x) or any(c not in z and c not in x for c in y):
        return None
    batch = [c for c in z if c in x and c in y]
    rows = [c for c in z if c in x and c not in y]
    columns = [c for c in z if c in y and c not in x]
    contracted = [c for c in x if c in y and c not in z]
    made = batch + rows + columns  # the product's axes
    return MatmulForm(left=tuple(x.index(c) for c in batch + rows + contracted),
                      right=tuple(y.index(c) for c in batch + contracted + columns),
                      back=tuple(made.index(c) for c in z), batch=len(batch), rows=len(rows),
                      contracted=len(contracted))


def _float32(xs: list[np.ndarray]) -> list[np.ndarray]:
    """float16 operands as float32: numpy has no float16 BLAS (its half loops run ~10x slower), so half
    products are computed in float32, as a GPU accumulates them, and rounded to float16 once, into `out`."""
    return [x.astype(np.float32) for x in xs]


def _relu(xs, out, attrs):
    np.maximum(xs[0], 0, out=out)


def _gelu(xs, out, attrs):
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), the tanh approximation, built up in `out`.

    In float16 the inner product may overflow to inf for large |x|; tanh(+-inf) = +-1 is then exact.
    """
    x = xs[0]
    with np.errstate(over="ignore"):
        np.multiply(x, x, out=out)
        out *= 0.044715
        out += 1.0
        out *= x
    out *= math.sqrt(2.0 / math.pi)
    np.tanh(out, out=out)
    out += 1.0
    out *= x
    out *= 0.5


def _silu(xs, out, attrs):
    """x / (1 + exp(-x)), built up in `out`."""
    np.negative(xs[0], out=out)
    np.exp(out, out=out)
    out += 1.0
    np.divide(xs[0], out, out=out)


def _exp(xs, out, attrs):
    np.exp(xs[0], out=out)


def _scale(xs, out, attrs):
    np.multiply(xs[0], KERNELS["scale"].attr(attrs, "factor"), out=out)


def _softmax(xs, out, attrs):
    """Numerically stable: subtract the row max before exponentiating (-inf for an empty row)."""
    np.subtract(xs[0], xs[0].max(axis=-1, keepdims=True, initial=-np.inf), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)


def _rmsnorm(xs, out, attrs):
    """x / sqrt(mean(x^2, last axis) + eps), times the optional weight (float16: `_in_float32`)."""
    x = xs[0]
    np.multiply(x, x, out=out)
    scale = out.sum(axis=-1, keepdims=True)
    scale /= max(x.shape[-1], 1)  # the mean, without numpy's warning for an empty last axis
    scale += KERNELS["rmsnorm"].attr(attrs, "eps")
    np.sqrt(scale, out=scale)
    np.divide(x, scale, out=out)
    if len(xs) == 2:
        out *= xs[1]


def _rope(xs, out, attrs):
    """Per head of width D (cos's width): out = x*cos + rotate_half(x)*sin, rotate_half(y) = [-y2, y1]."""
    x, cos, sin = xs
    tokens, width = cos.shape
    half = width // 2
    x3 = x.reshape(tokens, x.shape[1] // width, width)
    o3 = out.reshape(tokens, x.shape[1] // width, width)  # a view: `out` is contiguous
    cos3, sin3 = cos[:, None, :], sin[:, None, :]
    np.multiply(x3, cos3, out=o3)
    o3[..., :half] -= x3[..., half:] * sin3[..., :half]
    o3[..., half:] += x3[..., :half] * sin3[..., half:]


def _swiglu(xs, out, attrs):
    """silu(gate) * up = gate / (1 + exp(-gate)) * up, built up in `out` (exp may overflow to inf: exact)."""
    gate, up = xs
    np.negative(gate, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1.0
    np.divide(gate, out, out=out)
    out *= up


ROW_ELEMENTS = 1 << 18
"""Elements of a float32 chunk `_in_float32` works on: 1 MiB, so its passes stay in cache."""


def _in_float32(impl: KernelImpl) -> KernelImpl:
    """`impl` computed in float32 for a float16 output, `ROW_ELEMENTS` at a time along the first axis, and
    rounded to float16 once: numpy's half loops run 10-50x slower than its float32 ones, and float32 keeps
    what a GPU keeps in registers (squares past 256, exp of large gates). Operands with the output's rows
    (rank and first axis alike) are cut with it; the others (a norm's weight) are converted once."""

    def run(xs, out, attrs):
        if out.dtype != np.float16:
            return impl(xs, out, attrs)
        if out.ndim < 2 or out.size == 0:  # one chunk: the first axis may be the reduced one
            result = np.empty(out.shape, np.float32)
            impl(_float32(xs), result, attrs)
            out[...] = result
            return None
        cut = [x.ndim == out.ndim and x.shape[0] == out.shape[0] for x in xs]
        whole = [None if c else x.astype(np.float32) for x, c in zip(xs, cut)]
        rows = max(1, ROW_ELEMENTS // (out.size // out.shape[0]))
        result = np.empty((rows, *out.shape[1:]), np.float32)
        for lo in range(0, out.shape[0], rows):
            hi = min(out.shape[0], lo + rows)
            part = [x[lo:hi].astype(np.float32) if c else w for x, c, w in zip(xs, cut, whole)]
            impl(part, result[: hi - lo], attrs)
            out[lo:hi] = result[: hi - lo]
        return None

    return run


def _heads(x: np.ndarray, kv_heads: int, width: int, work) -> np.ndarray:
    """[t, heads*D] -> [kv_heads, heads/kv_heads, t, D] in `work` precision (head h = kv*group + g)."""
    tokens = x.shape[0]
    return x.reshape(tokens, kv_heads, x.shape[1] // (kv_heads * width), width).transpose(1, 2, 0, 3).astype(work, copy=False)


QUERY_ROWS = 128
"""Query rows whose scores are formed at once: [heads, 128, keys] stays in cache where a 2048-token block's
whole score matrix was 268 MB, and a causal or windowed chunk forms only the keys its rows can see."""


def _block_attention(q, k, v, attrs, work) -> tuple[np.ndarray, np.ndarray]:
    """This key block's normalised output [kv, group, tq, D] and log-sum-exp [kv, group, tq], `QUERY_ROWS`
    query rows at a time over the keys any of them can see (a row that sees none: zeros and -inf)."""
    kv_heads = attrs["kv_heads"]
    width = q.shape[1] // attrs["heads"]
    qh = _heads(q, kv_heads, width, work)
    kh = _heads(k, kv_heads, width, work)  # [kv, 1, tk, D]: broadcast over the group
    vh = _heads(v, kv_heads, width, work)
    scale = softmax_scale(q.shape, attrs)
    output = np.zeros(qh.shape, work)
    lse = np.full(qh.shape[:-1], -np.inf, work)
    for first in range(0, q.shape[0], QUERY_ROWS):
        rows = slice(first, min(first + QUERY_ROWS, q.shape[0]))
        keys = _visible_keys(rows, k.shape[0], attrs)
        if keys.start < keys.stop:
            output[..., rows, :], lse[..., rows] = _softmax_rows(qh[..., rows, :], kh[..., keys, :], vh[..., keys, :],
                                                                 _hidden(rows, keys, attrs), scale)
    return output, lse


def _visible_keys(rows: slice, keys: int, attrs) -> slice:
    """The keys some query of `rows` sees: causal hides key j > query i; a window hides i - (offset + j) >= window."""
    lo, hi = 0, keys
    if KERNELS["attention"].attr(attrs, "causal"):
        hi = min(hi, rows.stop)
    if "window" in attrs:
        lo = max(lo, rows.start - attrs.get("offset", 0) - attrs["window"] + 1)
    return slice(lo, max(lo, hi))


def _hidden(rows: slice, keys: slice, attrs) -> np.ndarray | None:
    """[rows, keys]: True where the query does not see the key; None when it sees them all."""
    hidden = ~_seen(rows, keys, attrs)
    return hidden if hidden.any() else None


def _seen(rows: slice, keys: slice, attrs) -> np.ndarray:
    """[rows, keys]: whether query i sees key j under the block's causal, window and offset attributes."""
    i = np.arange(rows.start, rows.stop)[:, None]
    j = np.arange(keys.start, keys.stop)[None, :]
    seen = np.ones((len(i), j.shape[1]), dtype=bool)
    if KERNELS["attention"].attr(attrs, "causal"):
        seen &= j <= i
    if "window" in attrs:
        seen &= i - (attrs.get("offset", 0) + j) < attrs["window"]
    return seen


def _softmax_rows(qh, kh, vh, hidden, scale) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T * scale, `hidden` keys out) v and the log-sum-exp, for rows that see at least one key."""
    scores = product(qh, kh.swapaxes(-1, -2))
    scores *= scale
    if hidden is not None:
        np.copyto(scores, -np.inf, where=hidden)
    top = scores.max(axis=-1)
    scores -= np.where(np.isfinite(top), top, 0.0)[..., None]  # a row a window hides all of stays -inf
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = top + np.log(total)
    output = product(scores, vh)
    output /= np.where(total > 0, total, 1.0)[..., None]
    return output, lse


def _merge(prev: np.ndarray, output, lse, heads: int, work) -> tuple[np.ndarray, np.ndarray]:
    """Log-sum-exp merge of a packed partial [tq, heads*D + heads] with this block's (output, lse)."""
    kv_heads, group, tokens, width = output.shape
    prev_out = _heads(prev[:, : heads * width], kv_heads, width, work)
    prev_lse = prev[:, heads * width :].astype(work).reshape(tokens, kv_heads, group).transpose(1, 2, 0)
    both = np.logaddexp(prev_lse, lse)
    seen = np.isfinite(both)  # a row with no key yet in either part keeps zeros
    with np.errstate(invalid="ignore"):
        old = np.where(seen, np.exp(prev_lse - both), 0.0)
        new = np.where(seen, np.exp(lse - both), 0.0)
    return prev_out * old[..., None] + output * new[..., None], both


def _attention(xs, out, attrs):
    """One key block of grouped-query attention merged into `prev` (see the kernel table). A block of
    several sequences (`segments`) is a causal block per sequence, each on its rows of every operand."""
    if "segments" in attrs:
        one = {name: value for name, value in attrs.items() if name != "segments"}
        for start, stop in segment_rows(attrs, xs[0].shape[0]):
            _attention([x[start:stop] for x in xs], out[start:stop], one)
        return
    q, k, v = xs[:3]
    heads = attrs["heads"]
    work = np.float64 if q.dtype == np.float64 else np.float32
    output, lse = _block_attention(q, k, v, attrs, work)
    if len(xs) == 4:
        output, lse = _merge(xs[3], output, lse, heads, work)
    tokens = q.shape[0]
    flat = output.transpose(2, 0, 1, 3).reshape(tokens, q.shape[1])
    if KERNELS["attention"].attr(attrs, "final"):
        out[...] = flat
    else:
        out[:, : q.shape[1]] = flat
        out[:, q.shape[1] :] = lse.transpose(2, 0, 1).reshape(tokens, heads)


def visible_rows(length: int, rows: int, attrs) -> tuple[int, int]:
    """The rows [lo, hi) of a decode_attention key block that a sequence with `length` cached tokens sees."""
    if attrs.get("own", False):
        return 0, rows
    start = attrs.get("start", 0)
    hi = min(rows, max(0, length - start))
    lo = min(hi, max(0, length - attrs["window"] + 1 - start)) if "window" in attrs else 0
    return lo, hi


def _decode_attention(xs, out, attrs):
    """One key block of a batch's decode attention (see the kernel table): row b over its visible keys."""
    q, k, v, lengths = xs[:4]
    heads = attrs["heads"]
    work = np.float64 if q.dtype == np.float64 else np.float32
    plain = {"heads": heads, "kv_heads": attrs["kv_heads"]}
    if "softmax_scale" in attrs:
        plain["softmax_scale"] = attrs["softmax_scale"]
    final = KERNELS["decode_attention"].attr(attrs, "final")
    own = attrs.get("own", False)
    width = q.shape[1]
    for b in range(q.shape[0]):
        keys, values = (k[b : b + 1], v[b : b + 1]) if own else (k[:, b], v[:, b])
        lo, hi = visible_rows(int(lengths[b]), keys.shape[0], attrs)
        output, lse = _block_attention(q[b : b + 1], keys[lo:hi], values[lo:hi], plain, work)
        if len(xs) == 5:
            output, lse = _merge(xs[4][b : b + 1], output, lse, heads, work)
        flat = output.transpose(2, 0, 1, 3).reshape(1, width)
        if final:
            out[b : b + 1] = flat
        else:
            out[b : b + 1, :width] = flat
            out[b : b + 1, width:] = lse.transpose(2, 0, 1).reshape(1, heads)


def _rows(xs, out, attrs):
    out[...] = xs[0][attrs["start"] : attrs["stop"]]


def _concat(xs, out, attrs):
    np.concatenate(xs, axis=0, out=out)


# ----- training: the backward kernels and the blocked cross-entropy (docs/training.md) ---------------------


def _cast(xs, out, attrs):
    out[...] = xs[0]


def _rmsnorm_grad(xs, out, attrs):
    """dx = r g - x r^3 mean(g x), g = dy * weight, r = 1 / sqrt(mean(x^2) + eps), in float32 for half operands."""
    x, dy = xs[0], xs[-1]
    work = np.float64 if x.dtype == np.float64 else np.float32
    x, g = x.astype(work, copy=False), dy.astype(work)
    if len(xs) == 3:
        g *= xs[1]
    n = max(x.shape[-1], 1)
    r = 1.0 / np.sqrt(np.square(x).sum(axis=-1, keepdims=True) / n + KERNELS["rmsnorm_grad"].attr(attrs, "eps"))
    along = (g * x).sum(axis=-1, keepdims=True) / n
    out[...] = r * g - x * (r**3 * along)


def _swiglu_grad(xs, out, attrs):
    """d gate = dy * up * s (1 + gate (1 - s)), s = sigmoid(gate), in float32 for half operands."""
    work = np.float64 if xs[0].dtype == np.float64 else np.float32
    gate, up, dy = (x.astype(work, copy=False) for x in xs)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-gate))
    out[...] = dy * up * s * (1.0 + gate * (1.0 - s))


def _attention_unpack(xs, out, attrs):
    out[...] = xs[0][:, : out.shape[1]]


def visible(tq: int, tk: int, attrs) -> np.ndarray:
    """[tq, tk]: whether query i sees key j in a block with these attention attributes (causal, window, offset)."""
    return _seen(slice(0, tq), slice(0, tk), attrs)


def _attention_grad(xs, out, attrs):
    """One block of flash attention's backward (see the kernel table), heads as [kv, group, t, D]:
    P = exp(S - LSE), D = rowsum(dO * O), dS = P * (dO V^T - D); dQ = scale dS K, dK = scale dS^T Q and
    dV = P^T dO, the query heads of a group summed into their kv head."""
    q, k, v, packed, d_out = xs[:5]
    heads, kv_heads = attrs["heads"], attrs["kv_heads"]
    work = np.float64 if q.dtype == np.float64 else np.float32
    width, tq, tk = q.shape[1] // heads, q.shape[0], k.shape[0]
    scale = softmax_scale(q.shape, attrs)
    qh, kh, vh, dh = (_heads(x, kv_heads, width, work) for x in (q, k, v, d_out))
    oh = _heads(packed[:, : heads * width], kv_heads, width, work)
    lse = packed[:, heads * width :].astype(work).reshape(tq, kv_heads, heads // kv_heads).transpose(1, 2, 0)
    seen = visible(tq, tk, attrs) & np.isfinite(lse)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(seen, np.exp(np.matmul(qh, kh.swapaxes(-1, -2)) * scale - lse[..., None]), 0.0)
    ds = p * (np.matmul(dh, vh.swapaxes(-1, -2)) - (dh * oh).sum(axis=-1)[..., None])
    if attrs["wrt"] == "q":
        grad = (scale * np.matmul(ds, kh)).transpose(2, 0, 1, 3).reshape(tq, q.shape[1])
    else:
        dk = scale * np.matmul(ds.swapaxes(-1, -2), qh).sum(axis=1)
        dv = np.matmul(p.swapaxes(-1, -2), dh).sum(axis=1)
        grad = np.concatenate([g.transpose(1, 0, 2).reshape(tk, k.shape[1]) for g in (dk, dv)])
    if len(xs) == 6:
        grad += xs[5]
    out[...] = grad


def _xent(xs, out, attrs):
    """Per token (max m, sum of exp(logit - m) s, label's logit z) over this block's columns, merged into prev."""
    logits = xs[0].astype(out.dtype)
    rows, columns = logits.shape
    top = logits.max(axis=1, initial=-np.inf)
    with np.errstate(invalid="ignore"):
        total = np.exp(logits - top[:, None]).sum(axis=1)
    local = xs[1].astype(np.int64) - KERNELS["xent"].attr(attrs, "start")
    inside = (local >= 0) & (local < columns)
    picked = np.where(inside, logits[np.arange(rows), np.clip(local, 0, max(columns - 1, 0))] if columns else 0.0, 0.0)
    if len(xs) == 3:
        m0, s0, z0 = xs[2].T
        both = np.maximum(m0, top)
        with np.errstate(invalid="ignore"):
            total = np.where(np.isfinite(m0), s0 * np.exp(m0 - both), 0.0) + np.where(np.isfinite(top), total * np.exp(top - both), 0.0)
        top, picked = both, picked + z0
    out[:, 0], out[:, 1], out[:, 2] = top, total, picked


def _xent_loss(xs, out, attrs):
    stats, labels = xs
    valid = labels >= 0
    out[0] = (stats[valid, 0] + np.log(stats[valid, 1]) - stats[valid, 2]).sum()
    out[1] = valid.sum()


def _xent_grad(xs, out, attrs):
    """factor * scale / count * (softmax - onehot) on the rows whose label is not ignored, zeros on the others."""
    logits, labels, stats, total = xs[:4]
    work = stats.dtype
    factor = KERNELS["xent_grad"].attr(attrs, "factor") * (float(xs[4][0]) if len(xs) == 5 else 1.0)
    weight = np.where(labels >= 0, factor / max(float(total[1]), 1.0), 0.0).astype(work)
    grad = np.exp(logits.astype(work) - (stats[:, 0] + np.log(stats[:, 1]))[:, None])
    local = labels.astype(np.int64) - KERNELS["xent_grad"].attr(attrs, "start")
    rows = np.flatnonzero((local >= 0) & (local < logits.shape[1]))
    grad[rows, local[rows]] -= 1.0
    out[...] = grad * weight[:, None]


def _binary(ufunc) -> KernelImpl:
    def impl(xs, out, attrs):
        ufunc(xs[0], xs[1], out=out)

    return impl


NUMPY_KERNELS: dict[str, KernelImpl] = {
    "matmul": _matmul,
    "einsum": _einsum,
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "relu": _relu,
    "gelu": _gelu,
    "silu": _silu,
    "exp": _exp,
    "scale": _scale,
    "softmax": _softmax,
    "rmsnorm": _in_float32(_rmsnorm),
    "rope": _in_float32(_rope),
    "swiglu": _in_float32(_swiglu),
    "attention": _attention,
    "decode_attention": _decode_attention,
    "rows": _rows,
    "concat": _concat,
    "cast": _cast,
    "rmsnorm_grad": _rmsnorm_grad,
    "swiglu_grad": _swiglu_grad,
    "attention_unpack": _attention_unpack,
    "attention_grad": _attention_grad,
    "xent": _xent,
    "xent_loss": _xent_loss,
    "xent_grad": _xent_grad,
}

assert set(NUMPY_KERNELS) == set(KERNELS), "every kernel in the table needs a numpy implementation"

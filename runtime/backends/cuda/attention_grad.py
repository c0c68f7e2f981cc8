"""Attention's backward blocks on the GPU (`attention_grad`): torch's fused backward where the forward runs
through torch, else cuBLAS GEMMs and two numba kernels.

One `attention_grad` vertex is one (query block, key block) link of a chain (docs/training.md): from q, k,
v, the forward's final packed partial of q's rows (the normalised output O, then each head's log-sum-exp,
float32) and dO, it adds this key block's share of dQ (`wrt` q) or of dK over dV (`wrt` kv) to the chain's
float32 partial `prev` and writes the next partial, or (`final`) the gradient in q's dtype. With the global
log-sum-exp, P = exp(S - LSE) restricted to the block is the block's share of the whole softmax, so every
link is independent of the others beyond `prev`. Paths (`grad_path`):

- `torch-cudnn`, `torch-flash`: torch's fused backward op (`aten._scaled_dot_product_{cudnn,flash}_attention
  _backward`) on zero-copy views of q, k, v and dO, with O converted to q's dtype and the log-sum-exp made
  contiguous from the packed partial (what the forward op would have saved: the packed partial gives all it
  needs, O and the log-sum-exp of the scaled scores in natural log over every key); grouped kv heads are
  expanded for it, as the forward's are. The op computes dQ, dK and dV together: the GPU's last results are kept
  for their pairs' other links (`GradShare`: same operand nodes, same attributes), which the frontend writes
  next (frontend/attention.py: key block by key block, a pair's two links together), so a pair is
  computed once where its links run one after the other on the attention stream, and twice otherwise
  (`TURNIP_ATTENTION_GRAD_SHARE=N`: N results kept, 4 by default; 0, each link computing its own).
  Then `kernels_train.attention_grad_finish` sums a kv
  head's query heads and adds `prev`, into the arena. It runs on the GPU's attention stream, as the forward
  (attention.py); torch's allocator holds its outputs (`library_bytes`), warmed up per shape in `prepare`.
  Taken where the forward's provider launches through torch (`uses_torch`), for float16 and bfloat16 blocks
  without a window; cuDNN's op for `torch-cudnn`, FlashAttention's for the others.
- `cublas`: per chunk of kv heads (one query head of each group at a time, `h = g*G + r`) and of query rows,
  S = scale Q Kᵀ and dP = dO Vᵀ as strided batched GEMMs into float32 scratch (cuBLAS takes half operands
  with a float32 result), `kernels_train.attention_grad_scores` makes P and dS in q's dtype, then dQ = scale
  dS K (wrt q), or dK += scale dSᵀ Q and dV += Pᵀ dO (wrt kv, the group's heads and the row chunks summed by
  the GEMMs' beta), into float32 scratch, which the finish adds to `prev`. Scores never exceed one chunk:
  `grad_chunks` sizes it within GRAD_SCRATCH, and `scratch_bytes` tells the budget. What the CUDA simulator
  runs (numpy GEMMs), and the GPU's path for float32 and float64 blocks, windows, and the cublas provider.
`TURNIP_ATTENTION_GRAD` (`cublas`, `flash`, `cudnn`) picks one path for every half block for A/B runs;
`TURNIP_ATTENTION_GRAD_SHARE=N` shares a pair's fused backward between its two links (the torch paths),
keeping up to N results per GPU (4 by default, 0 for none).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from runtime.backends.cuda import kernels_numba as kn
from runtime.backends.cuda import kernels_train as kt
from runtime.backends.cuda.attention import (
    HALF,
    TORCH_STREAM,
    heads_view,
    on_attention_stream,
    torch_view,
    uses_torch,
)
from runtime.backends.cuda.gemm import GemmPlan, Matrix
from runtime.backends.cuda.launch import array_args, compiled_launch
from runtime.backends.cuda.memory import device_dtype, device_pointer, dtype_name
from runtime.backends.cuda.vector import arrays_rows_aligned, rows_aligned
from turnip_ir.errors import KernelError
from turnip_ir.kernels import DTYPE_BYTES, partial_dtype, softmax_scale

if TYPE_CHECKING:  # services.py stands above the builders (through devices.py): its types only, for checking
    from runtime.backends.cuda.services import KernelEnv, Work

PATH_ENV = "TURNIP_ATTENTION_GRAD"
"""`cublas`, `flash` or `cudnn`: the path of every half block whatever the provider (an ablation for A/B
runs and a way round a torch op that fails); unset or `auto`: `grad_path`'s rule."""
SHARE_ENV = "TURNIP_ATTENTION_GRAD_SHARE"
"""N (0 or a positive integer): a pair's second torch-path link takes the first's fused result if it is among
the GPU's last N kept (`GradShare`); 0: every link runs the fused backward itself. Unset, or anything else:
`SHARE_DEFAULT`. In the sim's dispatch order of 7b's 16k step (nondet), 1 kept result catches 31% of the
pairs, 2 catch 56%, 4 catch 86% (fixed order: all, with 1)."""
SHARE_DEFAULT = 4
"""Measured on an H100 (2026-12-06, fifth session, docs/training.md): 7b's 16k LoRA step at 8 GiB took
2.436 s with no sharing, 2.126 s keeping 2 and 2.001 s keeping 4 (the arena 0.38 GiB smaller for the four
blocks' results, the process's device peak the same 8.83 GiB)."""
GRAD_SCRATCH = 256 << 20
"""Bytes of lane scratch a cublas block may take at most (its scores, their gradients and the float32 partial
gradients of one chunk): one kv head of 7b's 4096 x 4096 blocks takes 192 MiB."""


def sharing() -> int:
    """How many fused backward results a GPU keeps for their pairs' second links (`SHARE_ENV`; 0: none)."""
    value = os.environ.get(SHARE_ENV, "")
    return int(value) if value.isdigit() else SHARE_DEFAULT


class GradShare:
    """One GPU's last `slots` fused backwards on its attention stream, each kept for the other link of its
    (query block, key block) pair: torch's dQ, dK and dV of the same operand nodes (memgraph nodes, whose
    contents do not change while they are read) under the same attributes. The link that computes first
    keeps it (the oldest kept goes when more than `slots` would be); the pair's other link takes it if it
    is still kept, else computes it again and keeps nothing (its pair is done: `done`). Emptied at each
    run's start (`new_run`, from `CudaBackend.run_starts`): a plan run again reads new values from the same
    nodes. `library_bytes` allows torch `slots` more blocks' outputs."""

    def __init__(self, slots: int = 1):
        self.slots = slots
        self.kept: dict[tuple, object] = {}
        """Key -> the fused result, oldest first."""
        self.done: set[tuple] = set()
        self.taken = self.computed = 0
        """Links that took a kept result, links that computed one (since the backend was made)."""

    def take(self, key: tuple):
        grads = self.kept.pop(key, None)
        if grads is not None:
            self.taken += 1
        return grads

    def keep(self, key: tuple, grads) -> None:
        self.computed += 1
        if key not in self.done:
            self.done.add(key)
            self.kept[key] = grads
            if len(self.kept) > self.slots:
                del self.kept[next(iter(self.kept))]

    def new_run(self) -> None:
        self.kept.clear()
        self.done.clear()


def grad_path(provider: str, dtype: str, attrs: dict) -> str:
    """Which path runs an `attention_grad` block (module docstring): `torch-cudnn`, `torch-flash` or `cublas`."""
    chosen = os.environ.get(PATH_ENV, "auto")
    if chosen not in ("auto", "cublas", "flash", "cudnn"):
        raise KernelError(f"{PATH_ENV}={chosen!r} is not one of auto, cublas, flash, cudnn")
    if dtype not in HALF or "window" in attrs or not uses_torch(provider) or chosen == "cublas":
        return "cublas"
    if chosen != "auto":
        return f"torch-{chosen}"
    return "torch-cudnn" if provider == "torch-cudnn" else "torch-flash"


@dataclass(frozen=True)
class GradBlock:
    """One attention_grad vertex: operands, shape and attributes (`prev` None on a chain's first link)."""

    q: object
    k: object
    v: object
    packed: object
    d_out: object
    prev: object
    heads: int
    kv_heads: int
    wrt: str
    causal: bool
    final: bool
    scale: float
    tq: int
    tk: int
    d: int
    window: int | None
    offset: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def block_of(node, inputs) -> GradBlock:
    attrs = node.attrs
    q, k, v, packed, d_out = inputs[:5]
    heads, kv_heads = int(attrs["heads"]), int(attrs["kv_heads"])
    tq, width = (int(x) for x in q.shape)
    return GradBlock(q, k, v, packed, d_out, inputs[5] if len(inputs) > 5 else None, heads, kv_heads, attrs["wrt"],
                     bool(attrs.get("causal", False)), bool(attrs.get("final", True)), float(softmax_scale((tq, width), attrs)),
                     tq, int(k.shape[0]), width // heads, attrs.get("window"), int(attrs.get("offset", 0)))


# ----- the cublas path ---------------------------------------------------------------------------------------
def _score_bytes(dtype: str, wrt: str) -> int:
    """Scratch bytes per score of a chunk: S and dP in the partial's dtype, and for half blocks P (wrt kv)
    and dS in the block's dtype (float32 and float64 blocks write them over S and dP)."""
    work = DTYPE_BYTES[partial_dtype(dtype)]
    half = DTYPE_BYTES[dtype] * (2 if wrt == "kv" else 1) if dtype in HALF else 0
    return 2 * work + half


def _acc_bytes(rows: int, tk: int, d: int, dtype: str, wrt: str) -> int:
    """Scratch bytes per kv head of a chunk's partial gradients: dQ rows, or dK and dV."""
    return DTYPE_BYTES[partial_dtype(dtype)] * (rows * d if wrt == "q" else 2 * tk * d)


def grad_chunks(tq: int, tk: int, d: int, kv_heads: int, dtype: str, wrt: str) -> tuple[int, int]:
    """(kv heads, query rows) of a cublas chunk: all of both where they fit GRAD_SCRATCH, else as many kv
    heads (a divisor of kv_heads) as fit, else one head and as many rows as fit (at least one)."""
    cap = GRAD_SCRATCH
    per_score = _score_bytes(dtype, wrt)
    head = tq * tk * per_score + _acc_bytes(tq, tk, d, dtype, wrt)
    if head <= cap:
        fit = max(1, cap // head)
        return max(c for c in range(1, kv_heads + 1) if kv_heads % c == 0 and c <= fit), tq
    per_row = tk * per_score + (_acc_bytes(1, tk, d, dtype, "q") if wrt == "q" else 0)
    spare = cap - (_acc_bytes(0, tk, d, dtype, wrt) if wrt == "kv" else 0)
    return 1, min(tq, max(1, spare // per_row))


def _granule(n: int) -> int:
    return (n + 255) // 256 * 256


def _layout(c: int, rows: int, tk: int, d: int, dtype: str, wrt: str) -> list[tuple[str, int, tuple, str]]:
    """The scratch of one chunk: (name, byte offset, shape, dtype) of S, dP, [P, dS,] and the partials."""
    work = partial_dtype(dtype)
    parts = [("s", (c, rows, tk), work), ("dp", (c, rows, tk), work)]
    if dtype in HALF:
        parts += ([("p", (c, rows, tk), dtype)] if wrt == "kv" else []) + [("ds", (c, rows, tk), dtype)]
    parts += [("dq", (c, rows, d), work)] if wrt == "q" else [("dk", (c, tk, d), work), ("dv", (c, tk, d), work)]
    layout, offset = [], 0
    for name, shape, kind in parts:
        layout.append((name, offset, shape, kind))
        offset += _granule(int(np.prod(shape)) * DTYPE_BYTES[kind])
    return layout


def cublas_scratch(tq: int, tk: int, d: int, kv_heads: int, dtype: str, wrt: str) -> int:
    c, rows = grad_chunks(tq, tk, d, kv_heads, dtype, wrt)
    _, offset, shape, kind = _layout(c, rows, tk, d, dtype, wrt)[-1]
    return offset + _granule(int(np.prod(shape)) * DTYPE_BYTES[kind])


def scratch_bytes(node, sources, provider: str) -> int:
    """Lane scratch one attention_grad vertex needs: the cublas path's chunk, none on torch's."""
    q, k = sources[0], sources[1]
    if grad_path(provider, q.dtype, node.attrs) != "cublas":
        return 0
    heads, kv_heads = int(node.attrs["heads"]), int(node.attrs["kv_heads"])
    return cublas_scratch(q.shape[0], k.shape[0], q.shape[1] // heads, kv_heads, q.dtype, node.attrs["wrt"])


def _plans(b: GradBlock, c: int, rows: int) -> dict[str, GemmPlan]:
    """The GEMMs of one chunk of `c` kv heads (query head g*G + r of each) and `rows` query rows."""
    width, kv_width, d, tk, group = b.heads * b.d, b.kv_heads * b.d, b.d, b.tk, b.group
    q_rows = Matrix(rows, d, width, group * d)  # Q or dO of the chunk's heads, batch over kv heads
    keys = Matrix(tk, d, kv_width, d)  # K or V of the chunk's kv heads
    scores = Matrix(rows, tk, tk, rows * tk)
    plans = {"s": GemmPlan(rows, tk, d, c, q_rows, Matrix(tk, d, kv_width, d, trans=True), scores)}
    if b.wrt == "q":
        plans["dq"] = GemmPlan(rows, d, tk, c, scores, keys, Matrix(rows, d, d, rows * d))
    else:
        plans["dk"] = GemmPlan(tk, d, rows, c, Matrix(rows, tk, tk, rows * tk, trans=True), q_rows, Matrix(tk, d, d, tk * d))
    return plans


def build_cublas(node, inputs, out, env: KernelEnv) -> Work:
    b = block_of(node, inputs)
    dtype = dtype_name(b.q)
    c, rows = grad_chunks(b.tq, b.tk, b.d, b.kv_heads, dtype, b.wrt)
    layout = _layout(c, rows, b.tk, b.d, dtype, b.wrt)
    scores = kt.attention_grad_scores(dtype, partial_dtype(dtype), b.causal, b.window is not None, b.wrt == "kv")
    steps = {}

    def buffers(lane, count):
        """The chunk's scratch views for `count` query rows (the last row chunk may be shorter)."""
        scratch = env.scratch(lane)
        views = {}
        for name, offset, shape, kind in layout:
            shape = shape if name in ("dk", "dv") else (shape[0], count, shape[2])
            size = int(np.prod(shape)) * DTYPE_BYTES[kind]
            views[name] = scratch[offset : offset + size].view(device_dtype(kind)).reshape(shape)
        views.setdefault("p", views["s"])  # float32 and float64 blocks: P over S and dS over dP
        views.setdefault("ds", views["dp"])
        return views

    def prepare(lane):
        launches = []
        for g0 in range(0, b.kv_heads, c):
            for row0 in range(0, b.tq, rows):
                views = buffers(lane, min(rows, b.tq - row0))
                for r in range(b.group):
                    launches += _link(b, env, views, (g0, r, row0), scores, out)
            if b.wrt == "kv":
                launches += _finish_kv(b, env, buffers(lane, rows), c, g0, out)
        return launches

    def work(lane):
        if lane not in steps:
            steps[lane] = prepare(lane)
        stream = env.launch_streams[lane]
        for kind, go in steps[lane]:
            go(lane) if kind == "gemm" else go(stream)

    work.prepare = lambda lane: steps.setdefault(lane, prepare(lane))
    return work


def _link(b: GradBlock, env: KernelEnv, views: dict, at: tuple[int, int, int], scores, out) -> list:
    """The launches of one step of a chunk, in order: ("gemm", work(lane)) or ("kernel", go(stream)).
    `at` = (g0, r, row0): kv heads g0.. (as many as the views hold), query head r of each group, query
    rows row0.. . wrt q finishes its rows of dQ; wrt kv adds to the chunk's dK and dV (beta 1 after the
    chunk's first step), finished by `_finish_kv`."""
    g0, r, row0 = at
    c, rows = int(views["s"].shape[0]), int(views["s"].shape[1])
    plans = env.cache.get("attention_grad", (b.tq, b.tk, b.d, b.heads, b.kv_heads, b.wrt, c, rows), lambda: _plans(b, c, rows))
    width, d, group = b.heads * b.d, b.d, b.group
    q_at = row0 * width + (g0 * group + r) * d  # the chunk's first query head, first row, in Q and dO
    launches = [("gemm", env.gemm(plans["s"], b.q, b.k, views["s"], alpha=b.scale, offsets=(q_at, g0 * d))),
                ("gemm", env.gemm(plans["s"], b.d_out, b.v, views["dp"], offsets=(q_at, g0 * d)))]
    args = (views["s"], views["dp"], views["p"], views["ds"], b.packed, b.d_out, g0 * group + r, group, d, b.heads, row0,
            b.offset, b.window or 0)
    launches.append(("kernel", env.launch(scores, (c * rows,), (kn.ROW_THREADS,), args)))
    if b.wrt == "q":
        part = slice(row0, row0 + rows)
        launches.append(("gemm", env.gemm(plans["dq"], views["ds"], b.k, views["dq"], alpha=b.scale, offsets=(0, g0 * d))))
        launches.append(("kernel", _finish(env, views["dq"], _rows(b.prev, part), out[part], 1, (g0 * group + r) * d, group * d)))
        return launches
    beta = 0.0 if (r == 0 and row0 == 0) else 1.0
    launches.append(("gemm", env.gemm(plans["dk"], views["ds"], b.q, views["dk"], alpha=b.scale, beta=beta, offsets=(0, q_at))))
    launches.append(("gemm", env.gemm(plans["dk"], views["p"], b.d_out, views["dv"], beta=beta, offsets=(0, q_at))))
    return launches


def _finish_kv(b: GradBlock, env: KernelEnv, views: dict, c: int, g0: int, out) -> list:
    """The chunk's dK and dV (kv heads g0..g0+c) added to prev's two halves, into out's."""
    top, bottom = slice(0, b.tk), slice(b.tk, 2 * b.tk)
    return [("kernel", _finish(env, views["dk"], _rows(b.prev, top), out[top], 1, g0 * b.d, b.d)),
            ("kernel", _finish(env, views["dv"], _rows(b.prev, bottom), out[bottom], 1, g0 * b.d, b.d))]


def _rows(prev, part: slice):
    return None if prev is None else prev[part]


def _finish(env: KernelEnv, src, prev, out, group: int, col0: int, col_step: int):
    """`attention_grad_finish` of src [count * group, rows, d] into out's rows (prev's added where given)."""
    count = int(src.shape[0]) // group
    vector = env.vector_loads and kn.merge_vector_ok(int(src.shape[2])) and arrays_rows_aligned(src, prev, out)
    kernel = kt.attention_grad_finish(dtype_name(src), dtype_name(out), prev is not None, vector)
    args = (src, prev if prev is not None else out, out, count, group, col0, col_step)
    return env.launch(kernel, (max(int(out.shape[0]), 1),), (kn.ROW_THREADS,), args)


# ----- torch's fused backward --------------------------------------------------------------------------------
TORCH_GRAD_OPS = {
    "torch-flash": lambda torch, d_out, q, k, v, o, lse, causal, scale, rng: torch.ops.aten._scaled_dot_product_flash_attention_backward(
        d_out, q, k, v, o, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, *rng, scale=scale),
    "torch-cudnn": lambda torch, d_out, q, k, v, o, lse, causal, scale, rng: torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        d_out, q, k, v, o, lse.unsqueeze(-1), *rng, None, None, None, q.shape[2], k.shape[2], 0.0, causal, scale=scale),
}
"""(dQ, dK, dV) [1, heads, t, d] from [1, heads, t, d] operands, the log-sum-exp [1, heads, tq] (cuDNN's stats
are [1, heads, tq, 1]) and `rng`, the random-number state the forward op returns (`_rng_state`): no dropout
reads it, but the op takes it as the forward gave it. No bias, dense sequences (no cumulative lengths)."""


def _rng_state(env: KernelEnv, path: str, device):
    """The forward op's random-number state (seed, offset) at dropout 0, from one tiny call, once per GPU."""
    import torch

    from runtime.backends.cuda.attention import TORCH_OPS

    def probe():
        tiny = torch.zeros((1, 1, 16, 64), dtype=torch.float16, device=device)
        result = TORCH_OPS[path](torch, tiny, tiny, tiny, False, 0.125)  # the forward op of the same library
        return result[6], result[7]

    return env.cache.get("attention_grad_rng", (path, str(device)), probe)


def _finish_kernel(source: str, target: str, has_prev: bool, vector: bool):
    from numba.cuda import types

    element = {"float16": types.float16, "bfloat16": types.uint16, "float32": types.float32, "float64": types.float64}
    argtypes = (types.Array(element[source], 3, "A"), types.Array(types.float32, 2, "A"), types.Array(element[target], 2, "A"),
                types.int64, types.int64, types.int64, types.int64)
    return kt.attention_grad_finish(source, target, has_prev, vector), argtypes


def _params(array) -> list:
    """A numba array's (or arena view's) kernel parameters, for a launch compiled with explicit types."""
    return array_args(device_pointer(array), tuple(array.shape), tuple(array.strides), array.dtype.itemsize)


def build_torch(node, inputs, out, env: KernelEnv, path: str) -> Work:
    """torch's fused backward of the block on the GPU's attention stream, then the finish into the arena."""
    import torch

    b = block_of(node, inputs)
    device = torch.device("cuda", env.device_of(node))
    width = b.heads * b.d
    q4, do4 = (heads_view(x, b.heads, b.tq, b.d, device) for x in (b.q, b.d_out))
    k4, v4 = (heads_view(x, b.kv_heads, b.tk, b.d, device) for x in (b.k, b.v))
    packed = torch_view(b.packed, device)
    op = TORCH_GRAD_OPS[path]
    rng = _rng_state(env, path, device)

    def fused():
        o = torch.empty((b.tq, width), dtype=q4.dtype, device=device)
        o.copy_(packed[:, :width])  # O in q's dtype, laid out as q
        lse = packed[:, width:].t().contiguous().unsqueeze(0)
        keys, values = k4, v4
        if b.group > 1:
            keys, values = k4.repeat_interleave(b.group, dim=1), v4.repeat_interleave(b.group, dim=1)
        return op(torch, do4, q4, keys, values, o.view(1, b.tq, b.heads, b.d).transpose(1, 2), lse, b.causal, b.scale, rng)

    # (which of dQ, dK, dV, the rows of out and prev it goes to, heads summed into one)
    parts = [(0, slice(0, b.tq), 1)] if b.wrt == "q" else [(1, slice(0, b.tk), b.group), (2, slice(b.tk, 2 * b.tk), b.group)]
    source, target = dtype_name(b.q), dtype_name(out)
    quads = kn.merge_vector_ok(b.d) and arrays_rows_aligned(out, b.prev)
    finishes = env.cache.get("grad_finish", (source, target, b.prev is not None, quads), lambda: {
        vector: compiled_launch(*_finish_kernel(source, target, b.prev is not None, vector), (1,), (kn.ROW_THREADS,))
        for vector in ({False, True} if quads else {False})})
    targets = [(index, _params(out[rows]), _params(b.prev[rows] if b.prev is not None else b.packed), group, rows.stop - rows.start)
               for index, rows, group in parts]

    share = env.grad_share(env.device_of(node)) if sharing() and env.attention_stream(env.device_of(node)) is not None else None
    key = (tuple(node.inputs[:5]), b.causal, b.window, b.offset, b.scale, b.heads, b.kv_heads)

    def block(launch_stream):
        grads = share.take(key) if share is not None else None
        if grads is None:
            grads = fused()
            if share is not None:
                share.keep(key, grads)
        for index, out_params, prev_params, group, count in targets:
            g = grads[index][0]  # [heads, rows, d]
            strides = tuple(s * g.element_size() for s in g.stride())
            vector = quads and rows_aligned(g.data_ptr(), strides, g.element_size())
            tail = [ctypes.c_int64(g.shape[0] // group), ctypes.c_int64(group), ctypes.c_int64(0), ctypes.c_int64(b.d)]
            params = array_args(g.data_ptr(), tuple(g.shape), strides, g.element_size()) + prev_params + out_params + tail
            finishes[vector](launch_stream, params, grid=(count,))

    def work(lane):
        on_attention_stream(env, node, lane, block)

    def warm(lane):
        """Run only torch's part (it reads the arena and writes torch's own memory): fills torch's caches,
        with `slots` results held while the next is computed where results are shared (`GradShare`)."""
        def twice(_launch):
            held = [fused() for _ in range(share.slots if share is not None else 0)]
            fused()
            del held
        on_attention_stream(env, node, lane, twice)

    work.warm = warm
    work.per_gpu = env.attention_stream(env.device_of(node)) is not None
    work.signature = ("attention_grad", path, tuple(b.q.shape), tuple(b.k.shape), b.causal, b.heads, b.kv_heads, source)
    return work


def library_bytes(node, sources, provider: str) -> int:
    """Memory torch holds on its attention stream for one block on a torch path: `TORCH_STREAM`, O in q's
    dtype and the log-sum-exp it is handed, dQ, dK and dV over every query head, the expanded k and v of
    grouped heads, and the op's float32 dQ accumulator and row sums (FlashAttention's; rows rounded up to
    128), and on the cuDNN path another float32 [rows, width] (its dQ accumulator: without it, a 7b 4k LoRA
    step at 8 GiB held 34 MiB more library memory than this allowed on the H100): an estimate from the ops'
    allocations, which the GPU run's library memory checks."""
    q, k = sources[0], sources[1]
    path = grad_path(provider, q.dtype, node.attrs)
    if path == "cublas":
        return 0
    heads, kv_heads = int(node.attrs["heads"]), int(node.attrs["kv_heads"])
    (tq, width), tk, item = q.shape, k.shape[0], DTYPE_BYTES[q.dtype]
    rounded = -(-tq // 128) * 128
    expanded = 0 if heads == kv_heads else 2 * tk * width * item
    handed = tq * width * item + heads * tq * 4
    outputs = (tq + 2 * tk) * width * item
    inner = rounded * width * 4 + 2 * heads * rounded * 4
    if path == "torch-cudnn":
        inner += tq * width * 4
    held = outputs * sharing()  # pairs' first results, kept for their second links (GradShare)
    return TORCH_STREAM + handed + expanded + outputs + inner + held


def build(node, inputs, out, env: KernelEnv) -> Work | None:
    if any(x is None for x in inputs) or out is None:
        return None  # an empty block
    path = grad_path(env.attention, dtype_name(inputs[0]), node.attrs)
    if path == "cublas":
        return build_cublas(node, inputs, out, env)
    return build_torch(node, inputs, out, env, path)

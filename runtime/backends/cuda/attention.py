"""Attention blocks on the GPU, behind a provider: fused torch kernels when torch is there, else cuBLAS + numba.

The `attention` kernel (turnip_ir/kernels.py) is one (query block, key block) step of blocked causal
attention: q [tq, H*d], k and v [tk, KV*d], an optional packed partial `prev` [tq, H*d + H] (float32:
normalised output, then the log-sum-exp per head), and it writes either the next packed partial or, when
`final`, the normalised output in q's dtype. Every provider computes this block's output and row
log-sum-exp, then one numba kernel (`kernels_numba.attention_merge`) folds them into `prev` and writes
`out` in the arena. Providers:

- `torch-cudnn`, `torch-flash`, `torch-efficient` (float16 and bfloat16 blocks; other dtypes take `cublas`): torch's
  fused attention ops that return the log-sum-exp
  (`aten._scaled_dot_product_{cudnn,flash,efficient}_attention`), reading q, k and v as zero-copy views
  of the arena (heads as a strided dimension: no transpose is copied). Whatever the lane, the op and its
  merge run on the GPU's one attention stream (`KernelEnv.attention_stream`, through
  `torch.cuda.ExternalStream`), which waits for the lane's stream first and which the lane waits for
  after. Their outputs come from torch's caching allocator, which keeps blocks per stream: one stream
  holds one set per GPU instead of one per compute lane (devices.library_allowance), and two lanes'
  attention blocks run one after the other, as on one GPU they nearly do anyway (the sim finds no
  difference at 7b's 32k). `prepare` warms the allocator up; no segment is allocated in the loop.
  Grouped-query heads are expanded to full heads by torch (a copy of the k and v block).
- `cublas`: per key-value head group, S = scale·Q·Kᵀ as one strided batched GEMM into the lane's scratch,
  a numba masked softmax in place that also writes the log-sum-exp, O = P·V as a second batched GEMM.
  Unfused (scores go through HBM), so about 5x slower than cuDNN at 7B block sizes, but it needs nothing
  beyond CuPy; it is also what the CUDA simulator runs (with numpy GEMMs).
- `triton` (runtime/backends/cuda/attention_triton.py): one Triton kernel per block that computes the
  block and folds it into `prev` itself, so no merge kernel runs and nothing is allocated; float16 and bfloat16 blocks
  with a power-of-two head width (others take `cublas`). Checked under Triton's interpreter on the CPU
  (tests/test_attention_triton.py) and on the GPU, where docs/runtime.md ("Attention providers") gives
  its speed against torch's.
A block of packed sequences (`segments`: a causal block per sequence) runs as one causal sub-block per
sequence on its rows of q, k, v, prev and out (row views: no copy), each through the provider's builder
(`build_segmented`); under torch, sequences all of one length go in one batched call instead ([batch =
sequences, heads, rows, d] views), then one merge per sequence. Its scratch is the largest sub-block's.
`auto` takes torch-cudnn when torch with CUDA is importable, else cublas; a run planned under a budget
ranks torch-cudnn against triton first where both can run (`auto_candidates`), and its backend is then
told the one chosen (`CudaBackend.choose_attention`). The merge reads o through its
strides with vector loads where every operand allows (`kernels_numba.merge_vector_ok`; cuDNN's o, whose
heads interleave, does), element by element otherwise. A bfloat16 block's arena views are uint16 words
(memory.py): torch sees them as bfloat16 (`torch_view`), the numba kernels convert in-kernel (bfloat16.py).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from runtime.backends.base import ATTENTION_PROVIDERS as PROVIDERS
from runtime.backends.cuda import kernels_numba as kn
from runtime.backends.cuda.gemm import GemmPlan, Matrix
from runtime.backends.cuda.launch import array_args, compiled_launch
from runtime.backends.cuda.memory import device_dtype, device_pointer, dtype_name
from runtime.backends.cuda.vector import arrays_rows_aligned
from turnip_ir.errors import KernelError
from turnip_ir.kernels import DTYPE_BYTES, segment_rows, softmax_scale

HALF = ("float16", "bfloat16")
"""The dtypes torch's fused attention ops take."""
STREAM_ENV = "TURNIP_ATTENTION_STREAM"
"""`lane` runs torch's attention on each compute lane's own stream, as before the one attention stream per
GPU, with an allowance for torch's blocks per lane: an ablation for A/B measurements (bench/run.py
records it); anything else, or unset, the one stream per GPU."""


def shared_stream() -> bool:
    """Whether torch's attention runs on one stream per GPU (the default) rather than on each lane's."""
    return os.environ.get(STREAM_ENV, "gpu") != "lane"


if TYPE_CHECKING:  # services.py stands above the builders (through devices.py): its types only, for checking
    from runtime.backends.cuda.services import KernelEnv, Work


def uses_torch(provider: str) -> bool:
    """Whether a resolved provider launches through torch (its streams, caches and allocator cap)."""
    return provider.startswith("torch") or provider == "triton"


def have_triton() -> bool:
    """Whether triton is installed, found without importing it: `auto` ranks triton's plan by the sim
    before anything runs, and importing triton (0.1 s after torch on the 2-core development machine) is
    paid only where its plan wins."""
    return importlib.util.find_spec("triton") is not None


def have_torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve(provider: str, on_gpu: bool) -> str:
    """The provider `provider` stands for; `on_gpu` is False under the simulator (driver.py), where torch
    has no device to run on."""
    if provider not in PROVIDERS:
        raise KernelError(f"unknown attention provider '{provider}' (known: {', '.join(PROVIDERS)})")
    torch_usable = on_gpu and have_torch_cuda()
    if provider == "auto":
        return "torch-cudnn" if torch_usable else "cublas"
    if uses_torch(provider) and not torch_usable:
        raise KernelError(f"attention provider '{provider}' needs torch with CUDA, which is not importable here")
    if provider == "triton" and not have_triton():
        raise KernelError("attention provider 'triton' needs triton, which is not importable here")
    return provider


def auto_candidates(on_gpu: bool = True) -> tuple[str, ...]:
    """The providers `auto` chooses among, by the sim, for a run under a budget (runtime.api,
    `plan_choosing_attention`): torch-cudnn, then triton where both can run. Triton's attention is
    slower (`CostModel.triton_attention_flops`) but its workspace is smaller (`reserve_bytes`), which
    can pay at tight budgets (7b at 8k / 1 GiB while torch's blocks were held per lane; within the margin
    since). Elsewhere the one provider `auto` resolves to."""
    if resolve("auto", on_gpu) == "torch-cudnn" and have_triton():
        return ("torch-cudnn", "triton")
    return (resolve("auto", on_gpu),)


@dataclass(frozen=True)
class Block:
    """One attention vertex's operands and shape: q [tq, heads*d], k and v [tk, kv_heads*d], optional prev."""

    q: object
    k: object
    v: object
    prev: object
    heads: int
    kv_heads: int
    causal: bool
    final: bool
    scale: float
    tq: int
    tk: int
    d: int


def block_of(node, inputs) -> Block:
    q, k, v = inputs[:3]
    heads, kv_heads, causal, final, _ = attention_attrs(node)
    tq, width = (int(x) for x in q.shape)
    scale = softmax_scale((tq, width), node.attrs)
    return Block(q, k, v, inputs[3] if len(inputs) > 3 else None, heads, kv_heads, causal, final, float(scale), tq, int(k.shape[0]), width // heads)


def attention_attrs(node) -> tuple[int, int, bool, bool, float]:
    attrs = node.attrs
    heads, kv_heads = int(attrs["heads"]), int(attrs["kv_heads"])
    return heads, kv_heads, bool(attrs.get("causal", False)), bool(attrs.get("final", True)), attrs.get("softmax_scale")


def scratch_bytes(node, sources, provider: str) -> int:
    """Lane scratch one attention vertex needs (the cublas provider's scores, output and log-sum-exp per
    chunk); a block of packed sequences, its largest sequence's (they run one after another on the lane)."""
    q, k = sources[0], sources[1]
    heads, kv_heads, _, _, _ = attention_attrs(node)
    d = q.shape[1] // heads
    if provider == "triton" and triton_takes(node, q):
        return 0
    if torch_runs(node, q.dtype, provider):  # torch's: no scratch
        return 0
    rows = max(stop - start for start, stop in segment_rows(node.attrs, q.shape[0]))
    tq, tk = (rows, rows) if "segments" in node.attrs else (q.shape[0], k.shape[0])
    item = DTYPE_BYTES[q.dtype]
    chunk = heads // kv_heads
    return chunk * (tq * tk * item + tq * d * item + tq * 4) + 3 * 256


def torch_runs(node, dtype: str, provider: str) -> bool:
    """Whether a torch provider's fused op runs this vertex (float16/bfloat16, no window), not cublas."""
    return provider not in ("cublas", "triton") and dtype in HALF and "window" not in node.attrs


TORCH_BASE = 8 << 20
"""What torch's attention takes once per GPU beside the libraries' base: on the H200 a process's first
plan with torch-cudnn and one lane held 7 MiB more than the triton provider's, beside that lane's own
(`TORCH_STREAM`; docs/benchmarks.md, "What the GPU holds beside the arena"; the GPU test's free-memory
bound checks it). `devices.library_allowance` adds it."""
TORCH_STREAM = 20 << 20
"""What torch-cudnn takes per stream it runs on beside the blocks: when it ran on each compute lane's
stream, each lane added 19 MiB plus half of its block's output and log-sum-exp (23 MiB for 8 MiB blocks,
35 MiB for 32 MiB blocks, from one to three lanes alike). It runs on one stream per GPU now."""


def library_bytes(node, sources, provider: str) -> int:
    """Memory torch holds on its attention stream for one attention vertex: `TORCH_STREAM`, half the block's
    output and log-sum-exp (what each stream added on the H200), and the expanded k and v when heads are
    grouped, whole (`TORCH_BASE` comes once per GPU too). A block of packed sequences counts the same: its
    batched call's outputs are the block's, and its calls one per sequence add up to it at most."""
    if not provider.startswith("torch") or sources[0].dtype not in HALF:
        return 0
    q, k = sources[0], sources[1]
    heads, kv_heads, _, _, _ = attention_attrs(node)
    item = DTYPE_BYTES[q.dtype]
    tq, width = q.shape
    expanded = 0 if heads == kv_heads else 2 * k.shape[0] * width * item
    return TORCH_STREAM + (tq * width * item + heads * tq * 4) // 2 + expanded



def _merge_kernel(out_dtype: str, has_prev: bool, final: bool, o_dtype: str, vector: bool = False):
    from numba.cuda import types

    element = {"float16": types.float16, "bfloat16": types.uint16, "float32": types.float32, "float64": types.float64}
    argtypes = (
        types.Array(element[o_dtype], 3, "A"),
        types.Array(types.float32, 2, "A"),
        types.Array(types.float32, 2, "A"),
        types.Array(element[out_dtype], 2, "C"),
        types.int64,
        types.int64,
    )
    return kn.attention_merge(out_dtype, has_prev, final, vector, o_dtype), argtypes


def _merge_quads(d: int, *arrays) -> bool:
    """Whether the merge may read and write these numba arrays (None: absent) with vector instructions."""
    return kn.merge_vector_ok(d) and arrays_rows_aligned(*arrays)


def cublas_plan(tq: int, tk: int, d: int, heads: int, kv_heads: int, dtype: str, causal: bool, windowed: bool = False):
    """What the unfused provider's block needs beside its operands: the scores GEMM (S = Q·Kᵀ per head of
    a group), the values GEMM (O = P·V) and the masked softmax kernel; one per block shape."""
    group = heads // kv_heads
    scores = GemmPlan(tq, tk, d, group, Matrix(tq, d, heads * d, d), Matrix(tk, d, kv_heads * d, 0, trans=True), Matrix(tq, tk, tk, tq * tk))
    values = GemmPlan(tq, d, tk, group, Matrix(tq, tk, tk, tq * tk), Matrix(tk, d, kv_heads * d, 0), Matrix(tq, d, d, tq * d))
    return scores, values, kn.attention_scores_softmax(dtype, causal, windowed)


def build_cublas(node, inputs, out, env: KernelEnv) -> Work:
    """The unfused provider: GEMMs through cuBLAS (numpy under the simulator) and numba kernels."""
    b = block_of(node, inputs)
    q, k, v, prev = b.q, b.k, b.v, b.prev
    heads, kv_heads, causal, final, scale = b.heads, b.kv_heads, b.causal, b.final, b.scale
    tq, tk, d = b.tq, b.tk, b.d
    group = heads // kv_heads
    dtype = dtype_name(q)
    item = DTYPE_BYTES[dtype]
    windowed = "window" in node.attrs
    window, offset = int(node.attrs.get("window", 0)), int(node.attrs.get("offset", 0))
    scores_plan, values_plan, softmax = env.cache.get("attention", ("cublas", tq, tk, d, heads, kv_heads, dtype, causal, windowed),
                                                      lambda: cublas_plan(tq, tk, d, heads, kv_heads, dtype, causal, windowed))

    def buffers(lane):
        scratch = env.scratch(lane)
        s_bytes, o_bytes = group * tq * tk * item, group * tq * d * item
        s_end = (s_bytes + 255) // 256 * 256
        o_end = s_end + (o_bytes + 255) // 256 * 256
        s = scratch[:s_bytes].view(device_dtype(dtype)).reshape(group, tq, tk)
        o = scratch[s_end : s_end + o_bytes].view(device_dtype(dtype)).reshape(group, tq, d)
        lse = scratch[o_end : o_end + group * tq * 4].view(np.float32).reshape(group, tq)
        return s, o, lse

    steps = {}

    def prepare(lane):
        s, o, lse = buffers(lane)
        plans = []
        for g in range(kv_heads):
            h0 = g * group
            first = env.gemm(scores_plan, q, k, s, alpha=scale, offsets=(h0 * d, g * d))
            second = env.gemm(values_plan, s, v, o, offsets=(0, g * d))
            plans.append((first, second))
        soft = env.launch(softmax, (group * tq,), (kn.ROW_THREADS,), (s, lse, offset, window))
        grid, block = kn.merge_grid(tq, group, d)
        vector = env.vector_loads and _merge_quads(d, o, out, prev)
        merge = kn.attention_merge(dtype_name(out), prev is not None, final, vector, dtype)
        merges = [env.launch(merge, grid, block, (o, lse, prev if prev is not None else lse, out, g * group, heads)) for g in range(kv_heads)]
        return plans, soft, merges

    def work(lane):
        if lane not in steps:
            steps[lane] = prepare(lane)
        plans, soft, merges = steps[lane]
        stream = env.launch_streams[lane]
        for (first, second), merge_go in zip(plans, merges):
            first(lane)
            soft(stream)
            second(lane)
            merge_go(stream)

    work.prepare = lambda lane: steps.setdefault(lane, prepare(lane))
    return work


TORCH_OPS = {
    "torch-cudnn": lambda torch, q, k, v, causal, scale: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale),
    "torch-flash": lambda torch, q, k, v, causal, scale: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale),
    "torch-efficient": lambda torch, q, k, v, causal, scale: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale),
}


def build_torch(node, inputs, out, env: KernelEnv, provider: str, batch: int = 1) -> Work:
    """A fused torch op per block on the lane's stream, then the numba merge into the arena. `batch` > 1:
    the block is that many causal blocks of equal rows one after another (packed sequences), run as one
    batched op and merged block by block."""
    import torch

    b = block_of(node, inputs)
    q, k, v, prev = b.q, b.k, b.v, b.prev
    heads, kv_heads, causal, final, scale = b.heads, b.kv_heads, b.causal, b.final, b.scale
    tq, tk, d = b.tq, b.tk, b.d
    rows = tq // batch
    device = torch.device("cuda", env.device_of(node))
    q4, k4, v4 = (heads_view(x, count, length, d, device, batch) for x, count, length in ((q, heads, tq), (k, kv_heads, tk), (v, kv_heads, tk)))
    group = heads // kv_heads
    op = TORCH_OPS[provider]
    grid, block = kn.merge_grid(rows, heads, d)
    spans = [(s * rows, (s + 1) * rows) for s in range(batch)]
    arena_quads = all(_merge_quads(d, out[a:z], None if prev is None else prev[a:z]) for a, z in spans)  # o: per call
    key = (dtype_name(out), prev is not None, final, dtype_name(q), arena_quads, grid, block)
    merges = env.cache.get("merge", key, lambda: {
        vector: compiled_launch(*_merge_kernel(dtype_name(out), prev is not None, final, dtype_name(q), vector), grid, block)
        for vector in ({False, True} if arena_quads else {False})})
    targets = [(_array_params(out[a:z], out.dtype.itemsize), None if prev is None else _array_params(prev[a:z], 4)) for a, z in spans]
    tail = [ctypes.c_int64(0), ctypes.c_int64(heads)]

    def fused():
        keys, values = k4, v4
        if group > 1:
            keys = k4.repeat_interleave(group, dim=1)
            values = v4.repeat_interleave(group, dim=1)
        return op(torch, q4, keys, values, causal, scale)

    def block(launch_stream):  # after the lane's work so far (its waits on q, k, v, prev included)
        result = fused()
        for s, (out_params, prev_params) in enumerate(targets):
            o, lse = result[0][s], result[1][s]
            if lse.dim() == 3:
                lse = lse[..., 0]
            lse = lse[:, :rows]
            o_strides = tuple(x * o.element_size() for x in o.stride())
            o_params = array_args(o.data_ptr(), tuple(o.shape), o_strides, o.element_size())
            lse_params = array_args(lse.data_ptr(), tuple(lse.shape), tuple(x * 4 for x in lse.stride()), 4)
            vector = arena_quads and kn.rows_aligned(o.data_ptr(), o_strides, o.element_size())
            merges[vector](launch_stream, o_params + lse_params + (prev_params or lse_params) + out_params + tail)

    def work(lane):
        on_attention_stream(env, node, lane, block)

    def warm(lane):
        """Run only the fused op (it reads q, k, v and writes torch's own memory): fills torch's caches."""
        on_attention_stream(env, node, lane, lambda _launch: fused())

    work.warm = warm
    work.per_gpu = env.attention_stream(env.device_of(node)) is not None  # warmed on the GPU's attention stream, whichever lane
    work.signature = (provider, q.shape, k.shape, causal, heads, kv_heads, str(q.dtype), batch)
    return work


def _array_params(array, itemsize: int):
    """A device view's kernel parameters (its pointer, shape and strides), for a compiled launch."""
    return array_args(device_pointer(array), array.shape, array.strides, itemsize)


def heads_view(array, count: int, rows: int, d: int, device, batch: int = 1):
    """torch's view of an arena view [rows, heads*d], heads strided, no copy: [1, heads, rows, d], or for
    `batch` blocks of equal rows one after another (packed sequences) [batch, heads, rows / batch, d]."""
    if batch == 1:
        return torch_view(array, device).view(rows, count, d).transpose(0, 1).unsqueeze(0)
    return torch_view(array, device).view(batch, rows // batch, count, d).transpose(1, 2)


def on_attention_stream(env: KernelEnv, node, lane: int, body) -> None:
    """`body(launch_stream)` on the stream torch's attention runs on for `lane`: the GPU's shared one (after
    the lane's work so far, the lane waiting for it), or with TURNIP_ATTENTION_STREAM=lane the lane's own."""
    import torch

    shared = env.attention_stream(env.device_of(node))
    if shared is not None:
        shared.run(env.torch_stream(lane), lambda: body(shared.launch))
        return
    with torch.cuda.stream(env.torch_stream(lane)):
        body(env.launch_streams[lane])


def warm_up(works: list, graph) -> list[int]:
    """Each distinct attention block shape once per compute lane, or once per GPU for work that runs on the
    GPU's attention stream (`work.per_gpu`; `works`: every vertex's work); then cap torch's allocator where
    it is. Returns torch's count of segments allocated per GPU."""
    import torch

    seen = set()
    segments = []
    for vertex, whole in enumerate(works):
        for work in getattr(whole, "parts", (whole,)):  # a packed block's sub-blocks, each warmed as a block
            signature = getattr(work, "signature", None)
            if signature is None:
                continue
            for index, lane in enumerate(graph.lanes):
                key = (signature, ("gpu", lane.device) if getattr(work, "per_gpu", False) else index)
                if lane.kind == "compute" and lane.device == graph.node(vertex).device and key not in seen:
                    seen.add(key)
                    work.warm(index)
    for device in range(graph.memgraph.devices):
        torch.cuda.synchronize(device)
        stats = torch.cuda.memory_stats(device)
        segments.append(stats.get("segment.all.allocated", 0))
        total = torch.cuda.get_device_properties(device).total_memory
        reserved = torch.cuda.memory_reserved(device)
        torch.cuda.set_per_process_memory_fraction(min(1.0, (reserved + (1 << 20)) / total), device)
    return segments


def segments_allocated(devices: int) -> list[int]:
    """torch's count of device segments allocated so far, per GPU (the loop must add none)."""
    import torch

    return [torch.cuda.memory_stats(d).get("segment.all.allocated", 0) for d in range(devices)]


def release(provider: str, devices: int) -> None:
    """Lift the cap on torch's allocator (after a run, or before warming a new graph up)."""
    if not uses_torch(provider):
        return
    import torch

    for device in range(devices):
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def build_triton(node, inputs, out, env: KernelEnv) -> Work:
    """One Triton kernel per block: attention and the fold into the packed partial (attention_triton.py)."""
    import torch

    from runtime.backends.cuda import attention_triton

    b = block_of(node, inputs)
    device = torch.device("cuda", env.device_of(node))
    q, k, v, prev, target = (None if x is None else torch_view(x, device) for x in (b.q, b.k, b.v, b.prev, out))
    config = attention_triton.default_config(b.d)  # read once, when the vertex is built: a bad value fails here
    args = (q, k, v, prev, target, b.heads, b.kv_heads, b.causal, b.final, b.scale, config)

    def work(lane):
        with torch.cuda.stream(env.torch_stream(lane)):
            attention_triton.launch(*args)

    def warm(lane):
        with torch.cuda.stream(env.torch_stream(lane)):
            attention_triton.warm(*args)

    work.warm = warm
    work.signature = ("triton", tuple(q.shape), tuple(k.shape), b.causal, b.final, b.prev is not None, b.heads, b.kv_heads, str(q.dtype), config)
    return work


def build(node, inputs, out, env: KernelEnv) -> Work | None:
    if any(x is None for x in inputs) or out is None:
        return None  # an empty block
    if "segments" in node.attrs:
        return build_segmented(node, inputs, out, env)
    provider = env.attention
    if provider == "triton" and triton_takes(node, inputs[0]):
        return build_triton(node, inputs, out, env)
    if not torch_runs(node, dtype_name(inputs[0]), provider):
        return build_cublas(node, inputs, out, env)  # torch's fused ops take half precision only, and no window here
    return build_torch(node, inputs, out, env, provider)


def build_segmented(node, inputs, out, env: KernelEnv) -> Work:
    """A causal block of packed sequences (`segments`): a causal block per sequence on its rows of every
    operand and of out, one after another on the lane, through `build`; under torch, sequences all of one
    length as one batched call. The work's `parts` are the sub-blocks' works (warm_up warms each)."""
    spans = segment_rows(node.attrs, int(inputs[0].shape[0]))
    one = replace(node, attrs={name: value for name, value in node.attrs.items() if name != "segments"})
    if torch_runs(one, dtype_name(inputs[0]), env.attention) and len({z - a for a, z in spans}) == 1:
        return build_torch(one, inputs, out, env, env.attention, batch=len(spans))
    parts = [build(one, [x[a:z] for x in inputs], out[a:z], env) for a, z in spans]

    def work(lane):
        for part in parts:
            part(lane)

    work.parts = parts
    return work


def build_decode(node, inputs, out, env: KernelEnv) -> Work | None:
    """`decode_attention`: one numba launch for the whole batch (kernels_numba.decode_attention); every
    provider takes it, since the fused ops are built for query blocks, not single rows."""
    if any(x is None for x in inputs[:3]) or out is None:
        return None  # an empty block
    q, k, v, lengths = inputs[:4]
    prev = inputs[4] if len(inputs) > 4 else None
    attrs = node.attrs
    heads, kv_heads = int(attrs["heads"]), int(attrs["kv_heads"])
    own, final = bool(attrs.get("own", False)), bool(attrs.get("final", True))
    d = int(q.shape[1]) // heads
    if d > kn.DECODE_MAX_D:
        raise KernelError(f"node {node.id}: decode_attention takes heads of at most {kn.DECODE_MAX_D} elements on cuda, got {d}")
    if own:  # each sequence's own new key: a one-row block
        k, v = (x.reshape(1, int(x.shape[0]), int(x.shape[1])) for x in (k, v))
    scale = float(softmax_scale(tuple(int(x) for x in q.shape), attrs))
    window = int(attrs.get("window", 0))
    vector = env.vector_loads and _merge_quads(d, k, v)  # the head width in quads, every row aligned
    kernel = kn.decode_attention(dtype_name(q), dtype_name(out), prev is not None, final, own, "window" in attrs, vector)
    args = (q, k, v, lengths, prev if prev is not None else q, out, heads, kv_heads, d, scale, int(attrs.get("start", 0)), window)
    go = env.launch(kernel, (int(q.shape[0]) * heads,), (kn.DECODE_THREADS,), args)
    return lambda lane: go(env.launch_streams[lane])


def triton_takes(node, q) -> bool:
    """Whether the triton provider's kernel takes this vertex (else it runs on cublas); `q` is its first
    operand, an array or a taskgraph node (anything with a shape and a dtype)."""
    from runtime.backends.cuda import attention_triton

    if "window" in node.attrs:  # its kernel masks no window: the block runs on cublas
        return False
    heads, kv_heads, _, _, _ = attention_attrs(node)
    return attention_triton.supported(heads, kv_heads, int(q.shape[1]) // heads, dtype_name(q))


def torch_view(array, device):
    """A torch tensor over an arena view, with no copy (asserted: a copy would be written to in vain)."""
    import torch

    bfloat16 = dtype_name(array) == "bfloat16"
    if bfloat16:  # uint16 words: handed over as float16 (a dtype every torch imports), then reinterpreted
        array = array.view(np.float16)
    tensor = torch.as_tensor(array, device=device)
    assert tensor.data_ptr() == device_pointer(array), "torch copied an arena view"
    return tensor.view(torch.bfloat16) if bfloat16 else tensor

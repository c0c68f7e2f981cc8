"""The cuda backend's kernel builders: for each kernel of the table, how to build a vertex's launch.

`build_work(node, inputs, out, env)` returns `work(lane)`, which queues the vertex's kernels on the
lane's stream (inputs and out are device views of the arena; None for zero-size tensors, where there is
nothing to do). `env` is a `KernelEnv` (services.py): all a builder may ask of the backend. Everything that does not depend on the lane (plans, parameter blocks, compiled kernels)
is resolved when the work is built, in `prepare`. A kernel of the table without an entry here is refused
in `prepare` with a one-line `KernelError` naming it (`missing_kernels()` lists them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.backends.cuda import attention, attention_grad
from runtime.backends.cuda import kernels_numba as kn
from runtime.backends.cuda import kernels_train as kt
from runtime.backends.cuda.gemm import GemmPlan, plan_einsum
from runtime.backends.cuda.memory import dtype_name
from runtime.backends.cuda.vector import aligned, arrays_rows_aligned
from turnip_ir.errors import KernelError
from turnip_ir.kernels import KERNELS

if TYPE_CHECKING:  # services.py stands above the builders (through devices.py): its types only, for checking
    from runtime.backends.cuda.services import KernelEnv, Work


def _flat(array):
    return array.reshape(array.size)


def _row_count(array) -> tuple[int, int]:
    """(rows, cols) of `array` viewed as rows of its last axis."""
    cols = tuple(array.shape)[-1]
    return array.size // cols, cols


def _vector(env: KernelEnv, *arrays, cols: int = 4) -> bool:
    """Whether a kernel may read and write these arrays by quads (`vector.load4`): vector loads allowed,
    every operand aligned to four elements and, for row kernels, rows of a multiple of four."""
    return env.vector_loads and cols % 4 == 0 and aligned(*arrays)


def gemm_plan(env: KernelEnv, equation: str, inputs) -> GemmPlan | None:
    """`plan_einsum` of the operands' shapes, made once per (equation, shapes) (`env.cache`)."""
    shapes = tuple(tuple(x.shape) for x in inputs)
    return env.cache.get("gemm", (equation, shapes), lambda: plan_einsum(equation, list(shapes)))


def build_matmul(node, inputs, out, env: KernelEnv) -> Work:
    plan = gemm_plan(env, "ij,jk->ik", inputs)
    return env.gemm(plan, inputs[0], inputs[1], out)


def build_einsum(node, inputs, out, env: KernelEnv) -> Work:
    """A GEMM when the einsum is a (batched) matrix product, else `env.einsum` in the lane's scratch."""
    equation = node.attrs["equation"]
    plan = gemm_plan(env, equation, inputs) if len(inputs) == 2 else None
    if plan is not None:
        return env.gemm(plan, inputs[0], inputs[1], out)
    return env.einsum(equation, inputs, out)


def einsum_scratch(node, sources) -> int:
    """Scratch an einsum that is no GEMM needs: room for cupy's temporaries (a generous bound)."""
    shapes = [tuple(s.shape) for s in sources]
    if len(shapes) == 2 and plan_einsum(node.attrs["equation"], shapes) is not None:
        return 0
    return 4 * (node.nbytes + sum(s.nbytes for s in sources)) + 4096


def build_unary(node, inputs, out, env: KernelEnv) -> Work:
    x = _flat(inputs[0])
    factor = float(node.attrs.get("factor", 1.0))
    blocks, threads = kn.element_grid(out.size)
    kernel = kn.unary(node.kernel, node.dtype, _vector(env, x, out))
    go = env.launch(kernel, blocks, threads, (x, _flat(out), factor))
    return lambda lane: go(env.launch_streams[lane])


def build_binary(node, inputs, out, env: KernelEnv) -> Work:
    a, b = inputs
    dtype = node.dtype  # the taskgraph's name: a bfloat16 view's own dtype is uint16
    blocks, threads = kn.element_grid(out.size)
    if tuple(a.shape) == tuple(b.shape) == tuple(out.shape):
        kernel = kn.binary_same(node.kernel, dtype, _vector(env, a, b, out))
        go = env.launch(kernel, blocks, threads, (_flat(a), _flat(b), _flat(out)))
    else:
        folded = kn.broadcast_strides(tuple(out.shape), tuple(a.shape), tuple(b.shape))
        if folded is None:
            raise KernelError(f"{node.kernel} broadcasts {list(a.shape)} with {list(b.shape)} over more than 4 dimensions, which the cuda backend does not")
        (d1, d2, d3), sa, sb = folded
        args = (_flat(a), _flat(b), _flat(out), d1, d2, d3, *sa, *sb)
        go = env.launch(kn.binary_broadcast(node.kernel, dtype), blocks, threads, args)
    return lambda lane: go(env.launch_streams[lane])


def build_softmax(node, inputs, out, env: KernelEnv) -> Work:
    rows, cols = _row_count(out)
    kernel = kn.softmax(node.dtype, _vector(env, inputs[0], out, cols=cols))
    go = env.launch(kernel, rows, kn.ROW_THREADS, (_flat(inputs[0]), _flat(out), cols))
    return lambda lane: go(env.launch_streams[lane])


def build_rmsnorm(node, inputs, out, env: KernelEnv) -> Work:
    rows, cols = _row_count(out)
    weighted = len(inputs) == 2
    weight = inputs[1] if weighted else _flat(inputs[0])
    eps = float(KERNELS["rmsnorm"].attr(node.attrs, "eps"))
    kernel = kn.rmsnorm(node.dtype, weighted, _vector(env, inputs[0], weight, out, cols=cols))
    go = env.launch(kernel, rows, kn.ROW_THREADS, (_flat(inputs[0]), weight, _flat(out), cols, eps))
    return lambda lane: go(env.launch_streams[lane])


def build_rope(node, inputs, out, env: KernelEnv) -> Work:
    x, cos, sin = inputs
    width = tuple(cos.shape)[1]
    vector = env.vector_loads and kn.rope_vector(width) and arrays_rows_aligned(x, cos, sin, out)
    blocks, threads = kn.rope_grid(tuple(x.shape)[0], width, vector)
    go = env.launch(kn.rope(node.dtype, vector), blocks, threads, (x, cos, sin, out))
    return lambda lane: go(env.launch_streams[lane])


def build_rows(node, inputs, out, env: KernelEnv) -> Work:
    """x[start:stop] along axis 0: one contiguous device-to-device copy on the lane's stream."""
    start, stop = node.attrs["start"], node.attrs["stop"]
    return env.copy(inputs[0][start:stop], out)


def build_concat(node, inputs, out, env: KernelEnv) -> Work:
    """The operands stacked along axis 0: one device-to-device copy each, into consecutive rows of `out`."""
    copies, row = [], 0
    for x in inputs:
        rows = tuple(x.shape)[0]
        if rows:
            copies.append(env.copy(x, out[row : row + rows]))
        row += rows

    def work(lane: int) -> None:
        for copy in copies:
            copy(lane)

    return work


def build_swiglu(node, inputs, out, env: KernelEnv) -> Work:
    gate, up = inputs
    blocks, threads = kn.element_grid(out.size)
    kernel = kn.swiglu(node.dtype, _vector(env, gate, up, out))
    go = env.launch(kernel, blocks, threads, (_flat(gate), _flat(up), _flat(out)))
    return lambda lane: go(env.launch_streams[lane])


# ----- training (docs/training.md): kernels_train.py, attention_grad.py --------------------------------------
def build_cast(node, inputs, out, env: KernelEnv) -> Work:
    x = _flat(inputs[0])
    kernel = kt.cast(dtype_name(x), node.dtype, _vector(env, x, out))
    go = env.launch(kernel, *kn.element_grid(out.size), (x, _flat(out)))
    return lambda lane: go(env.launch_streams[lane])


def build_swiglu_grad(node, inputs, out, env: KernelEnv) -> Work:
    flat = [_flat(x) for x in (*inputs, out)]
    kernel = kt.swiglu_grad(node.dtype, _vector(env, *flat))
    go = env.launch(kernel, *kn.element_grid(out.size), tuple(flat))
    return lambda lane: go(env.launch_streams[lane])


def build_rmsnorm_grad(node, inputs, out, env: KernelEnv) -> Work:
    rows, cols = _row_count(out)
    x, dy = _flat(inputs[0]), _flat(inputs[-1])
    weighted = len(inputs) == 3
    weight = inputs[1] if weighted else x
    eps = float(KERNELS["rmsnorm_grad"].attr(node.attrs, "eps"))
    kernel = kt.rmsnorm_grad(node.dtype, weighted, _vector(env, x, weight, dy, out, cols=cols))
    go = env.launch(kernel, rows, kn.ROW_THREADS, (x, weight, dy, _flat(out), cols, eps))
    return lambda lane: go(env.launch_streams[lane])


def build_attention_unpack(node, inputs, out, env: KernelEnv) -> Work:
    packed = inputs[0]
    width, stride = int(out.shape[1]), int(packed.shape[1])
    vector = _vector(env, packed, out, cols=width) and stride % 4 == 0
    go = env.launch(kt.attention_unpack(node.dtype, vector), *kn.element_grid(out.size), (_flat(packed), _flat(out), width, stride))
    return lambda lane: go(env.launch_streams[lane])


def build_xent(node, inputs, out, env: KernelEnv) -> Work:
    logits, labels = inputs[:2]
    rows, cols = _row_count(logits)
    prev = _flat(inputs[2]) if len(inputs) == 3 else _flat(out)
    kernel = kt.xent(dtype_name(logits), node.dtype, len(inputs) == 3, _vector(env, logits, cols=cols))
    start = int(KERNELS["xent"].attr(node.attrs, "start"))
    go = env.launch(kernel, rows, kn.ROW_THREADS, (_flat(logits), labels, prev, _flat(out), cols, start))
    return lambda lane: go(env.launch_streams[lane])


def build_xent_loss(node, inputs, out, env: KernelEnv) -> Work:
    stats, labels = inputs
    go = env.launch(kt.xent_loss(node.dtype), 1, kn.ROW_THREADS, (_flat(stats), labels, out))
    return lambda lane: go(env.launch_streams[lane])


def build_xent_grad(node, inputs, out, env: KernelEnv) -> Work:
    logits, labels, stats, total = inputs[:4]
    rows, cols = _row_count(logits)
    scale = inputs[4] if len(inputs) == 5 else total
    spec = KERNELS["xent_grad"]
    kernel = kt.xent_grad(node.dtype, dtype_name(stats), len(inputs) == 5, _vector(env, logits, out, cols=cols))
    args = (_flat(logits), labels, _flat(stats), total, scale, _flat(out), cols, int(spec.attr(node.attrs, "start")),
            float(spec.attr(node.attrs, "factor")))
    go = env.launch(kernel, rows, kn.ROW_THREADS, args)
    return lambda lane: go(env.launch_streams[lane])


BUILDERS: dict[str, Callable] = {
    "matmul": build_matmul,
    "einsum": build_einsum,
    "add": build_binary,
    "sub": build_binary,
    "mul": build_binary,
    "relu": build_unary,
    "gelu": build_unary,
    "silu": build_unary,
    "exp": build_unary,
    "scale": build_unary,
    "softmax": build_softmax,
    "rmsnorm": build_rmsnorm,
    "rope": build_rope,
    "swiglu": build_swiglu,
    "rows": build_rows,
    "concat": build_concat,
    "attention": attention.build,
    "decode_attention": attention.build_decode,
    "cast": build_cast,
    "rmsnorm_grad": build_rmsnorm_grad,
    "swiglu_grad": build_swiglu_grad,
    "attention_unpack": build_attention_unpack,
    "attention_grad": attention_grad.build,
    "xent": build_xent,
    "xent_loss": build_xent_loss,
    "xent_grad": build_xent_grad,
}
"""Kernel name -> builder. Names not (yet) in the kernel table are harmless."""

SCRATCH: dict[str, Callable] = {
    "einsum": lambda node, sources, provider: einsum_scratch(node, sources),
    "attention": attention.scratch_bytes,
    "attention_grad": attention_grad.scratch_bytes,
}
"""Kernels that need lane scratch: name -> bytes(node, source nodes, attention provider)."""


LIBRARY: dict[str, Callable] = {
    "attention": attention.library_bytes,
    "attention_grad": attention_grad.library_bytes,
}
"""Kernels whose libraries hold memory of their own per lane (torch's caching allocator): name -> bytes."""


def library_bytes(node, sources, provider: str) -> int:
    rule = LIBRARY.get(node.kernel)
    return rule(node, sources, provider) if rule else 0


def missing_kernels() -> list[str]:
    """Kernels of the table that the cuda backend cannot run."""
    return sorted(name for name in KERNELS if name not in BUILDERS)


def build_work(node, inputs, out, env: KernelEnv) -> Work | None:
    """The vertex's launch, or None when it has nothing to do (a zero-size output)."""
    builder = BUILDERS.get(node.kernel)
    if builder is None:
        raise KernelError(f"kernel '{node.kernel}' has no cuda implementation (node {node.id} '{node.task}'); run it with --backend cpu")
    if out is None:
        return None
    if node.kernel == "concat":  # an empty operand adds no rows: nothing to copy (None views have no rows)
        inputs = [x for x in inputs if x is not None]
    elif any(x is None for x in inputs):
        raise KernelError(f"node {node.id} '{node.task}': {node.kernel} of an empty operand into a non-empty result is not supported on cuda")
    return builder(node, inputs, out, env)


def scratch_bytes(node, sources, provider: str) -> int:
    rule = SCRATCH.get(node.kernel)
    return rule(node, sources, provider) if rule else 0

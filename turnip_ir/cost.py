"""The cost model: how long a memgraph vertex takes on a GPU, fitted to the H200 (bench/fit_cost.py).

The sim backend uses it as its clock, and the `nondet` policy uses it for critical-path priorities.
A kernel costs max(FLOPs / GEMM rate, bytes read and written / HBM bandwidth) plus a launch overhead (an
attention block of packed sequences: its FLOPs per sequence, a launch per call it takes);
a transfer costs its bytes over the link that carries it (H2D, D2H, or the peer link for a move). The
runtime's event loop costs host time per vertex, which the sim backend serializes. The defaults are
measured rates where a benchmark or a trace gives one, and the figures fitted to the measured makespans of
the benchmark matrix (launch, host_per_attention): docs/runtime.md, "The cost model", says which is which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from weakref import WeakKeyDictionary

from turnip_ir.kernels import KERNELS, segment_rows
from turnip_ir.memgraph import MemGraph, MemNode


@dataclass(frozen=True)
class CostModel:
    """Rates in bytes/s and FLOP/s, times in seconds; defaults are the H200's (bench/fit_cost.py)."""

    h2d_bw: float = 55.4e9
    """Pinned 1 GiB copies (bench_cuda.py ceilings); the FFN trace's 512 MiB reloads ran at 55.5."""
    d2h_bw: float = 55.3e9
    duplex_bw: float = 100.5e9
    """Total host-link bandwidth when H2D and D2H run at once (bench_cuda.py ceilings); the sim backend
    shares it between them."""
    peer_bw: float = 360e9
    """Achieved by the cuda backend's peer copies on two H200s over NV18, on 64 MiB tiles, against a
    ceiling measured beside them; the rate on the larger tiles of the 49152^3 matmul and the sim's error
    there are in docs/benchmarks-log.md, "Two GPUs". Kept at the smaller tiles' rate, nearer the llama
    moves' sizes."""
    hbm_bw: float = 4124e9
    """Bytes read plus bytes written per second (bench_cuda.py ceilings: a device-to-device copy)."""
    fp32_flops: float = 50.5e12
    half_flops: float = 701e12
    """fp16 and bf16 GEMM rate as a pipeline gets it: the GEMMs of the H200 FFN trace, their FLOPs over
    the time some stream ran one (bench/fit_cost.py, `trace_gemm_rate`); an 8192^3 GEMM alone runs 782."""
    attention_flops: float = 488e12
    """fp16 full (off-diagonal) attention blocks as the cuda backend runs them (cuDNN's fused op plus the
    merge into the packed partial): 712 blocks of 7b at 32k / 8 GiB that ran with no other kernel beside
    them, in the fixed order's trace (bench/investigations/kernel_rates.py; docs/benchmarks-log.md, the
    seventh session of 2026-12-03). Until then one rate for full and causal blocks, 500, fitted to the
    makespans with the overlap loss."""
    causal_attention_flops: float = 366e12
    """fp16 causal (diagonal) blocks, the last of each query block's row (they also fold the partial and
    write the output), at half a block's FLOPs as the kernels' table counts them: 514 blocks alone in the
    fixed traces of 7b at 8k, 32k and 128k (366-372; kernel_rates.py). A diagonal block takes 0.67 of a
    full block's time for half its work: the mask's tiles and the final merge."""
    memory_efficiency: tuple[tuple[str, float], ...] = (("rmsnorm", 0.54), ("rope", 0.57))
    """The share of `hbm_bw` that these kernels reach on llama's blocks (4096 tokens by 4096), where the
    others reach about all of it: their kernels alone in the same traces (rmsnorm 0.52-0.58 over 812
    kernels). Rope reached 0.30-0.36 element by element (278 kernels alone, nondet traces too), three
    times slower than `hbm_bw` said; by quads (runtime/backends/cuda/kernels_numba.py `rope`, since the
    seventh session of 2026-12-03) 0.57 (77 kernels alone in both orders' traces of 32k / 8 GiB)."""
    triton_attention_flops: float = 390e12
    """fp16 full attention blocks under the `triton` provider (one kernel per block, no merge), what
    `for_attention("triton")` prices them at: 725 blocks of 7b at 32k / 8 GiB that ran alone in the fixed
    order's trace (kernel_rates.py; docs/benchmarks-log.md, the seventh session of 2026-12-03). Until then
    409, one rate for full and causal blocks, fitted to a 32k makespan against torch-cudnn's."""
    triton_causal_attention_flops: float = 332e12
    """The same for its causal (diagonal) blocks, at half a block's FLOPs: 256 blocks alone in that trace.
    Triton's diagonal block takes 0.59 of its full block's time (torch-cudnn's 0.67); queued alone (docs/
    runtime.md, "Attention providers") it runs 0.80 of its full blocks' rate."""
    attention_grad_flops: float = 400e12
    """fp16 and bf16 `attention_grad` blocks off the diagonal, in FLOPs of the whole fused backward (S, dP,
    dV, dQ and dK: 10 tq tk width, `fused_backward_flops`) per second: on a GPU each link, wrt q or wrt kv,
    runs torch's fused backward of its block and keeps the gradients it is for (runtime/backends/cuda/
    attention_grad.py), so both chains' links take one block's backward. A prior, not a measurement:
    cuDNN's fused forward ran 655 TFLOP/s on these blocks (docs/hardware.md) and a backward does about 0.6 of its
    forward's rate; bench/bench_train.py's `kernels` section measures it."""
    causal_attention_grad_flops: float = 300e12
    """The same for causal (diagonal) blocks, at half the FLOPs: a prior of 0.75 of the full blocks' rate,
    as the forward's diagonal blocks run at 0.75 of its full ones'."""
    decode_attention_bw: float = 0.92e12
    """Bytes per second of the cuda backend's `decode_attention` launches (its operands and output over its
    time): 7b, B = 16, two 1024-row columns a layer, 64 such launches plus 32 one-row ones took 18.9 ms for
    about 17.2 GB on the H200 (docs/benchmarks-log.md, the third sitting of 2026-12-02). One block per
    (sequence, head) reads its rows by warps, a quarter of HBM's rate; at `hbm_bw` the sim had a 7b decode
    step's resident layers finish three times sooner than measured."""
    fp64_flops: float = 0.8e12
    overlap_efficiency: float = 1.0
    """The share of one GPU's throughput that k > 1 kernels running at once on its compute streams get
    together: each drains at overlap_efficiency / k (alone, at 1). With the kernel rates above measured on
    kernels that ran alone, 1.0: two of llama's kernels at once run as fast together as one after the
    other. The traces say slightly more (over the GPU's busy time the kernels of 7b at 8k, 32k and 128k did
    1.004-1.033 of this model's work per second, where two ran at once 22-91% of it: overlap_trace.py), but
    at 1.03 the sim put nondet at 32k / 8 GiB 4-7% fast, where the GPU idled 49 ms waiting for the loop
    (GPU-side gaps the sim does not make); over bench/fit_cost.py's 80 points 1.0 is within 5% at 78, 0.97
    at 73, 1.015 at 76, 1.03 at 72 (bench/investigations/model_scan.py). Until the per-kernel rates were
    measured it was 0.95, fitted with one attention rate: it stood for the diagonal blocks and the slow rope
    and rmsnorm, whose time it charged only where kernels overlapped."""
    launch: float = 3.1e-6
    """Per-kernel cost beside its work, on the GPU, fitted (3.07 us). The launch's host time is
    `host_per_vertex`; queued ahead, dependent GEMMs start 3.0 us apart (bench_cuda.py lookahead), the
    fit's floor. Without the floor a first fit (started at 10 us, attention at 460) drifted to 1 us, each
    step lowering the worst error by 0.04-0.2 points: a launch that short would stand for other errors."""
    host_per_vertex: float = 44.2e-6
    """Seconds of the runtime's event loop per vertex (choosing it, launching it, handling its completion):
    the 100,000-vertex stress test of bench_cuda.py notifiers, nondet, hostfunc-side. The loop is one
    thread, so these add up: the sim backend serializes them on a host clock."""
    host_per_attention: float = 240e-6
    """Seconds of the loop beside `host_per_vertex` for an fp16/bf16 `attention` vertex, whose launch goes
    through torch (cuDNN's fused op, its stream and tensor views) and then the merge kernel. Fitted to one
    point, llama 7b at 32k / 1 GiB in 2048-token blocks (the seventh sitting, 2026-12-03;
    docs/benchmarks-log.md): 4,352 attention links of about 150 us of GPU work each, where the loop, not
    the GPU, sets the pace. Without it the sim predicted that run 25-30% fast and ranked 2048-token blocks
    above 4096 (measured 2.21 s against 1.58 s); with 4096-token links (about 575 us) it hides behind the GPU."""
    batched_segments: bool = True
    """Whether an attention block of packed sequences that are all of one length runs as one call (torch's
    fused ops take them as a batch: runtime/backends/cuda/attention.py); else, and for uneven ones, one
    call per sequence, each with its launch and its `host_per_attention`."""
    notify_latency: float = 36.2e-6
    """Seconds from a vertex's end on the GPU to the loop learning of it: the same section's chain of tiny
    kernels run one at a time (83.3 us a vertex) less the loop's time and the launch gap."""

    def for_attention(self, provider: str) -> CostModel:
        """This model for a run whose attention blocks go through `provider` (a resolved cuda provider):
        `triton` has its own rates (full and causal blocks); torch's fused ops are priced at `attention_flops` and
        `causal_attention_flops`, as is `cublas`,
        which runs about 5x slower (not modelled: the sim ranks no plan for it)."""
        if provider == "triton":
            return replace(self, attention_flops=self.triton_attention_flops, causal_attention_flops=self.triton_causal_attention_flops,
                           batched_segments=False)
        return self

    def attention_calls(self, node: MemNode) -> int:
        """The calls the cuda backend makes for an `attention` vertex: one, or for a block of packed
        sequences (`segments`) one per sequence unless they are of one length and `batched_segments`."""
        if "segments" not in node.attrs:
            return 1
        rows = segment_rows(node.attrs, node.shape[0])
        return 1 if self.batched_segments and len({stop - start for start, stop in rows}) == 1 else len(rows)

    def flop_rate(self, dtype: str) -> float:
        if dtype in ("float16", "bfloat16"):
            return self.half_flops
        return self.fp64_flops if dtype == "float64" else self.fp32_flops

    def kernel_time(self, node: MemNode, inputs: list[MemNode]) -> float:
        spec = KERNELS[node.kernel]
        shapes = [tuple(src.shape) for src in inputs]
        flops = spec.flops(shapes, tuple(node.shape), node.attrs)
        traffic = node.nbytes + sum(src.nbytes for src in inputs)
        # the rate of the operands' dtype: a non-final attention multiplies fp16 into a float32 partial
        dtype = inputs[0].dtype if inputs else node.dtype
        causal = node.attrs.get("causal", False)
        if _half_attention(node, inputs) and node.kernel == "attention_grad":
            flops = fused_backward_flops(shapes, node.attrs)
            rate = self.causal_attention_grad_flops if causal else self.attention_grad_flops
        elif _half_attention(node, inputs):
            rate = self.causal_attention_flops if causal else self.attention_flops
        else:
            rate = self.flop_rate(dtype)
        if node.kernel == "decode_attention":
            return max(flops / rate, traffic / self.decode_attention_bw) + self.launch
        launches = self.attention_calls(node) if node.kernel == "attention" else 1
        return max(flops / rate, traffic / (self.hbm_bw * self.memory_share(node.kernel))) + self.launch * launches

    def memory_share(self, kernel: str) -> float:
        """The share of `hbm_bw` that `kernel` reaches (`memory_efficiency`; 1 for kernels it does not name)."""
        return next((share for name, share in self.memory_efficiency if name == kernel), 1.0)

    def host_time(self, node: MemNode, inputs: list[MemNode]) -> float:
        """Seconds of the runtime's loop to submit `node` and handle its completion."""
        if node.op == "kernel" and _half_attention(node, inputs):
            return self.host_per_vertex + self.host_per_attention * self.attention_calls(node)
        return self.host_per_vertex

    def duration(self, node: MemNode, inputs: list[MemNode]) -> float:
        """Seconds the vertex occupies its resource when it has the link or the GPU to itself."""
        if node.op == "kernel":
            return self.kernel_time(node, inputs)
        if node.op == "move":
            return node.nbytes / self.peer_bw
        if node.op == "reload":
            return node.nbytes / self.h2d_bw
        if node.op == "offload":
            return node.nbytes / self.d2h_bw
        return 0.0


_DURATIONS: WeakKeyDictionary = WeakKeyDictionary()
"""memgraph -> (the cost model, `durations` under it): a plan the search bounds and then simulates is
priced once."""


def durations(memgraph: MemGraph, cost: CostModel) -> list[float]:
    """Each node's seconds on its resource under `cost` (`CostModel.duration`; 0.0 for an input), in node
    order, worked out once per memgraph and cost model (the list is shared: read it, do not change it)."""
    known = _DURATIONS.get(memgraph)
    if known is not None and known[0] == cost and len(known[1]) == len(memgraph.nodes):
        return known[1]
    nodes = memgraph.by_id()
    seconds = [0.0 if node.op == "input" else cost.duration(node, [nodes[i] for i in node.inputs]) for node in memgraph.nodes]
    _DURATIONS[memgraph] = (cost, seconds)
    return seconds


ATTENTION_KERNELS = ("attention", "attention_grad")
"""Kernels that launch through torch's fused attention on a GPU (the forward's blocks, and training's
backward blocks at their own rates), with the loop's `host_per_attention` beside."""


def fused_backward_flops(shapes: list, attrs: dict) -> int:
    """FLOPs of one block's whole fused backward (5 products of tq x tk x width, halved for a causal block):
    what an `attention_grad` link costs on a torch path, whichever gradient it keeps."""
    (tq, width), (tk, _) = shapes[0], shapes[1]
    flops = 10 * tq * tk * width
    return flops // 2 if attrs.get("causal", False) else flops


def _half_attention(node: MemNode, inputs: list[MemNode]) -> bool:
    """An attention link over fp16 or bf16 operands (its output may be a float32 partial): the kind the cuda
    backend runs through torch's fused op and the merge, which `attention_flops` and `host_per_attention` price."""
    return node.kernel in ATTENTION_KERNELS and bool(inputs) and inputs[0].dtype in ("float16", "bfloat16")

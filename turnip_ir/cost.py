"""The cost model: how long a memgraph vertex takes on a GPU, fitted to the H200 (bench/fit_cost.py).

The sim backend uses it as its clock, and the `nondet` policy uses it for critical-path priorities.
A kernel costs max(FLOPs / GEMM rate, bytes read and written / HBM bandwidth) plus a launch overhead;
a transfer costs its bytes over the link that carries it (H2D, D2H, or the peer link for a move). The
runtime's event loop costs host time per vertex, which the sim backend serializes. The defaults are
measured rates where a benchmark gives one, and two figures fitted to the measured makespans of the
benchmark matrix (attention_flops, launch): docs/runtime.md, "The cost model", says which is which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from turnip_ir.kernels import KERNELS
from turnip_ir.memgraph import MemNode


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
    attention_flops: float = 500e12
    """fp16 attention blocks as the cuda backend runs them (cuDNN's fused op plus the merge into the packed
    partial), one rate for full and causal blocks, fitted with `overlap_efficiency` to every measured
    llama and FFN point by a grid (bench/fit_cost.py's points; docs/benchmarks-log.md, the fifth session
    of 2026-12-03: 478 before, without the overlap loss). It is below the rate of blocks queued alone
    (docs/benchmarks.md, "Attention providers on 7B blocks") because in a prefill the blocks share the
    GPU with the GEMMs of the other stream; with the GEMM rate instead, the sim predicted llama prefill
    faster than measured."""
    triton_attention_flops: float = 409e12
    """fp16 attention blocks under the `triton` provider (one kernel per block, no merge), what
    `for_attention("triton")` prices them at: 7b at 32k / 4 GiB ran 1.464 s with triton against 1.331 s
    with torch-cudnn in one sitting (docs/results/h200-2026-12-01b-llama-32k-{triton,torch-cudnn}.json),
    1.100x, and at this rate the sim gives that plan (layers in blocks, today's arenas) 1.100x its
    torch-cudnn makespan (1.433 against 1.303 s; 392 before `overlap_efficiency`). Queued alone, a 7b block runs at 0.81-0.82 of torch's best SDPA under triton against
    0.90-0.96 under torch-cudnn (docs/runtime.md, "Attention providers")."""
    decode_attention_bw: float = 0.92e12
    """Bytes per second of the cuda backend's `decode_attention` launches (its operands and output over its
    time): 7b, B = 16, two 1024-row columns a layer, 64 such launches plus 32 one-row ones took 18.9 ms for
    about 17.2 GB on the H200 (docs/benchmarks-log.md, the third sitting of 2026-12-02). One block per
    (sequence, head) reads its rows by warps, a quarter of HBM's rate; at `hbm_bw` the sim had a 7b decode
    step's resident layers finish three times sooner than measured."""
    fp64_flops: float = 0.8e12
    overlap_efficiency: float = 0.95
    """The share of one GPU's throughput that k > 1 kernels running at once on its compute streams get
    together: each drains at overlap_efficiency / k (alone, at 1). Fitted with `attention_flops` over the
    matrix (a grid of 0.93 to 1.0 against 478 to 525 TFLOP/s): at 1.0 the sim was 4-6% fast at every loose
    32k point and 2-3% slow at the tight ones; at 0.95 it is within 5% at 58 of 62 points, against 53.
    The traces of 7b at 32k (2026-12-03, fifth session) agree: over the GPU's busy time the kernels did
    0.959 of this model's work per second at 8 GiB, where two ran at once 81% of that time, and 1.004 at
    1 GiB, where they did 21% (docs/benchmarks-log.md)."""
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
    notify_latency: float = 36.2e-6
    """Seconds from a vertex's end on the GPU to the loop learning of it: the same section's chain of tiny
    kernels run one at a time (83.3 us a vertex) less the loop's time and the launch gap."""

    def for_attention(self, provider: str) -> CostModel:
        """This model for a run whose attention blocks go through `provider` (a resolved cuda provider):
        `triton` has its own rate; torch's fused ops are priced at `attention_flops`, as is `cublas`,
        which runs about 5x slower (not modelled: the sim ranks no plan for it)."""
        return replace(self, attention_flops=self.triton_attention_flops) if provider == "triton" else self

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
        rate = self.attention_flops if _half_attention(node, inputs) else self.flop_rate(dtype)
        if node.kernel == "decode_attention":
            return max(flops / rate, traffic / self.decode_attention_bw) + self.launch
        return max(flops / rate, traffic / self.hbm_bw) + self.launch

    def host_time(self, node: MemNode, inputs: list[MemNode]) -> float:
        """Seconds of the runtime's loop to submit `node` and handle its completion."""
        if node.op == "kernel" and _half_attention(node, inputs):
            return self.host_per_vertex + self.host_per_attention
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


def _half_attention(node: MemNode, inputs: list[MemNode]) -> bool:
    """An attention link over fp16 or bf16 operands (its output may be a float32 partial): the kind the cuda
    backend runs through torch's fused op and the merge, which `attention_flops` and `host_per_attention` price."""
    return node.kernel == "attention" and bool(inputs) and inputs[0].dtype in ("float16", "bfloat16")

"""The cost model: how long a memgraph vertex takes on a GPU, from the H200 ceilings in docs/hardware.md.

The sim backend uses it as its clock, and the `nondet` policy uses it for critical-path priorities.
A kernel costs max(FLOPs / GEMM rate, bytes read and written / HBM bandwidth) plus a launch overhead;
a transfer costs its bytes over the link that carries it (H2D, D2H, or the peer link for a move).
"""

from __future__ import annotations

from dataclasses import dataclass

from turnip_ir.kernels import KERNELS
from turnip_ir.memgraph import MemNode


@dataclass(frozen=True)
class CostModel:
    """Rates in bytes/s and FLOP/s, times in seconds; defaults are the measured H200 ceilings."""

    h2d_bw: float = 55.3e9
    d2h_bw: float = 55.3e9
    duplex_bw: float = 93.4e9
    """Total host-link bandwidth when H2D and D2H run at once; the sim backend shares it between them."""
    peer_bw: float = 360e9
    """Achieved by the cuda backend's peer copies on two H200s over NV18, on 64 MiB tiles, against a
    ceiling measured beside them; the rate on the larger tiles of the 49152^3 matmul and the sim's error
    there are in docs/benchmarks-log.md, "Two GPUs". Kept at the smaller tiles' rate, nearer the llama
    moves' sizes."""
    hbm_bw: float = 4187e9
    """Bytes read plus bytes written per second."""
    fp32_flops: float = 50.5e12
    half_flops: float = 750e12
    """fp16 and bf16 GEMM rate."""
    attention_flops: float = 460e12
    """fp16 attention blocks as the cuda backend runs them (cuDNN's fused op plus the merge into the packed
    partial), one rate for full and causal blocks, fitted on llama 7b at 32k and 128k, 4 GiB, on the H200:
    the fit, its error per length and the rate it replaced are in docs/benchmarks-log.md, "The cost
    model's attention rate, refitted" (under "The completion notifier off the lane's stream"). It is below
    the rate of blocks queued alone (docs/benchmarks.md, "Attention providers on 7B blocks") because in a
    prefill the blocks share the GPU with the GEMMs of the other stream; with the GEMM rate instead, the
    sim predicted llama prefill faster than measured."""
    fp64_flops: float = 0.8e12
    launch: float = 10e-6
    """Per-kernel overhead. A host-side numba launch costs 28 us (docs/hardware.md); an async launch queued
    on a busy stream hides most of it, so the default is smaller. Configurable."""

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
        rate = self.flop_rate(dtype)
        if node.kernel == "attention" and dtype in ("float16", "bfloat16"):
            rate = self.attention_flops
        return max(flops / rate, traffic / self.hbm_bw) + self.launch

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

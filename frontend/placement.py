"""Placement strategies: which GPU runs each block task the frontend lowers.

A strategy is a callable `Site -> int`. The frontend asks it once per task (a whole attention chain
counts as one task) in the op's grid order, with the block coordinates, the task's FLOPs and where its
operand blocks live. Strategies here:
- `round_robin(gpus)`: the task's position in its op's grid, modulo the GPU count, so the same block
  of consecutive ops lands on the same GPU (no moves between them);
- `LoadBalanced(gpus)`: the GPU with the least work so far, counting a byte that would have to be
  moved as `flops_per_byte` FLOPs, so it follows the data until the loads drift apart;
- `given(fn)`: `fn(coords)` with coordinates by index letter, e.g. `lambda c: c["t"] % 2`;
- `on(gpu)`: one GPU for everything (a pipeline stage);
- `follow`: the GPU of the first operand's block (the default for elementwise ops).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from turnip_ir.errors import InputError


@dataclass(frozen=True)
class Site:
    """One task to place: its op, block coordinates, position in the op's grid, FLOPs and operands."""

    op: str
    coords: Mapping[str, int]
    index: int
    flops: int
    operands: tuple[tuple[int | None, int], ...]
    """(GPU, bytes) of each operand block; the GPU is None for an input not yet placed."""


Placement = Callable[[Site], int]


def round_robin(gpus: int) -> Placement:
    return lambda site: site.index % gpus


def on(gpu: int) -> Placement:
    return lambda site: gpu


def given(fn: Callable[[Mapping[str, int]], int]) -> Placement:
    return lambda site: fn(site.coords)


def follow(site: Site) -> int:
    """The GPU of the first operand that has one (GPU 0 when none has)."""
    return next((gpu for gpu, _ in site.operands if gpu is not None), 0)


class LoadBalanced:
    """Greedy: the GPU where the work so far plus the cost of moving the missing operands is least."""

    def __init__(self, gpus: int, flops_per_byte: float = 1500.0):
        # An H200 does ~600 TFLOP/s of fp16 GEMM and moves ~400 GB/s to a peer: ~1500 FLOPs a byte.
        self.loads = [0.0] * gpus
        self.flops_per_byte = flops_per_byte

    def __call__(self, site: Site) -> int:
        def cost(gpu: int) -> float:
            missing = sum(size for where, size in site.operands if where is not None and where != gpu)
            return self.loads[gpu] + site.flops + self.flops_per_byte * missing

        best = min(range(len(self.loads)), key=cost)
        self.loads[best] += site.flops
        return best


STRATEGIES = ("round-robin", "load-balanced")


def strategy(name: str, gpus: int) -> Placement:
    """A named strategy for `gpus` GPUs."""
    if name == "round-robin":
        return round_robin(gpus)
    if name == "load-balanced":
        return LoadBalanced(gpus)
    raise InputError(f"unknown placement '{name}' (known: {', '.join(STRATEGIES)})")

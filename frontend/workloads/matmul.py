"""`matmul`: the seed's running example, C = A @ B cut into tiles over several GPUs.

A [m, k] and B [k, n] are cut into tiles of `block` along every index. Each tile product
C[i,j] += A[i,k] @ B[k,j] is one task; with the `seed` placement tile (i, k) of A and (k, j) of B start
on GPU (i+k) and (k+j), the product runs on GPU (i+j+k), and the partial products of C[i,j] are moved
to GPU (i+j) (that of k = 0) and summed there (all modulo the GPU count).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnip_ir.errors import InputError
from frontend import Program, given, split_block, strategy
from frontend.workloads.common import check_positive, normal

PLACEMENTS = ("seed", "round-robin", "load-balanced")


@dataclass(frozen=True)
class MatmulConfig:
    m: int = 256
    k: int = 256
    n: int = 256
    block: int = 128
    """Tile edge along every index (the last tile is smaller when it does not divide)."""
    gpus: int = 3
    dtype: str = "float32"
    placement: str = "seed"
    """`seed` (GPU = sum of tile coordinates), `round-robin` or `load-balanced`."""


PRESETS = {"seed": MatmulConfig(), "small": MatmulConfig(m=64, k=64, n=64, block=32)}


def build(config: MatmulConfig) -> Program:
    """The blocked matmul as a frontend program; its output is `C`."""
    check_positive(config, "m", "k", "n", "block", "gpus")
    if config.placement not in PLACEMENTS:
        raise InputError(f"unknown matmul placement '{config.placement}' (known: {', '.join(PLACEMENTS)})")
    if config.placement == "seed":
        place = start = given(lambda c: sum(c.values()) % config.gpus)
    else:
        place, start = strategy(config.placement, config.gpus), None
    prog = Program(config.gpus, place)
    a = prog.input("A", (config.m, config.k), config.dtype, _cut(config, "m", "k"), place=start, index="ik")
    b = prog.input("B", (config.k, config.n), config.dtype, _cut(config, "k", "n"), place=start, index="kj")
    prog.output(prog.einsum("ik,kj->ij", a, b, name="C"))
    return prog


def random_inputs(config: MatmulConfig, seed: int) -> dict[str, np.ndarray]:
    return {"A": normal(seed, "A", (config.m, config.k), config.dtype), "B": normal(seed, "B", (config.k, config.n), config.dtype)}


def float64_forward(config: MatmulConfig, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """C in float64."""
    return {"C": values["A"].astype(np.float64) @ values["B"].astype(np.float64)}


def _cut(config: MatmulConfig, *dims: str) -> tuple:
    return tuple(split_block(getattr(config, d), config.block) for d in dims)

"""`ffn`: L layers of gelu(x W1^T) W2^T over T tokens, the token dimension cut into blocks.

Weights are in the HF layout [out, in]: W1 [ffn, hidden], W2 [hidden, ffn], and each product is
`einsum('ti,oi->to')`. With `ffn_blocks` > 1 the FFN dimension is cut too: W1 by rows, W2 by columns,
and the partial products of each token block are summed by an add tree. Placements: `round-robin` and
`load-balanced` spread token blocks over GPUs; `layers` runs layer l on GPU l * gpus // L (a pipeline).
Weights are plain inputs: the compiler starts the ones that do not fit in CPU storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnip_ir.errors import InputError
from frontend import Program, on, split_block, strategy
from frontend.workloads.common import check_positive, normal

PLACEMENTS = ("round-robin", "load-balanced", "layers")


@dataclass(frozen=True)
class FfnConfig:
    layers: int = 4
    tokens: int = 64
    hidden: int = 128
    ffn: int = 256
    block: int = 32
    """Tokens per block."""
    ffn_blocks: int = 1
    gpus: int = 1
    dtype: str = "float32"
    placement: str = "round-robin"


PRESETS = {
    "small": FfnConfig(),
    # the transfer-bound case of the GPU benchmarks (docs/benchmarks.md, "FFN"): 16 layers of 8192 x 32768 in fp16 (17 GB of weights)
    "large": FfnConfig(layers=16, tokens=2048, hidden=8192, ffn=32768, block=2048, dtype="float16"),
}


ACTIVATIONS = ("x",)
"""The stack's inputs besides its weights (`Program.input_ids(ACTIVATIONS)`: their blocks' ids)."""


def build(config: FfnConfig) -> Program:
    """The FFN stack as a frontend program: input `x`, weights `w1.{l}` and `w2.{l}`, output `y`."""
    check_positive(config, "layers", "tokens", "hidden", "ffn", "block", "ffn_blocks", "gpus")
    if config.placement not in PLACEMENTS:
        raise InputError(f"unknown ffn placement '{config.placement}' (known: {', '.join(PLACEMENTS)})")
    spread = None if config.placement == "layers" else strategy(config.placement, config.gpus)
    prog = Program(config.gpus, spread, order_by=("t",))
    x = prog.input("x", (config.tokens, config.hidden), config.dtype, (split_block(config.tokens, config.block),))
    for layer in range(config.layers):
        prog.phase = layer
        place = on(layer * config.gpus // config.layers) if spread is None else None
        w1 = prog.input(f"w1.{layer}", (config.ffn, config.hidden), config.dtype, (config.ffn_blocks,))
        w2 = prog.input(f"w2.{layer}", (config.hidden, config.ffn), config.dtype, (None, config.ffn_blocks))
        h = prog.einsum("ti,oi->to", x, w1, name=f"up{layer}", place=place)
        h = prog.map("gelu", h, name=f"act{layer}", signature="tf->tf", place=place)
        x = prog.einsum("tf,of->to", h, w2, name="y" if layer == config.layers - 1 else f"down{layer}", place=place)
    prog.output(x)
    return prog


def random_inputs(config: FfnConfig, seed: int) -> dict[str, np.ndarray]:
    """x ~ N(0, 1); weights scaled by 1/sqrt(fan-in) (times sqrt 2 after gelu) so values stay O(1)."""
    values = {"x": normal(seed, "x", (config.tokens, config.hidden), config.dtype)}
    for layer in range(config.layers):
        values[f"w1.{layer}"] = normal(seed, f"w1.{layer}", (config.ffn, config.hidden), config.dtype, config.hidden**-0.5)
        values[f"w2.{layer}"] = normal(seed, f"w2.{layer}", (config.hidden, config.ffn), config.dtype, (2 / config.ffn) ** 0.5)
    return values


def float64_forward(config: FfnConfig, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """y in float64, with the tanh-approximated GELU."""
    x = values["x"].astype(np.float64)
    for layer in range(config.layers):
        h = x @ values[f"w1.{layer}"].astype(np.float64).T
        h = 0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (h + 0.044715 * h**3)))
        x = h @ values[f"w2.{layer}"].astype(np.float64).T
    return {"y": x}

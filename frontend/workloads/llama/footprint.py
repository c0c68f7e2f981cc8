"""What a LLaMA prefill holds in host memory, from the config alone: checked before anything is drawn or read.

The weights (`weight_shapes`: qwen2's q/k/v biases too), in the compute dtype, are all fed to the run
(random ones are drawn in full; checkpoint tensors are converted or mapped). The activations are a lower
bound: the prompt's embedded input, RoPE tables and final output, plus one layer's intermediates (the
residual stream, q, k, v, the attention output, gate and up), which the offloads of a tight budget park
on the host. A run that cannot hold this much is refused in one line before it spends minutes drawing
weights and is killed for memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from turnip_ir.kernels import DTYPE_BYTES
from frontend.workloads.llama.config import LlamaConfig
from frontend.workloads.llama.weights import weight_shapes


@dataclass(frozen=True)
class HostFootprint:
    weights: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.activations


def host_footprint(config: LlamaConfig, tokens: int) -> HostFootprint:
    """The bytes of the weights and of the prompt's activations for `tokens` tokens in `config.dtype`."""
    size = DTYPE_BYTES[config.dtype]
    shapes = weight_shapes(replace(config, num_hidden_layers=1))  # layer 0's shapes stand for every layer's
    layer_weights = sum(math.prod(shape) for name, shape in shapes.items() if name.startswith("model.layers."))
    weights = (sum(math.prod(shape) for shape in shapes.values()) + (config.num_hidden_layers - 1) * layer_weights) * size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    io = 2 * config.hidden_size + 2 * config.head_dim  # hidden in, hidden out, cos, sin
    layer = 2 * config.hidden_size + 2 * q_width + 2 * kv_width + 2 * config.intermediate_size
    return HostFootprint(weights, tokens * (io + layer) * size)

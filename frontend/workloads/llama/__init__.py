"""LLaMA prefill: configs, RoPE tables, weights, the blocked taskgraph and a float64 forward pass (`float64_forward`)."""

from frontend.workloads.llama.config import DEFAULT_TOKENS, PRESETS, LlamaConfig, load_config
from frontend.workloads.llama.graph import PLACEMENTS, LlamaGraph, build_llama, default_block
from frontend.workloads.llama.float64_forward import float64_forward
from frontend.workloads.llama.footprint import HostFootprint, host_footprint
from frontend.workloads.llama.weights import CheckpointWeights, RandomWeights, embed, random_ids, weight_shapes

__all__ = [
    "DEFAULT_TOKENS",
    "PLACEMENTS",
    "PRESETS",
    "CheckpointWeights",
    "HostFootprint",
    "LlamaConfig",
    "LlamaGraph",
    "RandomWeights",
    "build_llama",
    "default_block",
    "embed",
    "host_footprint",
    "load_config",
    "random_ids",
    "float64_forward",
    "weight_shapes",
]

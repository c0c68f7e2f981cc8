"""LLaMA prefill: configs, RoPE tables, weights, the blocked taskgraph and a float64 reference."""

from turnip_ir.workloads.llama.config import DEFAULT_TOKENS, PRESETS, LlamaConfig, load_config
from turnip_ir.workloads.llama.graph import PLACEMENTS, LlamaGraph, build_llama, default_block
from turnip_ir.workloads.llama.reference import reference
from turnip_ir.workloads.llama.weights import CheckpointWeights, RandomWeights, embed, random_ids, weight_shapes

__all__ = [
    "DEFAULT_TOKENS",
    "PLACEMENTS",
    "PRESETS",
    "CheckpointWeights",
    "LlamaConfig",
    "LlamaGraph",
    "RandomWeights",
    "build_llama",
    "default_block",
    "embed",
    "load_config",
    "random_ids",
    "reference",
    "weight_shapes",
]

"""LLaMA prefill, decode and LoRA training: configs, RoPE tables, weights, the blocked prefill taskgraph, the
decode step (`build_decode_step`), a training step (`build_training_step`) and a float64 forward pass
(`float64_forward`)."""

from frontend.workloads.llama.config import DEFAULT_TOKENS, PRESETS, LlamaConfig, load_config
from frontend.workloads.llama.graph import LAYER_ORDERS, PLACEMENTS, LlamaGraph, build_llama, default_block
from frontend.workloads.llama.decode import KV_BLOCK, DecodeStep, build_decode_step
from frontend.workloads.llama.float64_forward import float64_forward
from frontend.workloads.llama.train import LoraSpec, TrainGraph, build_training_step
from frontend.workloads.llama.footprint import HostFootprint, host_footprint
from frontend.workloads.llama.weights import CheckpointWeights, RandomWeights, embed, head_name, random_ids, weight_shapes

__all__ = [
    "DEFAULT_TOKENS",
    "KV_BLOCK",
    "DecodeStep",
    "build_decode_step",
    "head_name",
    "LAYER_ORDERS",
    "PLACEMENTS",
    "PRESETS",
    "CheckpointWeights",
    "HostFootprint",
    "LlamaConfig",
    "LlamaGraph",
    "LoraSpec",
    "RandomWeights",
    "TrainGraph",
    "build_llama",
    "build_training_step",
    "default_block",
    "embed",
    "host_footprint",
    "load_config",
    "random_ids",
    "float64_forward",
    "weight_shapes",
]

"""Workloads: models written with the frontend, each a config dataclass, a builder and a float64 reference.

- `matmul`: the seed's blocked C = A @ B over several GPUs (`turnip_ir.workloads.matmul`);
- `ffn`: L layers of gelu(x W1^T) W2^T with token blocks (`turnip_ir.workloads.ffn`);
- `llama`: LLaMA prefill with blocked causal attention (`turnip_ir.workloads.llama`).
matmul and ffn share one shape: `PRESETS`, `build(config) -> Program`, `random_inputs(config, seed)`
and `reference(config, values)` on whole tensors by name; llama has its own, richer API.
"""

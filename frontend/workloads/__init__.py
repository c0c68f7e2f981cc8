"""Workloads: models written with the frontend, each a config dataclass, a builder and a whole-tensor float64 forward pass.

- `matmul`: the seed's blocked C = A @ B over several GPUs (`frontend.workloads.matmul`);
- `ffn`: L layers of gelu(x W1^T) W2^T with token blocks (`frontend.workloads.ffn`);
- `llama`: LLaMA prefill with blocked causal attention (`frontend.workloads.llama`).
matmul and ffn share one shape: `PRESETS`, `build(config) -> Program`, `random_inputs(config, seed)`
and `float64_forward(config, values)` on whole tensors by name; llama has its own, richer API.
"""

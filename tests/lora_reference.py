"""A torch reference for LoRA fine-tuning, for tests (torch and transformers are the `parity` extra, never
shipped code's).

`lora_model(folder, settings)`: transformers' `LlamaForCausalLM` of a checkpoint folder in float64, every
base weight frozen, and on each targeted projection of each layer an adapter added by hand:
y = W x + (alpha / r) B (A x). `TorchReferenceEngine` is a `GradientEngine` (turnip/finetune.py) over it:
the adapters it is given are copied in, the loss is transformers' causal-LM loss (labels shifted inside,
-100 ignored, the mean over counted positions; computed here in float64, where transformers' own
`ForCausalLMLoss` upcasts only to float32) and autograd gives the adapters' gradients in float64. It shares
no code with turnip's driver or graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file

torch.set_num_threads(1)  # the models are tiny: more threads only contend for the test machine's cores


class LoraLinear(torch.nn.Module):
    """A frozen linear layer plus scaling * B A x."""

    def __init__(self, base: torch.nn.Linear, rank: int, scaling: float):
        super().__init__()
        self.base, self.scaling = base, scaling
        self.lora_A = torch.nn.Parameter(torch.zeros(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))

    def forward(self, x):
        return self.base(x) + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)


def base_model(folder: Path, dtype=torch.float64) -> transformers.LlamaForCausalLM:
    """The checkpoint's model in `dtype`, in eval mode, every weight frozen."""
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    state = {name: t.to(dtype) for name, t in load_file(Path(folder) / "model.safetensors").items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if missing:
        model.tie_weights()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def lora_model(folder: Path, settings, dtype=torch.float64) -> tuple[transformers.LlamaForCausalLM, dict[str, torch.nn.Parameter]]:
    """The model with adapters on `settings.targets` of every layer, and the adapters by turnip's names."""
    model = base_model(folder, dtype)
    params = {}
    for i, layer in enumerate(model.model.layers):
        for target in settings.targets:
            kind = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            holder = getattr(layer, kind)
            wrapped = LoraLinear(getattr(holder, target), settings.rank, settings.alpha / settings.rank)
            setattr(holder, target, wrapped)
            params[f"model.layers.{i}.{kind}.{target}.lora_A.weight"] = wrapped.lora_A
            params[f"model.layers.{i}.{kind}.{target}.lora_B.weight"] = wrapped.lora_B
    return model, params


def causal_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM loss in the logits' dtype: position t predicts label t + 1, -100 left out."""
    shifted = labels[:, 1:].reshape(-1)
    logits = logits[:, :-1].reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(logits, shifted, ignore_index=-100, reduction="sum") / (shifted != -100).sum()


class TorchReferenceEngine:
    """The float64 torch reference as a turnip `GradientEngine`."""

    def __init__(self, folder: Path, settings):
        self.model, self.params = lora_model(folder, settings)
        self.calls = 0

    def set_adapters(self, adapters) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(torch.from_numpy(np.asarray(adapters[name], np.float64)))

    def step(self, adapters, ids, labels, loss_scale=1.0):
        self.calls += 1
        self.set_adapters(adapters)
        for p in self.params.values():
            p.grad = None
        logits = self.model(input_ids=torch.from_numpy(np.asarray(ids, np.int64))).logits
        loss = causal_loss(logits, torch.from_numpy(np.asarray(labels, np.int64)))
        loss.backward()
        return loss.item(), {name: p.grad.numpy().copy() for name, p in self.params.items()}

    def logits(self, adapters, ids) -> np.ndarray:
        self.set_adapters(adapters)
        with torch.no_grad():
            return self.model(input_ids=torch.from_numpy(np.asarray(ids, np.int64))).logits.numpy()

"""The LoRA trainer a careful engineer writes by hand in torch, and plain resident autograd to check it against.

Both compute one training step of a LLaMA-family model with LoRA adapters (y = W h + alpha/r B A h on the
targeted projections, A and B float32 masters cast to the model's dtype inside autograd, so their gradients
arrive in float32) and return (mean loss, {adapter name: float32 gradient}): transformers' causal-LM loss
(position t predicts token t + 1, the last position of each sequence ignored), its gradient seeded with
`loss_scale` and divided out after, as an fp16 trainer does. The layer math is transformers' LlamaModel's
(RMSNorm in float32, rotate_half RoPE, SDPA causal attention with grouped kv heads, SwiGLU).

- `ResidentTrainer`: every weight on the device, one autograd graph over the whole step (no checkpoint):
  the reference the streaming trainer is checked against (tests/test_bench_train.py on the CPU; bench_train.py
  at 7b where it fits on the GPU).
- `StreamingTrainer` (docs/hardware.md's hand streaming trainer): the frozen weights live in pinned
  host memory; each layer's are copied on a side stream into one of two GPU buffers while the layer before
  computes, in the forward and again in the backward (the last two layers' stay from the forward); the
  forward runs without autograd and keeps each layer's input (with `offload_inputs`, copied to pinned host
  memory on a second side stream and back before its backward, but for the last two layers'); the backward
  recomputes each layer from its input with autograd and back-propagates through it. The final norm and
  the LM head stay on the device; the loss and its gradient are computed `loss_rows` rows at a time, so the
  logits are never whole. Without a GPU the copies are synchronous (the same code, for tests).
- `adamw`: torch's fused AdamW over the float32 masters, timed apart by bench_train.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

LAYER_WEIGHTS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""A layer's frozen weights, as transformers names them after `model.layers.{i}.` and before `.weight`."""
IGNORE = -100


def adapter_name(layer: int, target: str) -> str:
    """The PEFT key of a target's adapter without `base_model.model.` and `.lora_A.weight` (turnip's names)."""
    module = "mlp" if target in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"model.layers.{layer}.{module}.{target}"


class Model:
    """What both trainers share: the config, LoRA, the device, and the layer math on torch tensors."""

    def __init__(self, torch, config, lora, device: str, loss_scale: float = 1.0):
        self.torch, self.config, self.lora = torch, config, lora
        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        self.dtype = getattr(torch, config.dtype)
        self.loss_scale = float(loss_scale)
        from frontend.workloads.llama.rope import rope_tables

        self.rope_tables = rope_tables

    def tables(self, tokens: int):
        cos, sin = self.rope_tables(self.config, tokens)
        return (self.torch.from_numpy(t).to(self.device, self.dtype) for t in (cos, sin))

    def masters(self, adapters: Mapping[str, np.ndarray]) -> dict:
        """The adapters as float32 leaves on the device, by turnip's name."""
        return {name: self.torch.tensor(np.asarray(value, np.float32), device=self.device, requires_grad=True)
                for name, value in adapters.items()}

    def layer(self, x, w: Mapping, adapters: Mapping, layer: int, cos, sin):
        """One decoder layer on x [B, T, hidden]; `w` by local name (`self_attn.q_proj`), adapters by turnip's name."""
        torch, c = self.torch, self.config
        batch, tokens = x.shape[0], x.shape[1]
        heads, kv_heads, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = self.rms(x, w["input_layernorm"])
        q = self.project(h, w, adapters, layer, "q_proj").view(batch, tokens, heads, d).transpose(1, 2)
        k = self.project(h, w, adapters, layer, "k_proj").view(batch, tokens, kv_heads, d).transpose(1, 2)
        v = self.project(h, w, adapters, layer, "v_proj").view(batch, tokens, kv_heads, d).transpose(1, 2)
        q, k = rope(torch, q, cos, sin), rope(torch, k, cos, sin)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
        x = x + self.project(a.transpose(1, 2).reshape(batch, tokens, heads * d), w, adapters, layer, "o_proj")
        h = self.rms(x, w["post_attention_layernorm"])
        gated = torch.nn.functional.silu(self.project(h, w, adapters, layer, "gate_proj")) * self.project(h, w, adapters, layer, "up_proj")
        return x + self.project(gated, w, adapters, layer, "down_proj")

    def project(self, h, w: Mapping, adapters: Mapping, layer: int, target: str):
        module = "mlp" if target in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        y = h @ w[f"{module}.{target}"].T
        if target not in self.lora.targets:
            return y
        name = adapter_name(layer, target)
        a, b = adapters[f"{name}.lora_A.weight"].to(h.dtype), adapters[f"{name}.lora_B.weight"].to(h.dtype)
        return y + ((h @ a.T) * self.lora.scaling) @ b.T

    def rms(self, x, weight):
        """transformers' LlamaRMSNorm: in float32 for half x, then back, times the weight."""
        wide = self.wide(x)
        return (wide * self.torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)).to(x.dtype) * weight

    def wide(self, logits):
        """x in float32 where it is half (transformers' norms and loss compute there), else as it is."""
        return logits.float() if logits.element_size() == 2 else logits

    def labels(self, ids):
        """transformers' shifted labels [B*T] (int64, the last position of each sequence ignored)."""
        torch = self.torch
        labels = torch.full(ids.shape, IGNORE, dtype=torch.int64)
        labels[:, :-1] = torch.as_tensor(ids[:, 1:])
        return labels.reshape(-1).to(self.device)

    def grads(self, masters: Mapping) -> dict[str, np.ndarray]:
        """Each adapter's gradient of the mean loss, the loss scale divided out, float32 on the host."""
        return {name: (p.grad / self.loss_scale).float().cpu().numpy() for name, p in masters.items()}


def rope(torch, x, cos, sin):
    """transformers' rotate_half RoPE on x [B, heads, T, d] with cos, sin [T, d]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class ResidentTrainer(Model):
    """Every weight on the device and one autograd graph over the step (module docstring)."""

    def __init__(self, torch, config, lora, host: Mapping, device: str, loss_scale: float = 1.0):
        super().__init__(torch, config, lora, device, loss_scale)
        self.weights = {name: t.to(self.device) for name, t in host.items() if name != "model.embed_tokens.weight"}
        self.embedding = host["model.embed_tokens.weight"]
        self.layers = [{n: self.weights[f"model.layers.{i}.{n}.weight"] for n in LAYER_WEIGHTS} for i in range(config.num_hidden_layers)]

    def step(self, ids: np.ndarray, masters: Mapping) -> float:
        torch = self.torch
        cos, sin = self.tables(ids.shape[1])
        x = self.embedding[torch.as_tensor(ids)].to(self.device)
        for i, w in enumerate(self.layers):
            x = self.layer(x, w, masters, i, cos, sin)
        h = self.rms(x, self.weights["model.norm.weight"])
        logits = self.wide(h.reshape(-1, h.shape[-1]) @ self.weights[head(self.config)].T)
        loss = torch.nn.functional.cross_entropy(logits, self.labels(ids), ignore_index=IGNORE)
        (loss * self.loss_scale).backward()
        return float(loss.detach())


def head(config) -> str:
    return "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"


class StreamingTrainer(Model):
    """Weights streamed from pinned host memory into two GPU buffers, layer inputs kept (or offloaded), each
    layer recomputed in the backward (module docstring). `host`: torch CPU tensors by HF name (pinned on a GPU)."""

    def __init__(self, torch, config, lora, host: Mapping, device: str, loss_scale: float = 1.0, offload_inputs: bool = False,
                 loss_rows: int = 1024):
        super().__init__(torch, config, lora, device, loss_scale)
        self.host, self.offload_inputs, self.loss_rows = host, offload_inputs, loss_rows
        layers = config.num_hidden_layers
        self.names = [[f"model.layers.{i}.{n}.weight" for n in LAYER_WEIGHTS] for i in range(layers)]
        self.slots = [{n: torch.empty_like(host[f"model.layers.0.{n}.weight"], device=self.device) for n in LAYER_WEIGHTS} for _ in range(2)]
        self.norm = host["model.norm.weight"].to(self.device)
        self.head = host[head(config)].to(self.device)
        self.copier = torch.cuda.Stream() if self.gpu else None
        self.saver = torch.cuda.Stream() if self.gpu and offload_inputs else None
        self.ready = [torch.cuda.Event() if self.gpu else None for _ in range(2)]
        self.saved_host: list = []

    # ----- the copies ---------------------------------------------------------------------------------------
    def _load(self, layer: int, reload_input: bool = False):
        """Layer `layer`'s weights into its slot (and, `reload_input`, its offloaded input into a new tensor,
        returned) on the side stream, after the slot's last reader; the slot's event `ready` says done."""
        torch, slot = self.torch, layer % 2
        if not self.gpu:
            for name, target in zip(self.names[layer], self.slots[slot].values()):
                target.copy_(self.host[name])
            return self.saved_host[layer].to(self.device) if reload_input else None
        self.copier.wait_stream(torch.cuda.current_stream())  # the slot's previous layer has finished with it
        if reload_input:
            self.copier.wait_stream(self.saver)  # and the input's offload has
        with torch.cuda.stream(self.copier):
            for name, target in zip(self.names[layer], self.slots[slot].values()):
                target.copy_(self.host[name], non_blocking=True)
            loaded = self.saved_host[layer].to(self.device, non_blocking=True) if reload_input else None
            self.ready[slot].record(self.copier)
        if loaded is not None:
            loaded.record_stream(torch.cuda.current_stream())  # read there: not reused before it has been
        return loaded

    def _wait(self, layer: int) -> None:
        if self.gpu:
            self.torch.cuda.current_stream().wait_event(self.ready[layer % 2])

    def _save(self, layer: int, x):
        """Keep layer `layer`'s input: on the device, or offloaded to pinned host memory (None kept)."""
        if not self.offload_inputs or layer >= self.config.num_hidden_layers - 2:
            return x
        torch = self.torch
        if not self.gpu:
            self.saved_host[layer].copy_(x)
            return None
        self.saver.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.saver):
            self.saved_host[layer].copy_(x, non_blocking=True)
        x.record_stream(self.saver)  # its memory is not reused before the copy is done
        return None

    # ----- the step -------------------------------------------------------------------------------------------
    def step(self, ids: np.ndarray, masters: Mapping) -> float:
        """One step: the mean loss; the adapters' gradients (times `loss_scale`) added to `masters`' .grad."""
        torch = self.torch
        cos, sin = self.tables(ids.shape[1])
        layers = self.config.num_hidden_layers
        if self.offload_inputs and not self.saved_host:
            shape = (ids.shape[0], ids.shape[1], self.config.hidden_size)
            self.saved_host = [torch.empty(shape, dtype=self.dtype, pin_memory=self.gpu) for _ in range(layers)]
        x = self.host["model.embed_tokens.weight"][torch.as_tensor(ids)].to(self.device)
        saved = []
        self._load(0)
        with torch.no_grad():
            for i in range(layers):
                if i + 1 < layers:
                    self._load(i + 1)
                self._wait(i)
                saved.append(self._save(i, x))
                x = self.layer(x, self.slots[i % 2], masters, i, cos, sin)
        loss, dy = self._loss(x, ids)
        reloaded = {}
        for i in reversed(range(layers)):  # the last two layers' weights are still in their slots
            if i + 2 < layers:
                self._wait(i)
            x_in = saved[i] if saved[i] is not None else reloaded.pop(i)
            saved[i] = None
            with torch.enable_grad():
                leaf = x_in.detach().requires_grad_()
                self.layer(leaf, self.slots[i % 2], masters, i, cos, sin).backward(dy)
            dy = leaf.grad
            if i >= 2:
                loaded = self._load(i - 2, reload_input=saved[i - 2] is None)
                if loaded is not None:
                    reloaded[i - 2] = loaded
        return loss

    def _loss(self, x, ids):
        """The mean loss and its gradient wrt the last layer's output (the seed times `loss_scale`), the
        logits made `loss_rows` rows at a time."""
        torch = self.torch
        labels = self.labels(ids)
        count = max(int((labels != IGNORE).sum()), 1)
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            h = self.rms(leaf, self.norm)
            flat = h.detach().reshape(-1, h.shape[-1]).requires_grad_()
            total = 0.0
            for start in range(0, flat.shape[0], self.loss_rows):
                rows = slice(start, start + self.loss_rows)
                logits = self.wide(flat[rows] @ self.head.T)
                part = torch.nn.functional.cross_entropy(logits, labels[rows], ignore_index=IGNORE, reduction="sum")
                (part * (self.loss_scale / count)).backward()
                total += float(part.detach())
            h.backward(flat.grad.view_as(h))
        return total / count, leaf.grad


def adamw(torch, masters: Mapping, lr: float = 1e-4):
    """torch's AdamW over the float32 masters (fused on a GPU)."""
    params = list(masters.values())
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=params[0].is_cuda)


def max_relative_error(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """The largest over adapters of max |got - want| / max |want|."""
    return max(float(np.abs(got[n] - w).max() / max(np.abs(w).max(), 1e-30)) for n, w in want.items())



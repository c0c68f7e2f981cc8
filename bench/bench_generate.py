"""Decoding LLaMA-7B under a GPU memory budget: turnip's Session against hand-written torch decoders and the PCIe floor.

    python3 bench/bench_generate.py                                   # 7b fp16, B=16, P=2048, N=32; turnip at 4 16 40 GiB
    python3 bench/bench_generate.py --shapes 16x2048 64x512 --hf      # a second shape; HF + accelerate too (slow)
    python3 bench/bench_generate.py --device cpu --quick --config tiny-gqa   # the script end to end on the CPU (a test)

Random weights are drawn once (a seed), pinned once as torch host tensors, and shared: turnip reads them
as numpy views. The KV prefix of every sequence (P-1 tokens, random) sits in pinned host memory as
[ctx, B, kv_width] per layer, shared the same way. Systems, for each shape B x P:
  torch-resident   the decode step written by hand in torch (SDPA with GQA; RoPE, RMSNorm, SwiGLU as
                   transformers' LlamaModel), every weight and the whole KV on the GPU; greedy, N steps;
  torch-stream     the same code, each layer's weights and its KV prefix copied from pinned host memory on
                   a side stream into one of two GPU buffers while the previous layer computes; the new K/V
                   rows are written into the buffer and copied back to the host cache; the LM head and the
                   final norm stay on the GPU (0.26 GB); fed torch-resident's tokens (teacher forcing);
  floor            the streaming traffic per step (layer weights + the KV prefix, at the mean context) over
                   the host-to-device rate measured in this run (a 1 GiB pinned copy);
  turnip@G         `turnip.Session` at a budget of G GiB, decoding in the same pinned KV buffers
                   (`generate(caches=KvCache.wrap(...))`: no copy), fed torch-resident's greedy tokens
                   (teacher forcing), so its logits are compared with torch-resident's per step; all N
                   steps (`--turnip-steps` fewer); a step's time is all of it but its compile (the
                   feed, placing what changed, the run, the outputs, appending the rows, the tokens); one prefill of one prompt (P-1 tokens) is timed
                   apart, and `turnip llama` of the same prompt for comparison (at the first `--prefills` budgets);
  turnip@G/fixed   (with --orders nondet fixed) the same with the fixed dispatch order;
  turnip@G/qD      (with --queue-depths 2 D) the cuda backend queueing up to D vertices per compute lane
                   (a plan that moves nothing queues at least RESIDENT_QUEUE_DEPTH = 8 since the fourth
                   sitting of 2026-12-02, whatever D: the 40 GiB comparison was measured before that);
  ragged shapes    B x P:ragged draws prompt lengths uniformly in [P/2, P]: turnip only (the torch
                   decoders assume one length), nondet against fixed;
  --interfere      (cuda) while the turnip systems of a shape run, a second process copies pinned memory
                   to GPU 0 in seeded bursts (bench/bench_interference.py's `Interferers`, its default
                   bursts: 2-20 ms long, 2-40 ms apart); its bytes and busy time go into the shape's
                   "interferer" (issue 26: nondet against fixed under interference, on the ragged decode);
  hf-offload       (with --hf) transformers' LlamaForCausalLM through accelerate, weights capped at the
                   smallest budget, `--hf-steps` new tokens (prefill included in its wall time: the
                   per-step figure is the time after the first token), with the default cache (on
                   the GPU) and, as hf-offload@G/offloaded, transformers' offloaded cache
                   (`cache_implementation="offloaded"`: each layer's KV to the host and back).
Times: CUDA-synchronized wall clock, the median of the decode steps after the first. Prints one table
last; the JSON (--json, default $OUT/generate.json) keeps every figure. `--time-limit` skips what would
start after it, saying so, so a benchmark stage always ends with its table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from frontend.workloads import llama  # noqa: E402
from frontend.workloads.llama.decode import KV_BLOCK  # noqa: E402
from frontend.workloads.llama.rope import inverse_frequencies  # noqa: E402

GIB = 1 << 30
BEGAN = time.perf_counter()


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b", help="a preset or a config.json (default 7b)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", nargs="+", default=["16x2048"], help="B x P pairs (default 16x2048)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--budgets", type=float, nargs="+", default=[4, 16, 40], help="turnip budgets, GiB per GPU")
    parser.add_argument("--turnip-steps", type=int, default=0, help="decode steps for turnip (default 0: all --new-tokens)")
    parser.add_argument("--orders", nargs="+", default=["nondet"], help="turnip dispatch orders (nondet, fixed, random)")
    parser.add_argument("--queue-depths", nargs="+", type=int, default=[2],
                        help="the cuda backend's compute-lane queue depths to run turnip with (turnip@G/qD past the first)")
    parser.add_argument("--prefills", type=int, default=99, help="time one prompt's prefill at the first N budgets only (each compiles a 7b prefill)")
    parser.add_argument("--hf", action="store_true", help="also HF transformers + accelerate offload (slow)")
    parser.add_argument("--hf-steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="2 layers, 4 new tokens")
    parser.add_argument("--time-limit", type=float, default=210.0, help="seconds after which nothing new starts")
    parser.add_argument("--json", default=None, help="default: $OUT/generate.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interfere", action="store_true", help="(cuda) a second process copying to GPU 0 in bursts while turnip runs")
    args = parser.parse_args(argv)
    if args.interfere and args.device != "cuda":
        parser.error("--interfere copies to a GPU: it needs --device cuda")
    if args.quick:
        args.new_tokens, args.hf_steps = min(args.new_tokens, 4), min(args.hf_steps, 2)
    return args


def model(args) -> llama.LlamaConfig:
    config = llama.load_config(args.config)
    dtype = "float16" if args.device == "cuda" else "float32"  # torch's CPU half matmuls are slow or missing
    if args.quick:
        config = replace(config, num_hidden_layers=min(2, config.num_hidden_layers))
    return replace(config, dtype=dtype)


def elapsed() -> float:
    return time.perf_counter() - BEGAN


# ----- shared host state: weights and KV, pinned once ----------------------------------------------------
class Host:
    """Pinned torch weights (by Hugging Face name) and per layer the KV cache [ctx_max, B, kv_width], pinned."""

    def __init__(self, torch, config, seed: int, device: str):
        began = time.perf_counter()
        drawn = llama.RandomWeights(config, seed)
        pin = device == "cuda"
        self.weights = {name: _pinned(torch, np.asarray(drawn[name]), pin) for name in drawn}
        self.numpy = {name: t.numpy() for name, t in self.weights.items()}
        self.pin_seconds = time.perf_counter() - began
        self.torch, self.config, self.pin = torch, config, pin
        self.kv: list = []

    def make_kv(self, batch: int, prefix: int, steps: int, seed: int) -> float:
        """Per layer (k, v) pinned [capacity, B, kv_width] (capacity: prefix + steps rounded up to turnip's
        column of KV_BLOCK rows), the first `prefix` rows random; seconds."""
        torch, c = self.torch, self.config
        began = time.perf_counter()
        self.kv = []
        width = c.num_key_value_heads * c.head_dim
        capacity = -(-(prefix + steps) // KV_BLOCK) * KV_BLOCK
        pool = torch.from_numpy(np.random.default_rng(seed).standard_normal((prefix, batch, width)).astype(c.dtype))
        for _ in range(c.num_hidden_layers):
            pair = []
            for _ in range(2):
                cache = torch.zeros((capacity, batch, width), dtype=pool.dtype, pin_memory=self.pin)
                cache[:prefix].copy_(pool)
                pair.append(cache)
            self.kv.append(tuple(pair))
        return time.perf_counter() - began

    def turnip_cache(self, lengths: list[int]):
        """turnip's KvCache over the same pinned buffers (views: the steps write their rows in place; torch's
        decoders have run before, so their rows past the prefix are simply overwritten)."""
        from frontend.workloads.llama.kv_cache import KvCache

        return KvCache.wrap([(k.numpy(), v.numpy()) for k, v in self.kv], lengths, KV_BLOCK)


def _pinned(torch, array: np.ndarray, pin: bool):
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.pin_memory() if pin else tensor.clone()


# ----- the hand-written torch decoder ----------------------------------------------------------------------
LAYER_WEIGHTS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class TorchDecoder:
    """Greedy decoding of B sequences by hand; `stream` copies each layer's weights and KV prefix into one
    of two GPU buffers on a side stream while the previous layer computes, else everything is resident."""

    def __init__(self, torch, host: Host, device: str, stream: bool):
        self.torch, self.host, self.config, self.stream = torch, host, host.config, stream
        self.device = torch.device(device)
        self.gpu = device == "cuda"
        c = self.config
        dev = self.device
        self.norm = host.weights["model.norm.weight"].to(dev)
        self.head = host.weights[llama.head_name(c)].to(dev)
        names = [[f"model.layers.{l}.{w}.weight" for w in LAYER_WEIGHTS] for l in range(c.num_hidden_layers)]
        self.names = names
        if stream:
            self.slots = [{n.split(".", 3)[3]: torch.empty_like(host.weights[n], device=dev) for n in names[0]} for _ in range(2)]
            self.kv_slots = [tuple(torch.empty_like(t, device=dev) for t in host.kv[0]) for _ in range(2)]
            self.copier = torch.cuda.Stream() if self.gpu else None
        else:
            self.layers = [{n.split(".", 3)[3]: host.weights[n].to(dev) for n in layer} for layer in names]
            self.kv = [tuple(t.to(dev) for t in pair) for pair in host.kv]

    def step(self, tokens, ctx: int):
        """Logits [B, vocab] (float32) of one step at position `ctx` (every cache holds `ctx` rows)."""
        torch, c = self.torch, self.config
        x = self.host.weights["model.embed_tokens.weight"][tokens].to(self.device, non_blocking=True)
        angles = ctx * torch.tensor(inverse_frequencies(c, ctx + 1), dtype=torch.float64)
        cos, sin = (f(torch.cat([angles, angles])).to(self.device, x.dtype) for f in (torch.cos, torch.sin))
        ready = self._fetch(0, ctx) if self.stream else None
        for layer in range(c.num_hidden_layers):
            if self.stream:
                self._wait(ready)
                nxt = self._fetch(layer + 1, ctx) if layer + 1 < c.num_hidden_layers else None
                w, (k, v) = self.slots[layer % 2], self.kv_slots[layer % 2]
            else:
                w, (k, v) = self.layers[layer], self.kv[layer]
            x = self._layer(x, w, k, v, ctx, cos, sin, layer)
            if self.stream:
                ready = nxt
        h = _rmsnorm(torch, x, self.norm, c.rms_norm_eps)
        return (h @ self.head.T).float()

    def _fetch(self, layer: int, ctx: int):
        """Queue layer `layer`'s weights and KV prefix into its slot on the side stream; the event that says done."""
        torch, host = self.torch, self.host
        slot, kv_slot = self.slots[layer % 2], self.kv_slots[layer % 2]
        if not self.gpu:
            for name in self.names[layer]:
                slot[name.split(".", 3)[3]].copy_(host.weights[name])
            for dst, src in zip(kv_slot, host.kv[layer]):
                dst[:ctx].copy_(src[:ctx])
            return None
        self.copier.wait_stream(torch.cuda.current_stream())  # the slot's previous layer has finished with it
        with torch.cuda.stream(self.copier):
            for name in self.names[layer]:
                slot[name.split(".", 3)[3]].copy_(host.weights[name], non_blocking=True)
            for dst, src in zip(kv_slot, host.kv[layer]):
                dst[:ctx].copy_(src[:ctx], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copier)
        return event

    def _wait(self, event) -> None:
        if event is not None:
            self.torch.cuda.current_stream().wait_event(event)

    def _layer(self, x, w, k_cache, v_cache, ctx: int, cos, sin, layer: int):
        torch, c = self.torch, self.config
        batch, heads, kv_heads, d = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = _rmsnorm(torch, x, w["input_layernorm.weight"], c.rms_norm_eps)
        q = _rope(torch, (h @ w["self_attn.q_proj.weight"].T).view(batch, heads, d), cos, sin)
        k = _rope(torch, (h @ w["self_attn.k_proj.weight"].T).view(batch, kv_heads, d), cos, sin)
        v = (h @ w["self_attn.v_proj.weight"].T).view(batch, kv_heads, d)
        k_cache[ctx] = k.reshape(batch, -1)
        v_cache[ctx] = v.reshape(batch, -1)
        if self.stream:  # the new rows back to the host cache (ordered before the slot is refilled)
            self.host.kv[layer][0][ctx].copy_(k_cache[ctx], non_blocking=True)
            self.host.kv[layer][1][ctx].copy_(v_cache[ctx], non_blocking=True)
        keys = k_cache[: ctx + 1].view(ctx + 1, batch, kv_heads, d).permute(1, 2, 0, 3)
        values = v_cache[: ctx + 1].view(ctx + 1, batch, kv_heads, d).permute(1, 2, 0, 3)
        a = _attend(torch, q.unsqueeze(2), keys, values)
        x = x + a.reshape(batch, heads * d) @ w["self_attn.o_proj.weight"].T
        h = _rmsnorm(torch, x, w["post_attention_layernorm.weight"], c.rms_norm_eps)
        gate, up = h @ w["mlp.gate_proj.weight"].T, h @ w["mlp.up_proj.weight"].T
        return x + (torch.nn.functional.silu(gate) * up) @ w["mlp.down_proj.weight"].T


def _rmsnorm(torch, x, weight, eps: float):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rope(torch, x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _attend(torch, q, k, v):
    """q [B, H, 1, D] over k, v [B, KV, T, D] (grouped query heads)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).squeeze(2)


def run_torch(torch, host: Host, device: str, stream: bool, prefix: int, steps: int, first, forced=None) -> dict:
    """Greedy decoding from the shared caches; per-step seconds, the tokens, the first steps' logits, peak
    memory. `forced` [B, steps]: teacher forcing, step s + 1 is fed forced[:, s] instead of its argmax (so
    two decoders' logits can be compared at every step, not only until a near tie flips a token)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    decoder = TorchDecoder(torch, host, device, stream)
    tokens = torch.as_tensor(first)
    seconds, chosen, logits = [], [], []
    with torch.inference_mode():
        for step in range(steps):
            began = time.perf_counter()
            out = decoder.step(tokens, prefix + step)
            tokens = out.argmax(-1).cpu() if forced is None else torch.as_tensor(forced[:, step])
            sync(torch, device)  # teacher-forced steps read nothing back: without it only the queueing is timed
            seconds.append(time.perf_counter() - began)
            chosen.append(tokens.numpy().copy())
            logits.append(out.cpu().numpy())
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    del decoder
    return {"step_s": seconds, "tokens": np.stack(chosen, 1), "logits": logits, "peak_bytes": peak}


# ----- the floor ----------------------------------------------------------------------------------------
def h2d_rate(torch, device: str) -> float:
    """Bytes per second of a pinned 1 GiB host-to-device copy (the median of three; 64 MiB on the CPU)."""
    count = GIB if device == "cuda" else 64 << 20
    src = torch.empty(count, dtype=torch.uint8, pin_memory=device == "cuda")
    dst = torch.empty(count, dtype=torch.uint8, device=device)
    times = []
    for _ in range(4):
        sync(torch, device)
        began = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(torch, device)
        times.append(time.perf_counter() - began)
    return count / statistics.median(times[1:])


def stream_bytes(host: Host, prefix: int, steps: int) -> int:
    """Host-to-device bytes of one streaming step at the mean context: every layer's weights and KV prefix."""
    c = host.config
    layer = sum(host.weights[f"model.layers.0.{w}.weight"].nbytes for w in LAYER_WEIGHTS)
    item = np.dtype(c.dtype).itemsize
    batch = host.kv[0][0].shape[1]
    kv = 2 * (prefix + (steps - 1) / 2) * batch * c.num_key_value_heads * c.head_dim * item
    return int(c.num_hidden_layers * (layer + kv))


def sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----- turnip and HF ---------------------------------------------------------------------------------------
def run_turnip(host: Host, device: str, budget: float, prompts: list, forced: np.ndarray, steps: int,
               prefill: bool, order: str = "nondet", queue_depth: int = 2) -> dict:
    """One session at `budget` GiB: with `prefill`, a prefill of one prompt (timed apart, and the same
    prompt through `turnip llama`'s path: compile and run of the prefill graph); then `steps`
    teacher-forced steps of the batch, in the host's pinned KV buffers."""
    from turnip import Session

    options = {"queue_depth": queue_depth} if device == "cuda" else {}
    with Session(config=host.config, weights=host.numpy, memory=int(budget * GIB), backend=device, order=order,
                 backend_options=options) as session:
        began = time.perf_counter()
        alone = session.generate([prompts[0]], 1) if prefill else None
        first_call = time.perf_counter() - began
        cache = host.turnip_cache([len(p) - 1 for p in prompts])
        began = time.perf_counter()
        result = session.generate(prompts, steps, forced=forced[:, :steps], caches=cache)
        wall = time.perf_counter() - began
        moved = result.bytes_offloaded + result.bytes_reloaded
    # after the session is closed: two prepared cuda backends may not share a process's library hooks
    llama_s = llama_prefill(host, device, budget, prompts[0][:-1]) if prefill else float("nan")
    return {"prefill_s": alone.prefill_seconds if alone else float("nan"), "llama_prefill_s": llama_s, "first_call_s": first_call,
            "step_s": result.step_seconds, "step_run_s": result.step_run_seconds, "step_bytes_placed": result.step_bytes_placed,
            "decode_wall_s": wall, "compiles": result.compiles, "step_wall_s": wall / steps, "compile_s": result.compile_seconds,
            "bytes_moved_per_step": moved / steps, "bytes_reloaded_per_step": result.bytes_reloaded / steps,
            "peak_arena": result.peak_arena, "arena": session.arena, "logits": result.logits, "backends_built": session.backends_built}


def llama_prefill(host: Host, device: str, budget: float, ids: np.ndarray) -> float:
    """The run time of `turnip llama`'s prefill of `ids` at `budget` (its graph, compiled, run once on a fresh
    backend: what `turnip llama` reports), to hold the session's prefill against."""
    from passes.pipeline import compile_taskgraph
    from runtime import arena_budget, execute

    built = llama.build_llama(host.config, len(ids), kv_outputs=True)
    memgraph = compile_taskgraph(built.graph, arena_budget(built.graph, int(budget * GIB), device))
    return execute(memgraph, backend=device, inputs=built.feed(host.numpy, ids), verify=False).summary.wall_time


def run_hf(torch, host: Host, budget: float, prompts: list, steps: int, cache: str = "default") -> dict:
    """transformers + accelerate with the weights capped at `budget` GiB; seconds per new token after the
    first. `cache`: "default" (the KV cache on the GPU) or "offloaded" (transformers' OffloadedCache)."""
    from accelerate import dispatch_model, infer_auto_device_map
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()  # its own peak, not an earlier system's
    c = host.config
    hf_config = LlamaConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                            vocab_size=c.vocab_size, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope.theta,
                            max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings)
    with torch.device("meta"):
        model = LlamaForCausalLM(hf_config).to(torch.float16)
    model.load_state_dict(dict(host.weights), assign=True, strict=False)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hf_config)  # its inv_freq buffer, made on the meta device, is no weight
    device_map = infer_auto_device_map(model, max_memory={0: f"{budget}GiB", "cpu": "400GiB"}, no_split_module_classes=["LlamaDecoderLayer"])
    model = dispatch_model(model.eval(), device_map=device_map)
    ids = torch.as_tensor(np.stack(prompts)).cuda()
    times = []
    with torch.inference_mode():  # untimed: the first generate's one-time set-up would otherwise be subtracted from the steps
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                       **({} if cache == "default" else {"cache_implementation": "offloaded"}))
    for new in (1, steps):
        torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           **({} if cache == "default" else {"cache_implementation": "offloaded"}))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    peak = torch.cuda.max_memory_allocated()
    del model
    return {"step_s": [(times[1] - times[0]) / (steps - 1)], "prefill_s": times[0], "peak_bytes": peak, "new_tokens": steps, "cache": cache}


# ----- one shape ------------------------------------------------------------------------------------------
def bench_shape(torch, host: Host, args, shape: dict, save) -> None:
    """Every system on one B x P `shape` (its figures go into `shape["systems"]`; `save()` after each)."""
    c, device, steps, limit = host.config, args.device, args.new_tokens, args.time_limit
    batch, prompt = shape["batch"], shape["prompt"]
    prefix = prompt - 1
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(prompt // 2, prompt + 1, batch) if shape.get("ragged") else np.full(batch, prompt)
    prompts = [rng.integers(0, c.vocab_size, n) for n in lengths]
    shape.update(new_tokens=steps, kv_pin_s=host.make_kv(batch, prefix, steps, args.seed), systems={}, lengths=lengths.tolist())
    systems = shape["systems"]
    attempt = functools.partial(attempt_system, save=save)
    turnip_steps = args.turnip_steps or steps
    if shape.get("ragged"):  # turnip only: nondet against fixed
        with interference(args, shape):
            for budget in args.budgets:
                for order in args.orders:
                    name = f"turnip@{budget:g}" + ("" if order == "nondet" else f"/{order}")
                    got = attempt(systems, name, lambda: run_turnip(host, device, budget, prompts, np.zeros((batch, steps), np.int64),
                                                                    turnip_steps, False, order), limit)
                    if got:
                        got.pop("logits")
        return
    first = np.array([p[-1] for p in prompts])
    resident = attempt(systems, "torch-resident", lambda: run_torch(torch, host, device, False, prefix, steps, first), limit)
    forced = resident["tokens"] if resident else None  # torch-stream is teacher-forced like turnip
    streamed = attempt(systems, "torch-stream", lambda: run_torch(torch, host, device, True, prefix, steps, first, forced), limit)
    if streamed and resident:  # the same code: only the copies differ
        streamed["logit_error_per_step"] = [float(np.abs(g - w).max()) for g, w in zip(streamed["logits"], resident["logits"])]
    rate = h2d_rate(torch, device)
    moved = stream_bytes(host, prefix, steps)
    systems["floor"] = {"step_s": [moved / rate], "bytes_moved_per_step": moved, "h2d_bytes_per_s": rate}
    if device == "cuda":
        torch.cuda.empty_cache()
    forced = resident["tokens"] if resident else np.zeros((batch, steps), np.int64)
    with interference(args, shape):
        for i, budget in enumerate(args.budgets):
            for order, depth in [(order, depth) for order in args.orders for depth in args.queue_depths]:
                prefill = i < args.prefills and order == args.orders[0] and depth == args.queue_depths[0]
                name = f"turnip@{budget:g}" + ("" if order == "nondet" else f"/{order}") + ("" if depth == args.queue_depths[0] else f"/q{depth}")
                got = attempt(systems, name, lambda: run_turnip(host, device, budget, prompts, forced, turnip_steps, prefill, order, depth), limit)
                if got and resident:
                    got["logit_error_per_step"] = [float(np.abs(g - w).max()) for g, w in zip(got.pop("logits"), resident["logits"])]
                elif got:
                    got.pop("logits")
    if args.hf and device == "cuda":
        for cache in ("default", "offloaded"):
            name = f"hf-offload@{min(args.budgets):g}" + ("" if cache == "default" else "/offloaded")
            attempt(systems, name, lambda: run_hf(torch, host, min(args.budgets), prompts, args.hf_steps, cache), limit)


@contextlib.contextmanager
def interference(args, shape: dict):
    """With --interfere (cuda only: `parse` refuses it on the CPU), a process copying to GPU 0 in bursts for
    the block's duration; its figures (bytes, busy seconds, seconds, and the bursts' ranges) go into
    shape["interferer"]."""
    if not args.interfere:
        yield
        return
    from bench_interference import DEFAULT_BURST_MS, DEFAULT_GAP_MS, Interferers

    with Interferers([0], args.seed, DEFAULT_BURST_MS, DEFAULT_GAP_MS) as interferers:
        interferers.start()
        yield
    figures = interferers.figures[0]
    shape["interferer"] = {**figures, "rate": figures["bytes"] / figures["seconds"], "burst_ms": DEFAULT_BURST_MS, "gap_ms": DEFAULT_GAP_MS}


def attempt_system(systems: dict, name: str, run, limit: float, save) -> dict | None:
    """Run one system unless past the time `limit` (seconds since the start); record its figures, or the
    one-line reason it has none; then `save()` (a stage killed later keeps what ran)."""
    if elapsed() > limit:
        systems[name] = {"skipped": f"past the time limit ({limit:.0f} s)"}
        print(f"{name}: skipped, past the time limit", flush=True)
        save()
        return None
    began = time.perf_counter()
    try:
        got = run()
    except Exception as err:  # a benchmark records a failing system and goes on with the others
        systems[name] = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
        print(f"{name}: failed: {systems[name]['error']}", flush=True)
        save()
        return None
    got["system_s"] = time.perf_counter() - began
    systems[name] = got
    save()
    print(f"{name}: {median_ms(got):.1f} ms per step ({got['system_s']:.1f} s)", flush=True)
    return got


def public(value):
    """`value` without the logits kept for comparisons (too large for the JSON)."""
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items() if k != "logits"}
    if isinstance(value, list):
        return [public(v) for v in value]
    return value


def median_ms(figures: dict) -> float:
    steps = figures.get("step_s") or [float("nan")]
    return 1e3 * statistics.median(steps[1:] if len(steps) > 2 else steps)


def table(shapes: list[dict]) -> str:
    lines = ["| B x P | system | decode ms/step (median) | tokens/s | mean ms/step | compiles | GB moved/step | peak GiB "
             "| prefill s (llama s) | max logit err |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape in shapes:
        size = f"{shape['batch']} x {shape['prompt']}" + (" ragged" if shape.get("ragged") else "")
        if "interferer" in shape:
            size += f" (interferer {shape['interferer']['rate'] / 1e9:.1f} GB/s)"
        for name, f in shape["systems"].items():
            if "step_s" not in f:
                lines.append(f"| {size} | {name} | {f.get('skipped') or f.get('error')} | | | | | | | |")
                continue
            ms = median_ms(f)
            mean = 1e3 * statistics.mean(f["step_s"])
            peak = f.get("peak_bytes") or f.get("peak_arena") or 0
            err = f.get("logit_error_per_step")
            prefill = f"{f.get('prefill_s', float('nan')):.3f} ({f.get('llama_prefill_s', float('nan')):.3f})"
            lines.append(f"| {size} | {name} | {ms:.1f} | {shape['batch'] * 1e3 / ms:.1f} | {mean:.1f} | {f.get('compiles', '')} "
                         f"| {f.get('bytes_moved_per_step', 0) / 1e9:.2f} | {peak / GIB:.2f} | {prefill} "
                         f"| {max(err) if err else float('nan'):.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    if args.device == "cuda":
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    config = model(args)
    host = Host(torch, config, args.seed, args.device)
    print(f"{args.config}: {config.num_hidden_layers} layers, {config.dtype}; weights drawn and pinned in {host.pin_seconds:.1f} s", flush=True)
    results = {"config": args.config, "layers": config.num_hidden_layers, "dtype": config.dtype, "device": args.device,
               "quick": args.quick, "weights_pin_s": host.pin_seconds, "turnip_steps": args.turnip_steps, "shapes": []}
    path = Path(args.json or Path(os.environ.get("OUT", "out")) / "generate.json")
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        results["total_s"] = elapsed()
        path.write_text(json.dumps(public(results), indent=1, default=lambda x: x.tolist() if hasattr(x, "tolist") else str(x)))

    for text in args.shapes:
        size, _, kind = text.lower().partition(":")
        batch, prompt = (int(x) for x in size.split("x"))
        results["shapes"].append({"batch": batch, "prompt": prompt, "ragged": kind == "ragged"})
        bench_shape(torch, host, args, results["shapes"][-1], save)
    save()
    print(f"\nturnip: the median of its teacher-forced steps after the first (a step: all but its compile); the mean and the "
          f"compiles in the last columns; logit error against torch-resident\n{table(results['shapes'])}\nwrote {path}  ({elapsed():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

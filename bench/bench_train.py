"""LoRA fine-tuning of LLaMA-7B under a GPU memory budget: turnip's training step against the hand-written
streaming trainer, transformers + peft, and the floors (issue 46, "Performance"), every system in one process.

    python3 bench/bench_train.py                                    # 7b fp16, rank 16 on q,k,v,o, batch 1, 4096 and 16384 tokens, 8 and 4 GiB
    python3 bench/bench_train.py --seq-lens 4096 --budgets 8        # one point
    python3 bench/bench_train.py --sections kernels                 # attention_grad's rates on each path (turnip_ir/cost.py)
    python3 bench/bench_train.py --device cpu --quick               # a tiny config end to end on the CPU (tests/test_bench_train.py)
    python3 bench/bench_train.py --seq-lens 4096 --budgets 8 --systems turnip --remat-advance   # the planner's REMAT_ADVANCE A/B

Weights: random, in the model's dtype, drawn on the GPU (`normal_` on the CPU takes minutes for 7b) and copied
once into pinned host memory, which every system reads: projections N(0, 1/fan-in), the embedding and the LM
head N(0, 1/hidden), norms 1. Adapters (float32, the same for every system): A N(0, 1/in), B N(0, 0.02^2)
(nonzero, so that A has a gradient). Token ids random. Systems, per sequence length T (batch 1):
  turnip@G          `build_training_step` compiled at G GiB per GPU (the cuda backend's workspace held back, remat
                    on, the weights starting in pinned host memory and the activations on the GPU, as the torch
                    systems start them), prepared once; a warm-up, then `--steps` timed steps in each order,
                    nondet and fixed taking turns: a step's device makespan (forward, backward, the adapters'
                    float32 gradients copied out) and wall time, bytes offloaded and reloaded, the sim's
                    prediction, the process's device memory; its loss and gradients against torch-stream's;
  torch-stream      bench/train_baseline.py's StreamingTrainer (the hand baseline docs/hardware.md describes), uncapped:
                    its own peak allocation and process memory beside;
  torch-stream@G    the same with torch's allocator capped at G GiB (`set_per_process_memory_fraction`), layer
                    inputs kept on the GPU, or where that runs out of memory offloaded to pinned host memory;
  torch-resident    ResidentTrainer: every weight on the GPU, one autograd graph, no checkpoint, where it fits:
                    the check of torch-stream's gradients at full size, and a compute reference;
  hf-peft           transformers' LlamaForCausalLM with peft's LoRA (the same adapters), gradient checkpointing,
                    fp16 autocast, resident, where it fits (no budget: it needs the whole model on the GPU);
  hf-offload@G      (cuda, not in the default systems) the same with accelerate's offload: the decoder layers
                    that do not fit G beside the activations have their frozen projections in pinned host
                    memory, copied in by accelerate's hooks before each forward (the recompute's included),
                    torch's allocator capped at G (`offload_map`);
  floor@G           max(PCIe, compute): PCIe, the bytes that must cross at G GiB (the layer weights once, once
                    more but for what G could keep across the turn from forward to backward, the LM head once)
                    over the measured host-to-device rate, beside the streaming traffic (the layer weights
                    twice); compute, the step's FLOPs (the kernel table's over the taskgraph, no recompute; an
                    attention_grad link at half its block's fused backward) over the measured fp16 GEMM rate;
  command@G         `turnip finetune --config ... --memory G` in a fresh process, as a user runs it (not in the
                    default systems): spawn to exit, its log's first step and later steps (walls: the first
                    compiles and prepares; each includes feeding the batch and the host's AdamW), device
                    memory sampled by nvidia-smi;
  adamw             torch's fused AdamW over the float32 adapters, timed apart (in no step above).
Section `kernels` (cuda): one attention_grad link of 7b's blocks (4096 x 4096, 32 heads of 128, fp16) on each
path (TURNIP_ATTENTION_GRAD: cudnn, flash, cublas), full and causal, wrt q and kv: seconds and the rate in the
fused backward's FLOPs, what cost.py's `attention_grad_flops` and `causal_attention_grad_flops` stand for.
Times: CUDA events (torch) or device makespans (turnip), the median of the timed steps after a warm-up. Prints
one table last; the JSON (--json, default $OUT/train.json) keeps every figure. `--time-limit` skips what
would start after it, saying so, so that a stage always ends with its table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import train_baseline as tb
from bench_generate import attempt_system, elapsed, h2d_rate, sync

from frontend.workloads import llama
from frontend.workloads.llama.train import LoraSpec

GIB = 1 << 30
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b", help="a preset or a config.json (default 7b)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--budgets", type=float, nargs="+", default=[8, 4], help="GiB per GPU")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per system and order, after a warm-up")
    parser.add_argument("--orders", nargs="+", default=["nondet", "fixed"])
    parser.add_argument("--systems", nargs="+", default=["turnip", "torch-stream", "torch-resident", "hf-peft", "floor", "adamw"])
    parser.add_argument("--command-steps", type=int, default=4, help="steps of the `command` system's `turnip finetune`")
    parser.add_argument("--sections", nargs="+", default=["train"], choices=["train", "kernels"])
    parser.add_argument("--attention", default="torch-cudnn", help="turnip's attention provider (auto ranks torch-cudnn "
                        "against triton by the sim: a second compile per point)")
    parser.add_argument("--no-remat", action="store_true", help="plan turnip without recompute")
    parser.add_argument("--remat-advance", action="store_true", help="plan turnip's recompute with passes/planner.py's "
                        "REMAT_ADVANCE and REMAT_DEPTH 2 (off by default; the A/B of docs/passes.md, 'Rematerialization')")
    parser.add_argument("--recompute", default="auto", metavar="K", help="the first K layers' forward computed again "
                        "before their backward (frontend/autodiff.py `recompute`); auto (the default): the sim chooses, as "
                        "the session does on the cuda backend (turnip/recompute.py)")
    parser.add_argument("--loss-scale", type=float, default=1024.0)
    parser.add_argument("--quick", action="store_true", help="2 layers of the config (with --device cpu: float32, seq 24, tiny budgets)")
    parser.add_argument("--time-limit", type=float, default=540.0, help="seconds after which nothing new starts")
    parser.add_argument("--json", default=None, help="default: $OUT/train.json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick and args.device == "cpu":
        args.seq_lens = [24] if args.seq_lens == [4096, 16384] else args.seq_lens
        args.budgets = [0.0005, 0.002] if args.budgets == [8, 4] else args.budgets
        args.steps = min(args.steps, 2)
    return args


def model(args) -> llama.LlamaConfig:
    config = llama.load_config(args.config)
    if args.quick:
        config = replace(config, num_hidden_layers=min(2, config.num_hidden_layers))
    if args.device == "cpu":  # torch's CPU half matmuls are slow or missing
        config = replace(config, dtype="float32")
    return config


# ----- shared host state -------------------------------------------------------------------------------------
class Host:
    """The weights (pinned torch tensors by HF name, and numpy views of them), the adapters, the ids."""

    def __init__(self, torch, config, lora: LoraSpec, seq_lens: list[int], seed: int, device: str):
        began = time.perf_counter()
        self.torch, self.config, self.lora, self.device = torch, config, lora, device
        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = getattr(torch, config.dtype)
        self.weights = {}
        shapes = llama.weight_shapes(config) | {llama.head_name(config): (config.vocab_size, config.hidden_size)}
        for name, shape in shapes.items():
            if len(shape) == 1:
                value = torch.ones(shape, dtype=dtype)
            else:
                drawn = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, shape[1] ** -0.5, generator=gen)
                value = torch.empty(shape, dtype=dtype, pin_memory=device == "cuda")
                value.copy_(drawn)
                del drawn
            self.weights[name] = value
        self.numpy = {name: t.numpy() for name, t in self.weights.items()}
        rng = np.random.default_rng(seed)
        self.adapters = {name: (rng.standard_normal(shape) * (shape[1] ** -0.5 if "lora_A" in name else 0.02)).astype(np.float32)
                         for name, shape in lora.shapes(config).items()}
        self.ids = {t: rng.integers(0, config.vocab_size, (1, t)) for t in seq_lens}
        self.draw_s = time.perf_counter() - began

    def layer_bytes(self) -> int:
        return sum(t.nbytes for name, t in self.weights.items() if name.startswith("model.layers."))

    def head_bytes(self) -> int:
        return self.weights[tb.head(self.config)].nbytes + self.weights["model.norm.weight"].nbytes


class DeviceMemory:
    """The GPU's used memory (total - free, `torch.cuda.mem_get_info`) before a block and at its highest,
    sampled every 2 ms on a thread: the process's device memory, context included, on a GPU it has alone."""

    def __init__(self, torch, device: str):
        self.torch, self.on = torch, device == "cuda"
        self.before = self.peak = 0
        self.stop = threading.Event()

    def __enter__(self):
        if self.on:
            self.before = self.peak = self._used()
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _used(self) -> int:
        free, total = self.torch.cuda.mem_get_info()
        return total - free

    def _sample(self) -> None:
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, self._used())

    def __exit__(self, *exc):
        if self.on:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, self._used())

    def figures(self) -> dict:
        return {"device_before": self.before, "device_peak": self.peak}


def release(torch, device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)


# ----- turnip ------------------------------------------------------------------------------------------------
def run_turnip(torch, host: Host, args, seq_len: int, budget_gib: float) -> dict:
    """One training step compiled at `budget_gib`, prepared once, timed in each order (module docstring)."""
    from frontend.workloads.llama.train import build_training_step
    from passes.pipeline import compile_taskgraph
    from runtime import sim_makespan
    from runtime.api import plan_choosing_attention
    from turnip.recompute import choose_recompute
    from turnip_ir.cost import CostModel

    budget = int(budget_gib * GIB)
    began = time.perf_counter()
    planned = {}

    def plan(step):
        def compile_at(arena):
            with remat_mode(args.remat_advance):
                return compile_taskgraph(step.graph, arena, remat=not args.no_remat, inputs="host", start_on_gpu=step.activation_ids)

        # the arena sized for what a plan with recompute pins, as the session sizes it
        planned[step.recomputed] = plan_choosing_attention(step.graph, budget, compile_at, args.device, attention=args.attention,
                                                           remat=not args.no_remat)
        return planned[step.recomputed].memgraph

    def build(recompute):
        return build_training_step(host.config, 1, seq_len, host.lora, loss_scale=args.loss_scale, recompute=recompute)

    recomputing = None
    if args.recompute == "auto":  # as the session chooses on the cuda backend (turnip/recompute.py)
        recomputing = choose_recompute(build, plan, host.config.num_hidden_layers,
                                       lambda: CostModel().for_attention(next(iter(planned.values())).provider))
        step = recomputing.step
    else:
        step = build(int(args.recompute))
        plan(step)
    choice = planned[step.recomputed]
    memgraph = choice.memgraph
    inputs = step.feed(host.numpy, host.adapters, host.ids[seq_len])
    figures = {"compile_s": time.perf_counter() - began, "replanned": choice.replanned, "attention": choice.provider, "tasks": len(step.graph.nodes),
               "recomputed_layers": step.recomputed, "recompute_choice": recomputing.text() if recomputing else None,
               "recomputes": len(memgraph.recomputes()), "planned_offload": sum(n.nbytes for n in memgraph.nodes if n.op == "offload"),
               "planned_reload": sum(n.nbytes for n in memgraph.nodes if n.op == "reload")}
    cost = CostModel().for_attention(choice.provider) if args.device == "cuda" else None
    figures["sim_s"] = {order: sim_makespan(memgraph, order=order, cost=cost) for order in args.orders}
    release(torch, args.device)
    with DeviceMemory(torch, args.device) as memory:
        runs = _turnip_runs(memgraph, inputs, args, choice.provider)
    figures |= memory.figures() | runs["figures"]
    figures["loss"], figures["grads"] = step.loss(runs["outputs"]), step.grads(runs["outputs"])
    return figures


@contextlib.contextmanager
def remat_mode(advance: bool):
    """The planner's recompute with `REMAT_ADVANCE` and two levels of dead operands while the block runs
    (`advance`), else as it is."""
    from passes import planner

    kept = planner.REMAT_ADVANCE, planner.REMAT_DEPTH
    if advance:
        planner.REMAT_ADVANCE, planner.REMAT_DEPTH = True, 2
    try:
        yield
    finally:
        planner.REMAT_ADVANCE, planner.REMAT_DEPTH = kept


def _turnip_runs(memgraph, inputs, args, provider: str) -> dict:
    """Per order: every timed step's seconds (the device makespan on cuda, the wall on cpu) and wall, the
    bytes moved; the last run's outputs."""
    if args.device == "cpu":
        from runtime import execute

        per, outputs = {}, None
        for order in args.orders:
            walls = []
            for repeat in range(args.steps + 1):
                began = time.perf_counter()
                result = execute(memgraph, "cpu", order=order, seed=repeat, inputs=inputs)
                walls.append(time.perf_counter() - began)
            per[order] = {"step_s": walls[1:], "wall_s": walls[1:], "offloaded": result.summary.bytes_offloaded,
                          "reloaded": result.summary.bytes_reloaded}
            outputs = result.outputs
        return {"figures": _by_order(per, args.orders), "outputs": outputs}
    from cuda_common import loops

    from runtime.backends.cuda import CudaBackend

    backend = CudaBackend(attention_provider=provider)
    runs = loops(memgraph, backend, orders=tuple(args.orders), repeats=args.steps, inputs=inputs, alternate=True)
    per = {order: {"step_s": runs[order]["makespans"], "wall_s": runs[order]["wall"], "offloaded": runs[order]["summary"].bytes_offloaded,
                   "reloaded": runs[order]["summary"].bytes_reloaded} for order in args.orders}
    figures = _by_order(per, args.orders)
    figures["notes"] = runs["notes"]
    figures["library_bytes"] = runs["stats"].get("library_bytes", 0)
    return {"figures": figures, "outputs": runs["outputs"]}


def _by_order(per: dict, orders) -> dict:
    """The first order's figures at the top (its steps in `step_s`), every order's under `orders`, and the
    ratio of the first order's median step to each other's."""
    first = orders[0]
    figures = {"step_s": per[first]["step_s"], "offloaded": per[first]["offloaded"], "reloaded": per[first]["reloaded"], "orders": per}
    for order in orders[1:]:
        figures[f"{first}/{order}"] = statistics.median(per[first]["step_s"]) / statistics.median(per[order]["step_s"])
    return figures


# ----- the torch systems ---------------------------------------------------------------------------------------
def timed_steps(torch, device: str, steps: int, one) -> list[float]:
    """Seconds of `one()` after a warm-up: CUDA events on a GPU, the wall clock on the CPU."""
    one()
    seconds = []
    for _ in range(steps):
        sync(torch, device)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            one()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) * 1e-3)
        else:
            began = time.perf_counter()
            one()
            seconds.append(time.perf_counter() - began)
    return seconds


def run_trainer(torch, host: Host, args, seq_len: int, make, cap_gib: float | None = None) -> dict:
    """A train_baseline trainer (`make()`) stepped on the batch: its steps, loss, gradients, peak allocation
    and process memory; `cap_gib` caps torch's allocator (an out-of-memory error is the system's result)."""
    device = args.device
    release(torch, device)
    if device == "cuda":
        if cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / torch.cuda.get_device_properties(0).total_memory))
        torch.cuda.reset_peak_memory_stats()
    try:
        with DeviceMemory(torch, device) as memory:
            trainer = make()
            masters = trainer.masters(host.adapters)
            ids = host.ids[seq_len]

            def one():
                for p in masters.values():
                    p.grad = None
                return trainer.step(ids, masters)

            seconds = timed_steps(torch, device, args.steps, one)
            loss = one()
            grads = trainer.grads(masters)
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
        return {"step_s": seconds, "loss": loss, "grads": grads, "peak_allocated": peak, **memory.figures()}
    finally:
        release(torch, device)


def streaming(torch, host: Host, args, seq_len: int, cap_gib: float | None) -> dict:
    """torch-stream (uncapped), or under a cap: inputs kept, else offloaded."""
    for offload in (False, True) if cap_gib is not None else (False,):
        make = lambda offload=offload: tb.StreamingTrainer(torch, host.config, host.lora, host.weights, args.device,
                                                           args.loss_scale, offload_inputs=offload)
        try:
            got = run_trainer(torch, host, args, seq_len, make, cap_gib)
        except torch.OutOfMemoryError as err:
            if offload:
                raise RuntimeError(f"out of memory with layer inputs kept and offloaded: {str(err).splitlines()[0][:100]}") from None
            continue
        return got | {"offload_inputs": offload}
    raise AssertionError("unreachable")


def resident(torch, host: Host, args, seq_len: int) -> dict:
    return run_trainer(torch, host, args, seq_len, lambda: tb.ResidentTrainer(torch, host.config, host.lora, host.weights, args.device, args.loss_scale))


def run_command(args, seq_len: int, budget_gib: float) -> dict:
    """`turnip finetune` as a user runs it, in a fresh process: the bench's config and adapters' shape (random
    weights from `--config`, a new adapter), `--command-steps` steps on random ids, at `budget_gib`. Its wall
    from spawn to exit, the first step's and the later steps' seconds from its `--log` (each step's wall:
    the first includes compiling and preparing the plan), and its device memory as nvidia-smi samples it."""
    import csv
    import tempfile

    from bench_generation import DeviceSampler, run_child, summary_figures

    config = model(args)
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder, "ids.npy")
        rows = np.random.default_rng(args.seed).integers(0, config.vocab_size, (args.command_steps, seq_len))
        np.save(data, rows.astype(np.int64))
        log = Path(folder, "log.csv")
        described = Path(folder, "config.json")  # model(args)'s shape: --quick's layers, the cpu's float32
        doc = dict(llama.PRESETS[args.config]) if args.config in llama.PRESETS else json.loads(Path(args.config).read_text())
        doc.update(num_hidden_layers=config.num_hidden_layers, dtype=config.dtype)
        described.write_text(json.dumps(doc))
        command = [sys.executable, "-m", "turnip_cli.main", "finetune", "--config", str(described), "--data", str(data),
                   "--steps", str(args.command_steps), "--memory", f"{budget_gib:g}GiB", "--lora-rank", str(args.rank),
                   "--lora-targets", ",".join(TARGETS), "--seq-len", str(seq_len), "--adapter-out", str(Path(folder, "adapter")),
                   "--log", str(log), "--backend", args.device, "--seed", str(args.seed)]
        with DeviceSampler() as sampler:
            result = run_child(command, max(60.0, args.time_limit - elapsed() + 120), None, sampler.watch)
        result.update(sampler.figures())
        result.update({k: v for k, v in summary_figures(result["output_tail"]).items() if k.startswith("own_")})  # its NVML line
        if result["returncode"] != 0:
            raise RuntimeError(result.get("error", "failed"))
        steps = [float(row["seconds"]) for row in csv.DictReader(log.open())]
    result.update({"first_step_s": steps[0], "steps_s": steps, "step_s": steps[1:] or steps,
                   "device_peak": result["device_peak"] or 0})
    print(f"  turnip finetune: {result['wall_s']:.1f} s spawn to exit; first step {steps[0]:.2f} s, then "
          f"{statistics.median(result['step_s']):.3f} s; device peak {(result['device_peak'] or 0) / GIB:.2f} GiB", flush=True)
    return result


def run_adamw(torch, host: Host, args) -> dict:
    device = args.device
    masters = tb.Model(torch, host.config, host.lora, device).masters(host.adapters)
    for p in masters.values():
        p.grad = torch.ones_like(p)
    optimizer = tb.adamw(torch, masters)
    seconds = timed_steps(torch, device, args.steps, optimizer.step)
    release(torch, device)
    return {"step_s": seconds, "adapters": sum(p.numel() for p in masters.values())}


def hf_peft(torch, host: Host, args, seq_len: int, budget_gib: float | None = None) -> dict:
    """transformers + peft, gradient checkpointing, fp16 autocast: resident, or with `budget_gib` the
    layers that do not fit it offloaded by accelerate (module docstring)."""
    device, c = torch.device(args.device), host.config
    release(torch, args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cap = budget_gib is not None and args.device == "cuda"
    if cap:
        torch.cuda.set_per_process_memory_fraction(budget_gib * GIB / torch.cuda.get_device_properties(0).total_memory)
    try:
        with DeviceMemory(torch, args.device) as memory:
            figures = _hf_steps(torch, host, args, seq_len, device, budget_gib)
    finally:
        if cap:
            torch.cuda.set_per_process_memory_fraction(1.0)
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    return {**figures, "peak_allocated": peak, **memory.figures()}


def _hf_steps(torch, host: Host, args, seq_len: int, device, budget_gib: float | None) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    c = host.config
    hf = LlamaConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                     num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                     vocab_size=c.vocab_size, rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings,
                     rope_parameters={"rope_type": "default", "rope_theta": c.rope.theta},
                     max_position_embeddings=max(seq_len, c.max_position_embeddings), attn_implementation="sdpa", use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(hf)
    offload = budget_gib is not None
    model.load_state_dict({name: t if offload else t.to(device) for name, t in host.weights.items()}, assign=True, strict=False)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hf).to(device)
    lora = LoraConfig(r=host.lora.rank, lora_alpha=host.lora.alpha, target_modules=list(host.lora.targets), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    def adapter_params():
        return {name: model.get_parameter("base_model.model." + name.replace(".weight", ".default.weight")) for name in host.adapters}

    params = adapter_params()
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(host.adapters[name]))
    figures = {}
    if offload:
        from accelerate import dispatch_model

        device_map, figures["layers_on_gpu"] = offload_map(model, host, seq_len, budget_gib)
        model = dispatch_model(model, device_map=device_map, main_device=0)
        params = adapter_params()  # accelerate moved them onto the GPU as new Parameters: the old ones get no gradient
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.as_tensor(host.ids[seq_len]).to(device)

    def one():
        for p in params.values():
            p.grad = None
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        (loss * args.loss_scale).backward()
        return float(loss.detach())

    try:
        seconds = timed_steps(torch, args.device, args.steps, one)
        loss = one()
        grads = {name: (p.grad / args.loss_scale).float().cpu().numpy() for name, p in params.items()}
    finally:
        model = None
        release(torch, args.device)
    return {"step_s": seconds, "loss": loss, "grads": grads, "adapter_dtype": str(next(iter(params.values())).dtype), **figures}


def offload_map(model, host: Host, seq_len: int, budget_gib: float) -> tuple[dict, int]:
    """accelerate's device map for the peft model under `budget_gib`: the embedding, the final norm, the LM
    head and every adapter on GPU 0; whole decoder layers there while they fit beside an estimate of the
    step's activations (each layer's checkpointed input, one layer recomputed, the float32 logits and what
    the loss makes of them); of the other layers, the frozen projections in host memory (accelerate copies
    each in before its forward, the recompute included) and the rest on the GPU, so that the adapters train
    in place."""
    c = host.config
    width = 2  # fp16
    activations = (seq_len * c.hidden_size * width * c.num_hidden_layers  # checkpointed layer inputs
                   + seq_len * (6 * c.hidden_size + 3 * c.intermediate_size) * width  # one layer recomputed, and its gradients
                   + 5 * seq_len * c.vocab_size * 4)  # float32 logits, their log-softmax, gradients (4k at 8 GiB ran out with 2)
    room = budget_gib * GIB - activations - 2 * host.head_bytes()
    kept = max(0, min(c.num_hidden_layers, int(room // (host.layer_bytes() / c.num_hidden_layers))))
    prefix = "base_model.model."
    device_map = {prefix + "model.embed_tokens": 0, prefix + "model.norm": 0, prefix + "lm_head": 0, prefix + "model.rotary_emb": 0}
    for i in range(c.num_hidden_layers):
        layer = f"{prefix}model.layers.{i}"
        if i < kept:
            device_map[layer] = 0
            continue
        for name, module in model.get_submodule(layer).named_modules():
            if not name or next(module.children(), None) is not None:
                continue  # containers: their leaves are placed
            own = list(module.parameters(recurse=False))
            frozen = bool(own) and not any(p.requires_grad for p in own) and "norm" not in name
            device_map[f"{layer}.{name}"] = "cpu" if frozen else 0
    return device_map, kept


# ----- floors and kernels ----------------------------------------------------------------------------------------
def gemm_rate(torch, device: str) -> float:
    """FLOP/s of one 8192^3 GEMM in the model's half dtype (CUDA events, median of 5); NaN on the CPU."""
    if device != "cuda":
        return float("nan")
    from cuda_common import cuda_time

    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    seconds = cuda_time(lambda: torch.matmul(a, a), repeats=5)
    return 2 * 8192**3 / seconds


def step_flops(config, lora: LoraSpec, seq_len: int) -> int:
    """The training step's FLOPs: `graph_flops` of its taskgraph (no recompute)."""
    from frontend.workloads.llama.train import build_training_step

    return graph_flops(build_training_step(config, 1, seq_len, lora).graph)


def graph_flops(graph) -> int:
    """A training taskgraph's FLOPs: the kernel table's, an attention_grad link at half its block's fused
    backward (the two chains of a block together do its backward once)."""
    from turnip_ir.cost import fused_backward_flops
    from turnip_ir.kernels import KERNELS

    total = 0
    for node in graph.nodes.values():
        if node.op in ("input", "move"):
            continue
        shapes = [graph.nodes[i].shape for i in node.inputs]
        flops = fused_backward_flops(shapes, node.attrs) // 2 if node.op == "attention_grad" else KERNELS[node.op].flops(shapes, node.shape, node.attrs)
        total += flops
    return total


def floors(host: Host, rates: dict, seq_len: int, budgets: list[float]) -> dict:
    layers, head = host.layer_bytes(), host.head_bytes()
    flops = step_flops(host.config, host.lora, seq_len)
    compute = flops / rates["gemm"]
    out = {"flops": flops, "compute_s": compute, "stream_bytes": 2 * layers + head, "stream_s": (2 * layers + head) / rates["h2d"]}
    for budget in budgets:
        must = must_cross(layers, head, int(budget * GIB))
        out[f"{budget:g}"] = {"must_cross_bytes": must, "pcie_s": must / rates["h2d"], "step_s": [max(compute, must / rates["h2d"])]}
    return out


def must_cross(layers: int, head: int, budget: int) -> int:
    """The bytes a step must move to the GPU under `budget` bytes: the layer weights once, once more but for
    what the budget could keep across the turn from forward to backward, the LM head once."""
    return layers + max(0, layers - budget) + head


def kernel_rates(args) -> dict:
    """One attention_grad link of 7b's block shape on each path, full and causal, wrt q and kv (cuda)."""
    from cuda_common import loops

    from passes.pipeline import compile_taskgraph
    from runtime.backends.cuda import CudaBackend, attention_grad
    from turnip_ir.cost import fused_backward_flops
    from turnip_ir.taskgraph import TaskGraph

    tokens, heads, d = 4096, 32, 128
    results = {}
    for path in ("cudnn", "flash", "cublas"):
        os.environ[attention_grad.PATH_ENV] = path
        for causal in (False, True):
            for wrt in ("q", "kv"):
                g = TaskGraph(devices=1)
                q, k, v, do = (g.input((tokens, heads * d), "float16", device=0, id=n) for n in ("q", "k", "v", "do"))
                packed = g.input((tokens, heads * d + heads), "float32", device=0, id="packed")
                g.output(g.kernel("attention_grad", q, k, v, packed, do, heads=heads, kv_heads=heads, wrt=wrt, causal=causal, device=0, id="g"))
                name = f"{path}/{'causal' if causal else 'full'}/{wrt}"
                try:
                    runs = loops(compile_taskgraph(g, 2 * GIB), CudaBackend(attention_provider="torch-cudnn"), repeats=5)
                except Exception as err:  # a path that fails is a result
                    results[name] = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
                    continue
                seconds = runs["nondet"]["makespan"]
                flops = fused_backward_flops([(tokens, heads * d), (tokens, heads * d)], {"causal": causal})
                results[name] = {"seconds": seconds, "fused_tflops": flops / seconds / 1e12}
                print(f"attention_grad {name}: {seconds * 1e3:.3f} ms, {flops / seconds / 1e12:.0f} TFLOP/s of the fused backward", flush=True)
    os.environ.pop(attention_grad.PATH_ENV, None)
    return results


# ----- one sequence length ---------------------------------------------------------------------------------------
def bench_length(torch, host: Host, args, rates: dict, seq_len: int, point: dict, save) -> None:
    systems, limit = point["systems"], args.time_limit
    attempt = lambda name, run: attempt_system(systems, name, run, limit, save)
    want = set(args.systems)
    if "turnip" in want:
        for budget in args.budgets:
            attempt(f"turnip@{budget:g}", lambda budget=budget: run_turnip(torch, host, args, seq_len, budget))
    if "command" in want:
        for budget in args.budgets:
            attempt(f"command@{budget:g}", lambda budget=budget: run_command(args, seq_len, budget))
    if "torch-stream" in want:
        attempt("torch-stream", lambda: streaming(torch, host, args, seq_len, None))
        for budget in args.budgets:
            attempt(f"torch-stream@{budget:g}", lambda budget=budget: streaming(torch, host, args, seq_len, budget))
    if "torch-resident" in want:
        attempt("torch-resident", lambda: resident(torch, host, args, seq_len))
    if "hf-peft" in want:
        attempt("hf-peft", lambda: hf_peft(torch, host, args, seq_len))
    if "hf-offload" in want and args.device == "cuda":
        for budget in args.budgets:
            attempt(f"hf-offload@{budget:g}", lambda budget=budget: hf_peft(torch, host, args, seq_len, budget))
    if "floor" in want and rates:
        bounds = floors(host, rates, seq_len, args.budgets)
        point["floor"] = {k: v for k, v in bounds.items() if not isinstance(v, dict)}
        for budget in args.budgets:
            systems[f"floor@{budget:g}"] = bounds[f"{budget:g}"]
    compare(point)
    save()


def compare(point: dict) -> None:
    """Each system's loss and gradients against torch-stream's (the gradients then dropped: not for the JSON)."""
    systems = point["systems"]
    reference = systems.get("torch-stream", {}).get("grads")
    for figures in systems.values():
        grads = figures.pop("grads", None)
        if grads is not None and reference is not None:
            figures["grad_error"] = tb.max_relative_error(grads, reference)
            figures["loss_error"] = abs(figures["loss"] - systems["torch-stream"]["loss"]) / abs(systems["torch-stream"]["loss"])


def public(value):
    """`value` without the gradients kept for comparisons (too large for the JSON)."""
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items() if k != "grads"}
    if isinstance(value, list):
        return [public(v) for v in value]
    return value


# ----- the table ---------------------------------------------------------------------------------------------------
def median_s(figures: dict) -> float:
    steps = figures.get("step_s") or [float("nan")]
    return statistics.median(steps)


def table(points: list[dict], budgets: list[float]) -> str:
    lines = ["| T | system | step s | vs torch-stream | vs floor | nondet/fixed | device GiB (peak) | allocated GiB | GB off / re | loss | grad err |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for point in points:
        systems = point["systems"]
        stream = median_s(systems.get("torch-stream", {}))
        for name, f in systems.items():
            if "step_s" not in f:
                lines.append(f"| {point['seq_len']} | {name} | {f.get('skipped') or f.get('error')} | | | | | | | | |")
                continue
            s = median_s(f)
            budget = name.partition("@")[2]
            floor = median_s(systems.get(f"floor@{budget}", {})) if budget else float("nan")
            ratio = next((f"{v:.3f}" for k, v in f.items() if "/" in k and isinstance(v, float)), "")
            moved = f"{f.get('offloaded', 0) / 1e9:.1f} / {f.get('reloaded', 0) / 1e9:.1f}" if "offloaded" in f else ""
            loss = f"{f['loss']:.4f}" if "loss" in f else ""
            lines.append(f"| {point['seq_len']} | {name} | {s:.3f} | {s / stream:.3f} | {s / floor:.3f} | {ratio} "
                         f"| {f.get('device_peak', 0) / GIB:.2f} | {f.get('peak_allocated', 0) / GIB:.2f} | {moved} | {loss} "
                         f"| {f.get('grad_error', float('nan')):.1e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    if args.device == "cuda":
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    config = model(args)
    lora = LoraSpec(rank=args.rank, alpha=2.0 * args.rank, targets=TARGETS)
    results = {"config": args.config, "layers": config.num_hidden_layers, "dtype": config.dtype, "device": args.device, "rank": args.rank,
               "targets": TARGETS, "quick": args.quick, "loss_scale": args.loss_scale, "remat_advance": args.remat_advance, "recompute": args.recompute, "points": []}
    path = Path(args.json or Path(os.environ.get("OUT", "out")) / "train.json")
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        results["total_s"] = elapsed()
        path.write_text(json.dumps(public(results), indent=1, default=lambda x: x.tolist() if hasattr(x, "tolist") else str(x)))

    if "kernels" in args.sections and args.device == "cuda":
        results["kernels"] = kernel_rates(args)
        save()
    if "train" in args.sections:
        host = Host(torch, config, lora, args.seq_lens, args.seed, args.device)
        results["weights_draw_s"] = host.draw_s
        print(f"{args.config}: {config.num_hidden_layers} layers, {config.dtype}; weights drawn and placed in {host.draw_s:.1f} s", flush=True)
        rates = {"h2d": h2d_rate(torch, args.device), "gemm": gemm_rate(torch, args.device)} if args.device == "cuda" else {}
        results["rates"] = rates
        if "adamw" in args.systems:
            attempt_system(results, "adamw", lambda: run_adamw(torch, host, args), args.time_limit, save)
        for seq_len in args.seq_lens:
            results["points"].append({"seq_len": seq_len, "systems": {}})
            bench_length(torch, host, args, rates, seq_len, results["points"][-1], save)
    save()
    print(f"\nsteps: the median of {args.steps} after a warm-up (turnip: device makespans, the first order's); vs floor: against "
          f"max(PCIe, compute) at the system's budget; grad err: the largest relative error of an adapter's gradient against "
          f"torch-stream's\n{table(results['points'], args.budgets)}\nwrote {path}  ({elapsed():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Turnip against PyTorch offloading and the physical floor, on one GPU, every system in one process call.

    python3 bench/run.py llama --tokens 8192 32768 --budgets 2 4 8 16 --json out.json
    python3 bench/run.py ffn --tokens 2048 8192 --budgets 8 --json out.json
    python3 bench/run.py llama --tokens 8192 --systems hf-offload --hf-points 7 2

Systems (all under the same per-GPU budget, in GiB; `--systems` picks):
  turnip-nondet, turnip-fixed  the memgraph compiled at the budget (weights starting in pinned host
                               memory, the activations fed in on the GPU as torch's are: `--inputs`),
                               run by the default policy and by the fixed-order ablation;
  torch-prefetch               the layer math by hand in torch (SDPA attention), weights pinned on the
                               host, layer i+1 copied on a side stream into a second buffer while layer i
                               computes; capped with set_per_process_memory_fraction;
  torch-resident               the same code with every weight on the GPU and no cap (the compute floor
                               with the best kernels); llama only;
  hf-offload                   transformers' LlamaModel through accelerate (device_map="auto",
                               max_memory={0: budget}) at `--hf-points` budgets; a plain torch module for ffn;
  floor                        max(FLOPs / measured GEMM peak, weight bytes / measured H2D), each over --gpus
                               (report.floor_seconds): every system starts with its weights in host memory,
                               so each weight crosses PCIe at least once.
Each time is the median of `--repeats` timed runs after a warm-up, with CUDA events (or device event
times, for turnip; the JSON keeps turnip's every timed run too, `makespans`). Outputs of every system are compared with torch-resident's (or turnip-nondet's), and with
`--compare-outputs` against turnip's output that another run saved with `--save-outputs` (one GPU's
against two GPUs', say).
Prints markdown tables; `--json` keeps every figure, for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_common import cuda_time, h2d_ceiling, loops, row  # noqa: E402
from report import floor_seconds  # noqa: E402
from runtime import sim_makespan  # noqa: E402
from runtime.api import plan_choosing_attention  # noqa: E402
from runtime.backends.base import ATTENTION_PROVIDERS  # noqa: E402
from runtime.backends.cuda import CudaBackend  # noqa: E402
import notifiers  # noqa: E402,F401  (registers the alternative notifiers this script may pick)
from runtime.backends.cuda.completion import DEFAULT_NOTIFIER, NOTIFIERS  # noqa: E402
from runtime.backends.cuda.attention import shared_stream  # noqa: E402
from runtime.backends.cuda.kernels_numba import ROPE_BUILD  # noqa: E402
from turnip_cli.planning import SCHEDULE_CHOICES, compile_choosing_schedule  # noqa: E402
from frontend.workloads.llama.graph import LAYER_ORDERS  # noqa: E402
from runtime.summary import union_length  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402
from turnip_ir.errors import BudgetError  # noqa: E402
from turnip_ir.files import atomic_write  # noqa: E402

GIB = 1 << 30
TRACES = None
"""A folder for the turnip runs' traces, the last run of each order (--traces)."""
COPY_DEPTH = None
"""Queue depth of the copy-engine lanes (--copy-depth; None: CudaBackend's default)."""
QUEUE_DEPTH = None
"""Queue depth of the compute lanes (--queue-depth; None: CudaBackend's default)."""
ATTENTION = "auto"
"""Turnip's attention provider (--attention)."""
NOTIFIER = DEFAULT_NOTIFIER
"""How turnip's loop learns a vertex finished (--notifier; runtime/backends/cuda/completion.py)."""
SCHEDULE = "given"
"""The compiler's simulated schedule for turnip (--schedule; auto: every schedule, the sim's fastest plan)."""
INPUTS = "weights"
"""Where turnip's plan starts its inputs (--inputs, INPUT_STARTS)."""
INPUT_STARTS = {
    "weights": "the weights in host memory (every weight crosses PCIe, as the floor counts), the activations "
               "fed in (llama's embedded tokens and RoPE tables, the FFN's x) on the GPU, as the torch systems start them",
    "host": "every input in host memory, the activations too (the default before `weights`)",
    "gpu": "the first-used inputs on the GPU while they fit, copied there before the timed run, as `turnip llama` "
           "plans (the floor then overstates the bytes that cross)",
}
ORDERS = ("nondet", "fixed")
SYSTEMS = ("turnip-nondet", "turnip-fixed", "torch-prefetch", "torch-resident", "hf-offload", "floor")


# ----- workloads ---------------------------------------------------------------------------------------
class Llama:
    """LLaMA 7b prefill: the turnip graph and inputs, and the same weights as torch tensors."""

    def __init__(self, tokens: int, seed: int = 0, preset: str = "7b", gpus: int = 1, placement: str = "sequence",
                 dtype: str | None = None, block: int | None = None, layer_order: str = "blocks", query_group: int = 1):
        from dataclasses import replace

        from frontend.workloads import llama

        self.config = llama.load_config(preset)
        self.config = replace(self.config, dtype=dtype or self.config.dtype)
        self.tokens = tokens
        self.weights = {name: llama.RandomWeights(self.config, seed)[name] for name in llama.weight_shapes(self.config)}
        self.ids = llama.random_ids(self.config, tokens, seed)
        self.built = llama.build_llama(self.config, tokens, block, gpus=gpus, placement=placement, layer_order=layer_order,
                                       query_group=query_group)
        self.graph = self.built.graph
        self.activations = self.built.activation_ids
        self.inputs = self.built.feed(self.weights, self.ids)
        self.hidden = self.inputs_array("hidden")
        from frontend.workloads.llama.rope import rope_tables

        self.cos, self.sin = rope_tables(self.config, tokens)
        self.weight_bytes = sum(w.nbytes for name, w in self.weights.items() if "embed" not in name)
        self.flops = sum(_flops(node, self.graph) for node in self.graph.nodes.values())

    def host_layers(self, names, pin: bool):
        """Each layer's weights as torch CPU tensors (pinned once, then reused by every budget)."""
        key = "pinned" if pin else "plain"
        cache = self.__dict__.setdefault("_host", {})
        if key not in cache:
            layers = self.config.num_hidden_layers
            cache[key] = [[_torch_weight(self.weights[f"model.layers.{i}.{n}.weight"], pin) for n in names] for i in range(layers)]
        return cache[key]

    def inputs_array(self, name):
        from frontend.workloads.llama.weights import embed

        return embed(self.weights, self.ids, self.config)

    def output(self, outputs) -> np.ndarray:
        hidden = self.built.gather(outputs)
        return hidden.astype(np.float32) if hidden.dtype.name == "bfloat16" else hidden  # exact; numpy is slow on bf16


class Ffn:
    def __init__(self, tokens: int, seed: int = 0):
        from frontend.workloads import ffn

        self.tokens = tokens
        self.config = ffn.FfnConfig(layers=16, tokens=tokens, hidden=8192, ffn=32768, block=min(tokens, 2048), dtype="float16")
        program = ffn.build(self.config)
        self.program = program
        self.graph = program.taskgraph()
        self.activations = program.input_ids(ffn.ACTIVATIONS)
        rng = np.random.default_rng(seed)
        self.weights = {}
        for layer in range(16):
            for name, shape in ((f"w1.{layer}", (32768, 8192)), (f"w2.{layer}", (8192, 32768))):
                block = (rng.standard_normal((64, shape[1])) / np.sqrt(shape[1])).astype(np.float16)
                self.weights[name] = np.resize(block, shape)
        self.hidden = rng.standard_normal((tokens, 8192)).astype(np.float16)
        self.inputs = program.feed({"x": self.hidden, **self.weights})
        self.weight_bytes = sum(w.nbytes for w in self.weights.values())
        self.flops = sum(_flops(node, self.graph) for node in self.graph.nodes.values())

    def output(self, outputs) -> np.ndarray:
        return self.program.gather(self.program.outputs["y"], outputs)


def _flops(node, graph) -> int:
    from turnip_ir.kernels import KERNELS

    if node.op in ("input", "move"):
        return 0
    shapes = [graph.nodes[i].shape for i in node.inputs]
    return KERNELS[node.op].flops(shapes, node.shape, node.attrs)


# ----- turnip ------------------------------------------------------------------------------------------
def compile_turnip(graph, budget: int, activations=()):
    """Turnip's plan of `graph` at `budget` bytes per GPU as every turnip system here runs it: the cuda
    backend's arena, inputs starting where --inputs says (`activations`, the ids of the inputs that are not
    weights, start on the GPU for `weights`, the default), the --schedule choice, and for `--attention auto`
    the provider the sim ranks fastest (runtime.api, `plan_choosing_attention`); (memgraph, schedule,
    scores, attention choice)."""
    choice = {}
    inputs, on_gpu = start_options(INPUTS, activations)

    def compile_at(arena):  # the second plan (page tables for what the first pins) keeps the first's schedule
        memgraph, schedule, scores = compile_choosing_schedule(graph, arena, choice.get("schedule", SCHEDULE), inputs=inputs,
                                                               start_on_gpu=on_gpu)
        choice.setdefault("schedule", schedule)
        choice.setdefault("scores", scores)
        return memgraph

    attention = plan_choosing_attention(graph, budget, compile_at, "cuda", attention=ATTENTION)
    return attention.memgraph, choice["schedule"], choice["scores"], attention


def start_options(start: str, activations) -> tuple[str, frozenset]:
    """compile_taskgraph's `inputs` and `start_on_gpu` for an --inputs choice (INPUT_STARTS)."""
    return ("host", frozenset(activations)) if start == "weights" else (start, frozenset())


def turnip(work, budget_gib: float, repeats: int, results: dict) -> None:
    budget = int(budget_gib * GIB)
    try:
        began = time.perf_counter()
        memgraph, schedule, scores, attention = compile_turnip(work.graph, budget, work.activations)
        compile_s = time.perf_counter() - began
    except BudgetError as err:
        for order in ("nondet", "fixed"):
            results[f"turnip-{order}"] = {"error": f"does not fit: {err}"}
        return
    depth = {} if COPY_DEPTH is None else {"copy_queue_depth": COPY_DEPTH}  # None: the backend's default, not its lane depth
    depth |= {} if QUEUE_DEPTH is None else {"queue_depth": QUEUE_DEPTH}
    backend = CudaBackend(attention_provider=attention.provider, notifier=NOTIFIER, **depth)
    runs = loops(memgraph, backend, orders=ORDERS, repeats=repeats, inputs=work.inputs)
    if TRACES:
        Path(TRACES).mkdir(parents=True, exist_ok=True)
        for order in ORDERS:  # nondet's keeps the name it had before fixed's was written too
            suffix = "" if order == "nondet" else f"-{order}"
            name = f"trace-{type(work).__name__.lower()}-{work.tokens}-{budget_gib:g}gib-{work.graph.devices}gpu{suffix}.json"
            runs[order]["recorder"].write_trace(Path(TRACES) / name)
    output = work.output(runs["outputs"]).astype(np.float32)
    for order in ORDERS:
        run = runs[order]
        summary = run["summary"]
        predicted = sim_makespan(memgraph, order=order, cost=CostModel().for_attention(attention.provider))
        busy = engine_busy(run)
        results[f"turnip-{order}"] = {
            "seconds": run["makespan"], "makespans": run["makespans"], "wall": run["wall"], "sim": predicted, "compile_s": compile_s,
            "offloaded": summary.bytes_offloaded, "reloaded": summary.bytes_reloaded,
            "planned_reload": sum(n.nbytes for n in memgraph.nodes if n.op == "reload"),
            "h2d_rate": summary.h2d_bandwidth, "peak": runs["stats"].get("peak_drop", 0) or budget,
            "moved": summary.bytes_moved, "busy": summary.busy, "gpus": work.graph.devices,
            "bound": bound_by(run, busy), "engine_busy": busy, "lines": summary.lines() + runs["notes"], "output": output,
            "copy_depth": backend.copy_queue_depth, "queue_depth": backend.queue_depth, "rope": ROPE_BUILD, "attention": attention.provider, "attention_asked": ATTENTION,
            "attention_stream": "gpu" if shared_stream() else "lane",
            "attention_scores": attention.scores, "notifier": NOTIFIER,
            "schedule": schedule, "schedule_scores": scores, "inputs": INPUTS,
        }


def engine_busy(run) -> dict[str, float]:
    """The fraction of the GPU span in which some lane of each kind (compute, h2d, d2h) was busy."""
    completions = run["recorder"].completions
    graph = run["recorder"].graph
    span = run["makespan"] or 1e-9
    return {kind: union_length([(c.start, c.end) for c in completions if graph.lanes[c.lane].kind == kind]) / span for kind in ("compute", "h2d", "d2h")}


def bound_by(run, busy: dict[str, float] | None = None) -> str:
    """One line saying what limited a turnip run: compute, PCIe, dispatch, or dependency stalls. `busy`
    is `engine_busy(run)` where the caller has it already."""
    span = run["makespan"] or 1e-9
    busy = engine_busy(run) if busy is None else busy
    host = max(0.0, run["wall"] - span) / run["wall"]
    text = f"compute {busy['compute']:.0%}, H2D {busy['h2d']:.0%}, D2H {busy['d2h']:.0%} busy; loop wall {run['wall']:.3f} s vs GPU span {span:.3f} s"
    pcie = max(busy["h2d"], busy["d2h"])
    if busy["compute"] >= 0.85 and pcie >= 0.85:
        return f"compute- and PCIe-bound ({text})"
    if busy["compute"] >= 0.85:
        return f"compute-bound ({text})"
    if pcie >= 0.85:
        return f"PCIe-bound ({text})"
    if host > 0.15:
        return f"dispatch-bound ({text})"
    return f"dependency stalls ({text})"


# ----- torch baselines -----------------------------------------------------------------------------------
def llama_torch(work: Llama, mode: str, budget_gib: float | None, repeats: int) -> dict:
    """The 7B prefill by hand in torch, weights pinned on the host (prefetch) or all on the GPU (resident)."""
    import torch
    import torch.nn.functional as F

    c = work.config
    heads, width, layers = c.num_attention_heads, c.head_dim, c.num_hidden_layers
    names = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    if budget_gib is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_gib * GIB / torch.cuda.get_device_properties(0).total_memory))
    try:
        layer_host = work.host_layers(names, pin=mode == "prefetch")
        norm = torch.from_numpy(work.weights["model.norm.weight"]).to(device)
        x0 = torch.from_numpy(work.hidden).to(device)
        cos = torch.from_numpy(work.cos.astype(np.float16)).to(device)
        sin = torch.from_numpy(work.sin.astype(np.float16)).to(device)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if mode == "resident":
            weights = [[w.to(device) for w in ws] for ws in layer_host]
            before = torch.cuda.memory_allocated()
            forward = lambda: _llama_forward(x0, weights, norm, cos, sin, heads, width, c.rms_norm_eps, F)  # noqa: E731
        else:
            forward = _prefetcher(x0, layer_host, norm, cos, sin, heads, width, c.rms_norm_eps, F)
        seconds = cuda_time(forward, repeats=repeats)
        peak = torch.cuda.max_memory_allocated() - before
        out = forward().float().cpu().numpy()
        return {"seconds": seconds, "peak": peak, "output": out}
    except torch.OutOfMemoryError as err:
        return {"error": f"out of memory: {str(err).splitlines()[0][:120]}"}
    finally:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)


def _torch_weight(array, pin: bool):
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.pin_memory() if pin else tensor


def _rms(x, w, eps):
    h = x.float()
    return (h * (h * h).mean(-1, keepdim=True).add(eps).rsqrt()).half() * w


def _rope(x, cos, sin, heads, width):
    t = x.view(x.shape[0], heads, width)
    half = width // 2
    rotated = __import__("torch").cat([-t[..., half:], t[..., :half]], dim=-1)
    return (t * cos[:, None, :] + rotated * sin[:, None, :]).view(x.shape[0], heads * width)


def _layer(x, w, cos, sin, heads, width, eps, F):
    ln1, wq, wk, wv, wo, ln2, wg, wu, wd = w
    h = _rms(x, ln1, eps)
    q, k, v = _rope(h @ wq.T, cos, sin, heads, width), _rope(h @ wk.T, cos, sin, heads, width), h @ wv.T
    t = x.shape[0]
    view = lambda a: a.view(t, heads, width).transpose(0, 1).unsqueeze(0)  # noqa: E731
    attn = F.scaled_dot_product_attention(view(q), view(k), view(v), is_causal=True)
    x = x + attn[0].transpose(0, 1).reshape(t, heads * width) @ wo.T
    h = _rms(x, ln2, eps)
    return x + (F.silu(h @ wg.T) * (h @ wu.T)) @ wd.T


def _llama_forward(x, weights, norm, cos, sin, heads, width, eps, F):
    for w in weights:
        x = _layer(x, w, cos, sin, heads, width, eps, F)
    return _rms(x, norm, eps)


def _prefetcher(x0, host, norm, cos, sin, heads, width, eps, F):
    import torch

    buffers = [[torch.empty_like(w, device="cuda") for w in host[0]] for _ in range(2)]
    side = torch.cuda.Stream()
    ready = [torch.cuda.Event() for _ in range(2)]
    free = [torch.cuda.Event() for _ in range(2)]

    def forward():
        main = torch.cuda.current_stream()
        for event in free:
            event.record(main)

        def load(i):
            with torch.cuda.stream(side):
                side.wait_event(free[i % 2])
                for dst, src in zip(buffers[i % 2], host[i]):
                    dst.copy_(src, non_blocking=True)
                ready[i % 2].record(side)

        x = x0
        load(0)
        for i in range(len(host)):
            if i + 1 < len(host):
                load(i + 1)
            main.wait_event(ready[i % 2])
            x = _layer(x, buffers[i % 2], cos, sin, heads, width, eps, F)
            free[i % 2].record(main)
        return _rms(x, norm, eps)

    return forward


def hf_offload(work: Llama, budget_gib: float, repeats: int) -> dict:
    """transformers' LlamaModel with our weights, dispatched by accelerate under max_memory={0: budget}."""
    import torch
    from accelerate import dispatch_model, infer_auto_device_map
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaModel

    c = work.config
    cfg = HFConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                   num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, vocab_size=c.vocab_size,
                   rms_norm_eps=c.rms_norm_eps, max_position_embeddings=max(work.tokens, 4096),
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with torch.device("meta"):
        model = LlamaModel(cfg)
    state = {name.removeprefix("model."): torch.from_numpy(np.ascontiguousarray(w)) for name, w in work.weights.items()}
    model.load_state_dict(state, assign=True, strict=False)
    model.rotary_emb = type(model.rotary_emb)(config=cfg)
    model = model.half().eval()
    device_map = infer_auto_device_map(model, max_memory={0: int(budget_gib * GIB), "cpu": 200 * GIB}, no_split_module_classes=["LlamaDecoderLayer"])
    model = dispatch_model(model, device_map=device_map)
    ids = torch.from_numpy(work.ids)[None].cuda()
    torch.cuda.reset_peak_memory_stats()
    try:
        with torch.no_grad():
            seconds = cuda_time(lambda: model(input_ids=ids), repeats=repeats)
            out = model(input_ids=ids).last_hidden_state[0].float().cpu().numpy()
        on_cpu = sum(1 for where in device_map.values() if where == "cpu")
        return {"seconds": seconds, "peak": torch.cuda.max_memory_allocated(), "output": out, "layers_on_cpu": on_cpu}
    except torch.OutOfMemoryError as err:
        return {"error": f"out of memory: {str(err).splitlines()[0][:120]}"}
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()


def ffn_torch(work: Ffn, budget_gib: float, repeats: int) -> dict:
    """The synchronous layer-by-layer copy (what accelerate's hooks do) and the double-buffered prefetch."""
    from cuda_workloads import ffn_torch as run

    base = run(16, work.config.tokens, 8192, 32768, {"x": work.hidden, **work.weights})
    return {"hf-offload": {"seconds": base["sync"]}, "torch-prefetch": {"seconds": base["prefetch"], "peak": base["peak"], "output": base["output"]}}


# ----- the table -----------------------------------------------------------------------------------------
def agreement(a, b) -> float:
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-9))


def main(argv=None) -> int:
    global TRACES, ORDERS, COPY_DEPTH, QUEUE_DEPTH, ATTENTION, NOTIFIER, SCHEDULE, INPUTS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=("llama", "ffn"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192])
    parser.add_argument("--budgets", type=float, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--hf-points", type=float, nargs="*", default=[7, 2], help="GiB of weights on the GPU for hf-offload")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default="7b", help="llama preset (tiny: a smoke test of this script)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs for turnip's llama (torch baselines use one)")
    parser.add_argument("--placement", default="sequence", help="llama placement over --gpus: sequence, layers or heads")
    parser.add_argument("--prefetch-budgets", type=float, nargs="+", help="budgets for torch-prefetch (default: --budgets)")
    parser.add_argument("--queue-depth", type=int, help="queue depth of turnip's compute lanes (default: the backend's, 3 for plans that stream)")
    parser.add_argument("--copy-depth", type=int, help="queue depth of turnip's copy-engine lanes (default: the backend's)")
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help="turnip's attention provider")
    parser.add_argument("--notifier", default=DEFAULT_NOTIFIER, choices=NOTIFIERS, help="how turnip's loop learns a vertex finished")
    parser.add_argument("--schedule", default="given", choices=SCHEDULE_CHOICES, help="the compiler's simulated schedule for turnip")
    parser.add_argument("--block", type=int, help="llama's tokens per block (default: the frontend's, 4096 at 7B)")
    parser.add_argument("--layer-order", default=LAYER_ORDERS[0], choices=LAYER_ORDERS, help="llama's task order inside a layer")
    parser.add_argument("--query-group", type=int, default=1, help="llama's query group (token blocks run together)")
    parser.add_argument("--dtype", nargs="+", choices=("float16", "bfloat16"), help="llama's dtypes, each run in turn at "
                        "every length and budget (default: the preset's; several: rows are labelled llama-DTYPE); the "
                        "torch and hf baselines are float16 only, so with bfloat16 only turnip and the floor run")
    parser.add_argument("--inputs", default=INPUTS, choices=tuple(INPUT_STARTS), help="where turnip's plan starts its inputs: "
                        + "; ".join(f"{name}: {meaning}" for name, meaning in INPUT_STARTS.items()).replace("%", "%%"))
    parser.add_argument("--json")
    parser.add_argument("--traces", help="write each turnip order's last run's trace into this folder (fixed's named -fixed)")
    parser.add_argument("--save-outputs", metavar="DIR", help="write turnip-nondet's output of each length and budget into DIR (.npy)")
    parser.add_argument("--compare-outputs", metavar="DIR", help="compare each turnip output with the one --save-outputs wrote "
                        "into DIR for the same length and budget (another run's, e.g. one GPU's): 'agreement_saved'")
    args = parser.parse_args(argv)
    dtypes = args.dtype or [None]
    if "bfloat16" in dtypes:
        args.systems = [s for s in args.systems if s.startswith("turnip") or s == "floor"]
    TRACES = args.traces
    COPY_DEPTH = args.copy_depth
    QUEUE_DEPTH = args.queue_depth
    ATTENTION = args.attention
    NOTIFIER = args.notifier
    SCHEDULE = args.schedule
    INPUTS = args.inputs
    ORDERS = tuple(o for o in ("nondet", "fixed") if f"turnip-{o}" in args.systems) or ("nondet",)
    import torch

    if torch.cuda.is_available():
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        gemm = 2 * 8192**3 / cuda_time(lambda: a @ a, repeats=10)
        del a
        ceilings = {"gemm": gemm, "h2d": h2d_ceiling()}
        machine = torch.cuda.get_device_name(0)
    else:  # a smoke test of the script under the CUDA simulator: the H200's figures
        ceilings, machine = {"gemm": 750e12, "h2d": 55.3e9}, "numba CUDA simulator"
    report = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "ceilings": ceilings, "runs": []}
    print(f"ceilings: fp16 GEMM {ceilings['gemm'] / 1e12:.0f} TFLOP/s, H2D {ceilings['h2d'] / 1e9:.1f} GB/s", flush=True)
    for tokens, dtype in [(t, d) for t in args.tokens for d in dtypes]:
        workload = args.workload if len(dtypes) == 1 else f"{args.workload}-{dtype}"
        began = time.perf_counter()
        work = (Llama(tokens, preset=args.config, gpus=args.gpus, placement=args.placement, dtype=dtype, block=args.block,
                      layer_order=args.layer_order, query_group=args.query_group) if args.workload == "llama" else Ffn(tokens))
        report.setdefault("workloads", {})[str(tokens)] = {"flops": work.flops, "weight_bytes": work.weight_bytes, "tasks": len(work.graph)}
        if args.workload == "llama":
            report["workloads"][str(tokens)] |= {"block": work.built.block, "layer_order": work.built.layer_order,
                                                 "query_group": work.built.query_group}
        print(f"\n## {args.workload} {getattr(work.config, 'dtype', '')} T={tokens} on {args.gpus} GPU(s) ({args.placement}): {len(work.graph)} tasks, {work.flops / 1e12:.1f} TFLOP, weights {work.weight_bytes / GIB:.2f} GiB (set-up {time.perf_counter() - began:.0f} s)\n", flush=True)
        resident = None
        if "torch-resident" in args.systems and args.workload == "llama":
            resident = _guard(lambda: llama_torch(work, "resident", None, args.repeats))
            _record(report, workload, tokens, None, "torch-resident", resident, None)
        reference = (resident or {}).get("output")
        prefetch_budgets = args.budgets if args.prefetch_budgets is None else args.prefetch_budgets
        for gib in sorted(set(args.budgets) | set(prefetch_budgets)):
            results: dict = {}
            if any(s.startswith("turnip") for s in args.systems) and gib in args.budgets:
                _guard(lambda: turnip(work, gib, args.repeats, results))
            if "torch-prefetch" in args.systems and gib in prefetch_budgets:
                if args.workload == "llama":
                    results["torch-prefetch"] = _guard(lambda: llama_torch(work, "prefetch", gib, args.repeats))
                else:
                    results.update(_guard(lambda: ffn_torch(work, gib, args.repeats)))
            results["floor"] = {"seconds": floor_seconds(work.flops, work.weight_bytes, ceilings, args.gpus)}
            if reference is None:  # no torch-resident: the first turnip output of this length
                reference = (results.get("turnip-nondet") or {}).get("output")
            saved = _saved_output(args.compare_outputs, workload, tokens, gib)
            for system in [s for s in SYSTEMS if s in results]:
                _record(report, workload, tokens, gib, system, results[system], reference, saved)
            if args.save_outputs and (results.get("turnip-nondet") or {}).get("output") is not None:
                Path(args.save_outputs).mkdir(parents=True, exist_ok=True)
                output = results["turnip-nondet"]["output"].astype(np.float16)
                atomic_write(_output_path(args.save_outputs, workload, tokens, gib), lambda handle: np.save(handle, output))
        if "hf-offload" in args.systems and args.workload == "llama":
            for gib in args.hf_points:
                outcome = _guard(lambda: hf_offload(work, gib, args.repeats))
                _record(report, workload, tokens, gib, "hf-offload", outcome, (resident or {}).get("output"))
        if args.json:
            atomic_write(args.json, json.dumps(report, indent=1, default=str))
        del work
        gc.collect()
    _print(report)
    return 0


def _guard(fn):
    try:
        return fn() or {}
    except Exception as err:  # one system failing does not stop the others
        traceback.print_exc()
        return {"error": f"{type(err).__name__}: {str(err)[:200]}"}


def _output_path(folder: str, workload: str, tokens: int, gib: float) -> Path:
    return Path(folder) / f"{workload}-{tokens}-{gib:g}gib.npy"


def _saved_output(folder: str | None, workload: str, tokens: int, gib: float):
    """The output another run saved with --save-outputs for this length and budget (float32), or None."""
    if folder is None:
        return None
    path = _output_path(folder, workload, tokens, gib)
    if not path.exists():
        print(f"note: no saved output {path} to compare with", flush=True)
        return None
    return np.load(path).astype(np.float32)


def _record(report, workload, tokens, gib, system, outcome, reference, saved=None) -> None:
    entry = {"workload": workload, "tokens": tokens, "budget": gib, "system": system}
    entry.update({k: v for k, v in outcome.items() if k != "output"})
    if outcome.get("output") is not None and reference is not None:
        entry["agreement"] = agreement(outcome["output"], reference)
    if outcome.get("output") is not None and saved is not None:
        entry["agreement_saved"] = agreement(outcome["output"], saved)
    report["runs"].append(entry)
    seconds = entry.get("seconds")
    what = f"{seconds:.3f} s" if seconds is not None else entry.get("error", "")
    agrees = "".join(f" ({label} {entry[key]:.1e})" for key, label in (("agreement", "agrees to"), ("agreement_saved", "against the saved output")) if key in entry)
    print(f"{workload} T={tokens} budget={gib} {system}: {what}{agrees}", flush=True)


def _print(report) -> None:
    print("\n| workload | T | budget GiB | system | seconds | x floor | peak GiB | reloaded GiB | agreement | bound by |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    floors = {(r["workload"], r["tokens"], r["budget"]): r["seconds"] for r in report["runs"] if r["system"] == "floor"}
    for r in report["runs"]:
        if r["system"] == "floor":
            continue
        seconds = r.get("seconds")
        floor = floors.get((r["workload"], r["tokens"], r["budget"]))
        cells = [r["workload"], r["tokens"], r["budget"], r["system"], f"{seconds:.3f}" if seconds else r.get("error", "")[:60],
                 f"{seconds / floor:.2f}" if seconds and floor else "", f"{r['peak'] / GIB:.2f}" if r.get("peak") else "",
                 f"{r['reloaded'] / GIB:.2f}" if "reloaded" in r else "", f"{r['agreement']:.1e}" if "agreement" in r else "",
                 r.get("bound", "").split(" (")[0]]
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    sys.exit(main())

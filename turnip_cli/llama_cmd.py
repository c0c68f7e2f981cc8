"""`turnip llama`: from Hugging Face weights (or a config and a seed) to final hidden states under a budget.

Thin: it reads the config and weights (`CheckpointWeights`, mapped lazily) or draws random ones, with
--adapter's PEFT LoRA adapter merged in (turnip/lora.py `MergedWeights`, still lazy), embeds the token
ids on the host, plans the blocked prefill at `--memory` per GPU (`choose_llama`: the block, layer order,
query group and schedule each given or chosen by the sim, turnip/choose.py; with
`--plan-dir` the choice and the plan are kept for later runs), runs it, and writes `hidden_states` [T, hidden] (as `LlamaModel(...).last_hidden_state[0]`)
and the trace only after success. Every bad input is one line and a non-zero exit; a run whose weights
and prompt activations cannot fit in host memory is refused before any weight or token id is drawn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.api import plan_choosing_attention, refit_arena
from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, CPU_BFLOAT16, compute_dtype, make_backend, resolve_backend
from runtime.callbacks import ProgressBar
from runtime.host_memory import available_bytes
from runtime.array_files import read_arrays
from runtime.policies import ORDERS
from turnip_cli.interrupt import check as check_interrupt, stop_on_interrupt
from turnip_cli.planning import (
    ATTENTION_HELP,
    add_layer_order_arguments,
    add_remat_argument,
    add_schedule_argument,
    block_argument,
    check_positive_options,
    check_seed,
    choose_llama,
    parse_size,
    print_attention_choice,
    warn_ignored_attention,
)
from turnip_cli.progress import Progress, add_progress_argument
from turnip_cli.run_cmd import run_files
from turnip.budget import naming_the_budget
from turnip.choice_cache import kept_plan, plan_folder
from turnip.choose import LlamaPrefill, PlanTarget
from turnip.lora import Adapter, MergedWeights, adapter_of
from turnip_ir.errors import InputError
from turnip_ir.explain import explain_offloads
from turnip_ir.files import check_outputs, is_file, is_folder, write_all
from turnip_ir.limits import PATH_CHARS, quoted
from turnip_ir.units import format_size
from frontend.workloads import llama

HALF_ON_CPU = "; float16 matmuls computed in float32 on the cpu backend, rounded to float16"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", metavar="DIR", help="Hugging Face model folder: config.json and model.safetensors "
                        "or model.safetensors.index.json")
    source.add_argument("--config", metavar="NAME_OR_JSON", help=f"preset ({', '.join(llama.PRESETS)}) or config.json; "
                        "weights are random from --seed")
    tokens = parser.add_mutually_exclusive_group(required=True)
    tokens.add_argument("--input-ids", metavar="IDS.npy", help="token ids, shape [T] or [1, T]")
    tokens.add_argument("--tokens", type=int, metavar="T", help="draw T token ids from --seed")
    add_adapter_argument(parser)
    parser.add_argument("--memory", required=True, metavar="SIZE", help="per-GPU budget, e.g. 4GiB")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu")
    parser.add_argument("--order", default="nondet", choices=ORDERS)
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help=ATTENTION_HELP)
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seeds random weights, --tokens and --order random")
    parser.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs to spread the blocks over (default 1)")
    parser.add_argument("--block", type=block_argument, metavar="N|auto", help="tokens per block, a positive integer; a block "
                        "larger than T is clamped to T, and the summary says so; auto: each of 1024 to 8192 (and T/4, T/2 "
                        "below 4096 tokens), keeping the plan the sim predicts fastest (default: chosen with the plan where "
                        "the backend is the sim's or cuda's, where the budget binds; else 4096 at 7B scale, T/4 for small models)")
    parser.add_argument("--placement", default="sequence", choices=llama.PLACEMENTS, help="how blocks spread over GPUs")
    add_layer_order_arguments(parser, llama.LAYER_ORDERS, chosen=True)
    add_schedule_argument(parser, chosen=True)
    add_remat_argument(parser)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="compute dtype (default: the "
                        "config's); bfloat16 is computed in float32 on the cpu backend, and the cpu backend computes "
                        "float16 matmuls in float32 and rounds them to float16 (numpy has no half-precision BLAS); "
                        "bfloat16 --outputs are written as float32 (exact)")
    parser.add_argument("--outputs", metavar="OUT.npz", help="write hidden_states [T, hidden] to this .npz")
    parser.add_argument("--trace", metavar="TRACE.json", help="write a Chrome/Perfetto trace")
    parser.add_argument("--repeats", type=int, default=1, metavar="N", help="run the plan N times on one prepared backend and "
                        "print every run's makespan and their median (the plan is loaded and the weights pinned once); "
                        "the summary is the last run's (default 1)")
    parser.add_argument("--plan-dir", metavar="DIR", help="keep the chosen plan, and the choice, in DIR and read them from "
                        "there in later runs (each plan verified when read)")
    parser.add_argument("--explain", action="store_true", help="print what the plan offloads and reloads, and why, per GPU (as turnip explain)")
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    check_positive_options(args, "tokens", "block", "gpus", "query_group", "repeats")
    check_seed(args.seed)
    backend = resolve_backend(args.backend)
    warn_ignored_attention(args.attention, backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs a backend that computes")
    check_outputs({"--outputs": args.outputs, "--trace": args.trace}, model_input_files(args))  # before a long run
    budget = parse_size(args.memory)
    plan_dir = plan_folder(args.plan_dir)
    machine = make_backend(backend, 0.0, args.seed, attention_provider=args.attention)  # before anything is read: a missing GPU fails fast
    progress = Progress.for_args(args)
    began = time.perf_counter()
    with progress.phase("reading the model"):
        stored_dtype, config, weights = _model(args, backend)
        adapter = adapter_of(args.adapter, config)
        weights = weights if adapter is None else MergedWeights(weights, adapter)
        ids = _read_ids(args.input_ids, config) if args.input_ids is not None else None
        tokens = len(ids) if ids is not None else args.tokens
        check_host_memory_for(config, tokens, backend, budget * args.gpus if backend == "cpu" else 0)  # before T ids are drawn
        if ids is None:
            ids = llama.random_ids(config, tokens, args.seed)
    read = time.perf_counter() - began

    prefill = LlamaPrefill(config, len(ids), args.gpus, args.placement)

    def graphs():  # what a budget error names the budget for: the frontend's default build
        return [llama.build_llama(config, len(ids), gpus=args.gpus, placement=args.placement).graph]

    with naming_the_budget(budget, graphs, backend, "this prefill", args.attention), progress.phase("planning"):
        planned = choose_llama(prefill, PlanTarget(budget, backend, args.attention), _given(args, backend), args.remat, plan_dir)
    built, memgraph, schedule = planned.built, planned.memgraph, planned.candidate.schedule
    _print_summary(args, config, built, backend, stored_dtype, adapter)

    def compile_at(arena: int):
        return kept_plan(plan_dir, built.graph, arena, schedule, args.remat,
                         lambda: compile_taskgraph(built.graph, arena, schedule, remat=args.remat))[0]

    smaller = refit_arena(memgraph, built.graph, budget, backend, attention=args.attention)
    if smaller is not None:  # the plan pins more host memory than the arena left GPU page tables for
        print(f"planning again at an arena of {format_size(smaller)}: the GPU's page tables for the"
              f" {format_size(memgraph.storage_bytes)} of host memory the plan pins need more room")
        memgraph = compile_at(smaller)
    with progress.phase("choosing the attention provider"):  # auto's others, each at its own arena (the choice above used the first's)
        choice = plan_choosing_attention(built.graph, budget, compile_at, backend, attention=args.attention,
                                         planned=(memgraph, smaller is not None))
    print_attention_choice(choice)
    memgraph = choice.memgraph
    if choice.provider and backend == "cuda":
        machine.choose_attention(choice.provider)
    compiled = time.perf_counter()
    if args.explain:
        print("\n".join(explain_offloads(memgraph).summary_lines()))
    with progress.phase("reading the weights"):
        inputs = built.feed(weights, ids) if backend != "sim" else None  # lazy: read in `prepare`, into host storage
    fed = time.perf_counter()
    every_run = [ProgressBar(progress.delay, progress.enabled), stop_on_interrupt()]
    first_run = [progress.until_run_starts(), *every_run]  # the "preparing" phase ends when the first run starts
    results = []
    with progress.phase("preparing"):  # ends when the run starts
        for k in range(args.repeats):  # the backend stays prepared between runs (the plan is loaded once)
            results.append(execute(memgraph, backend=machine, order=args.order, seed=args.seed, inputs=inputs,
                                   callbacks=every_run if k else first_run, verify=False,  # the compiler verified its own plan
                                   close=k == args.repeats - 1))
    executed = time.perf_counter()
    result = results[-1]
    check_interrupt()  # a Ctrl-C that landed where it was swallowed still writes nothing
    hidden_states = {"hidden_states": _savable(built.gather(result.outputs))} if args.outputs else {}
    written = write_all(run_files(args.outputs, lambda: hidden_states, args.trace, result.recorder))
    print(f"{memgraph.count('offload')} offloads, {memgraph.count('reload')} reloads planned")
    print("\n".join(result.summary.lines()))
    if args.repeats > 1:
        spans = [r.summary.makespan * 1e3 for r in results]
        print(f"repeats: {args.repeats} runs, makespans {', '.join(f'{s:.3f}' for s in spans)} ms "
              f"(median {statistics.median(spans):.3f} ms)")
    print(_phases_line(results[0].summary, read + fed - compiled, compiled - began - read, executed - fed, args.repeats))
    for path in written:
        print(f"wrote {path}")
    return 0


def _given(args: argparse.Namespace, backend: str) -> dict:
    """The plan's dimensions as given (a value, or auto). One left out is chosen with the plan where the
    sim predicts the backend (sim, cuda); the cpu backend keeps the frontend's default for it."""
    given = {"block": args.block, "layer_order": args.layer_order, "query_group": args.query_group, "schedule": args.schedule}
    return given if backend == "cpu" else {name: value for name, value in given.items() if value is not None}


def _phases_line(summary, read: float, compile_time: float, execute_time: float, runs: int = 1) -> str:
    """The set-up phases in seconds: load (the model read, then the weights put into host memory, which
    the backend does in its `prepare`), compile (taskgraph and memgraph), prepare (the rest of the
    backend's `prepare`), run (the event loop, outputs read back; every run of --repeats, the plan's
    prepare counted once from the first run's `summary`); and the whole process's wall time."""
    weights = summary.inputs_time
    prepare = summary.prepare_time - weights
    run = execute_time - summary.prepare_time
    wall = process_seconds()
    total = f"{wall:.2f} s end to end" if wall is not None else "end to end not known on this system"
    runs_note = f" ({runs} runs)" if runs > 1 else ""
    return (f"phases: load {read + weights:.2f} s (model {read:.2f} s, weights into host memory {weights:.2f} s), "
            f"compile {compile_time:.2f} s, prepare {prepare:.2f} s, run {run:.2f} s{runs_note}; {total}")


def process_seconds() -> float | None:
    """Seconds since this process started, its imports included (Linux's /proc), or None elsewhere."""
    try:
        with open("/proc/self/stat") as stat:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as uptime:
            return float(uptime.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def _print_summary(args: argparse.Namespace, config: llama.LlamaConfig, built: llama.LlamaGraph, backend: str,
                   stored_dtype: str, adapter: Adapter | None) -> None:
    clamped = f" (--block {args.block} clamped to the token count)" if isinstance(args.block, int) and args.block > built.block else ""
    order = "" if built.layer_order == "blocks" else f", layers in {built.layer_order}"
    order += f", query groups of {built.query_group}" if built.query_group > 1 else ""
    print(f"llama {config.name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.dtype}; "
          f"{built.tokens} tokens in blocks of {built.block}{clamped}{order}; {len(built.graph)} tasks on {args.gpus} GPU(s); "
          f"budget {args.memory} per GPU{_dtype_note(backend, stored_dtype, args.dtype, config.dtype)}{adapter_note(args.adapter, adapter)}")


def add_adapter_argument(parser: argparse.ArgumentParser) -> None:
    """--adapter of the model commands (llama, generate)."""
    parser.add_argument("--adapter", metavar="DIR", help="run the model with this PEFT LoRA adapter folder "
                        "(adapter_config.json and adapter_model.safetensors: peft's save_pretrained or turnip finetune "
                        "--adapter-out), merged into the weights as peft's merge_and_unload merges it")


def adapter_note(folder: str | None, adapter: Adapter | None) -> str:
    """What a model command's summary line says of the adapter it runs with (nothing without one)."""
    return "" if adapter is None else f"; adapter {quoted(folder, PATH_CHARS)} ({adapter.settings.summary})"


def model_input_files(args: argparse.Namespace) -> dict[str, str | None]:
    """The files and folders a model command (llama, generate) reads, which no output may overwrite; a
    folder (--weights, --config FOLDER, --plan-dir, --adapter) stands for every file in it (`check_outputs`)."""
    config = args.config if args.config not in llama.PRESETS else None
    return {"--weights": args.weights, "--config": config, "--input-ids": args.input_ids,
            "--plan-dir": getattr(args, "plan_dir", None), "--adapter": getattr(args, "adapter", None)}


def check_host_memory_for(config: llama.LlamaConfig, tokens: int, backend: str, arenas: int,
                          held: dict[str, int] | None = None) -> None:
    """Refuse, before any weight or token id is drawn or read, a run whose weights, activations of a
    prompt of `tokens`, cpu arenas and `held` arrays (what -> bytes: a session's KV cache, the ids it
    draws) cannot fit in host memory; the sim backend holds no values, only `held`. On the cpu backend the
    GPU arenas are host memory too: they are sized by the plan's peak (runtime/host_memory.py checks them
    exactly before allocating), which is at most `arenas` (the budget over all GPUs) and at most what the
    weights and activations take."""
    parts: dict[str, int] = {}
    if backend != "sim":
        footprint = llama.host_footprint(config, tokens)
        parts = {"weights": footprint.weights, f"activations of {tokens} tokens": footprint.activations}
        if min(arenas, footprint.total):
            parts["cpu arenas"] = min(arenas, footprint.total)
    parts |= held or {}
    need, available = sum(parts.values()), available_bytes()
    if available is not None and need > available:
        listed = ", ".join(f"{what} {format_size(size)}" for what, size in parts.items())
        raise InputError(f"host memory: the run needs {need} bytes ({listed}) but {available} bytes "
                          f"({format_size(available)}) are available")


def _dtype_note(backend: str, stored: str, wanted: str | None, computed: str) -> str:
    """What the summary line adds about precision on the cpu backend."""
    if backend == "cpu" and computed == "float32" and "bfloat16" in (wanted or stored):
        return f"; {CPU_BFLOAT16}"
    return HALF_ON_CPU if backend == "cpu" and computed == "float16" else ""


def _savable(hidden: np.ndarray) -> np.ndarray:
    """bfloat16 outputs as float32 (exact): an .npz of ml_dtypes' type needs ml_dtypes to read back."""
    return hidden.astype(np.float32) if hidden.dtype.name == "bfloat16" else hidden


def _model(args: argparse.Namespace, backend: str):
    """The config's own dtype, the config (with the compute dtype) and its weights: a checkpoint, or random."""
    if args.weights is not None:
        folder = Path(args.weights)
        if not is_folder(folder):
            raise InputError(f"weights folder {quoted(str(folder), PATH_CHARS)} does not exist")
        if not is_file(folder / "config.json"):
            raise InputError(f"weights folder {quoted(str(folder), PATH_CHARS)} has no config.json")
        stored = llama.load_config(str(folder))
        config = replace(stored, dtype=compute_dtype(stored.dtype, args.dtype, backend))
        return stored.dtype, config, llama.CheckpointWeights(folder, config)
    stored = llama.load_config(args.config)
    config = replace(stored, dtype=compute_dtype(stored.dtype, args.dtype, backend))
    return stored.dtype, config, llama.RandomWeights(config, args.seed)


def _read_ids(path: str, config: llama.LlamaConfig) -> np.ndarray:
    ids = read_arrays(path, "token ids file", IDS_EXPECTED)
    if isinstance(ids, dict):
        raise InputError(f"token ids file '{path}' is an .npz: turnip llama takes one prompt, {IDS_EXPECTED} "
                         "(turnip generate takes an .npz of several)")
    if ids.ndim == 2 and ids.shape[0] == 1:  # [1, T], as tokenizers return them
        ids = ids[0]
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"token ids in '{path}' must be a non-empty 1-D integer array, got {ids.dtype} {list(ids.shape)}")
    bad = ids[(ids < 0) | (ids >= config.vocab_size)]
    if bad.size:
        raise InputError(f"token id {int(bad[0])} in '{path}' is out of the vocabulary range [0, {config.vocab_size})")
    return ids.astype(np.int64)


IDS_EXPECTED = "a .npy of integer token ids, shape [T] or [1, T]"

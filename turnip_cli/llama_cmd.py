"""`turnip llama`: from Hugging Face weights (or a config and a seed) to final hidden states under a budget.

Thin: it reads the config and weights (`CheckpointWeights`, mapped lazily) or draws random ones,
embeds the token ids on the host, builds the blocked prefill (`build_llama`), compiles it at `--memory`
per GPU, runs it, and writes `hidden_states` [T, hidden] (as `LlamaModel(...).last_hidden_state[0]`)
and the trace only after success. Every bad input is one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import io
from dataclasses import replace
from pathlib import Path

import numpy as np

from runtime import arena_budget, execute
from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, make_backend, resolve_backend
from runtime.callbacks import ProgressBar
from runtime.policies import ORDERS
from turnip_cli.interrupt import check as check_interrupt, stop_on_interrupt
from turnip_cli.planning import add_schedule_argument, compile_printing_choice, parse_size
from turnip_ir.errors import InputError
from turnip_ir.explain import explain_offloads
from turnip_ir.io import write_atomic
from frontend.workloads import llama

def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", metavar="DIR", help="Hugging Face model folder: config.json and model.safetensors "
                        "or model.safetensors.index.json")
    source.add_argument("--config", metavar="NAME_OR_JSON", help=f"preset ({', '.join(llama.PRESETS)}) or config.json; "
                        "weights are random from --seed")
    tokens = parser.add_mutually_exclusive_group(required=True)
    tokens.add_argument("--input-ids", metavar="IDS.npy", help="token ids, shape [T] or [1, T]")
    tokens.add_argument("--tokens", type=int, metavar="T", help="draw T token ids from --seed")
    parser.add_argument("--memory", required=True, metavar="SIZE", help="per-GPU budget, e.g. 4GiB")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu")
    parser.add_argument("--order", default="nondet", choices=ORDERS)
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help="the cuda backend's attention provider")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seeds random weights, --tokens and --order random")
    parser.add_argument("--gpus", type=int, default=1, metavar="N")
    parser.add_argument("--block", type=int, metavar="N", help="tokens per block (default: 4096 at 7B scale, T/4 for small models)")
    parser.add_argument("--placement", default="sequence", choices=llama.PLACEMENTS, help="how blocks spread over GPUs")
    add_schedule_argument(parser)
    parser.add_argument("--dtype", choices=("float16", "float32"), help="compute dtype (default: the config's; "
                        "bfloat16 models run in float32)")
    parser.add_argument("--outputs", metavar="OUT.npz", help="write hidden_states [T, hidden] to this .npz")
    parser.add_argument("--trace", metavar="TRACE.json", help="write a Chrome/Perfetto trace")
    parser.add_argument("--explain", action="store_true", help="print what the plan offloads and reloads, and why, per GPU (as turnip explain)")


def run(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs a backend that computes")
    for path in (args.outputs, args.trace):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise InputError(f"cannot write {path}: its folder does not exist")
    budget = parse_size(args.memory)
    machine = make_backend(backend, 0.0, args.seed, attention_provider=args.attention)  # before anything is read: a missing GPU fails fast
    config, weights = _model(args)
    ids = _ids(args, config)
    built = llama.build_llama(config, len(ids), args.block, args.gpus, args.placement)
    print(f"llama {config.name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.dtype}; "
          f"{len(ids)} tokens in blocks of {built.block}; {len(built.graph)} tasks on {args.gpus} GPU(s); "
          f"budget {args.memory} per GPU")
    arena = arena_budget(built.graph, budget, backend, attention=args.attention)  # less the cuda workspace
    memgraph = compile_printing_choice(built.graph, arena, args.schedule)
    if args.explain:
        print("\n".join(explain_offloads(memgraph).summary_lines()))
    inputs = built.feed(weights, ids) if backend != "sim" else None
    result = execute(memgraph, backend=machine, order=args.order, seed=args.seed, inputs=inputs, callbacks=[ProgressBar(), stop_on_interrupt()])
    check_interrupt()  # a Ctrl-C that landed where it was swallowed still writes nothing
    if args.outputs:
        data = io.BytesIO()
        np.savez(data, hidden_states=built.gather(result.outputs))
        write_atomic(args.outputs, data.getvalue())
    if args.trace:
        result.recorder.write_trace(args.trace)
    print(f"{memgraph.count('offload')} offloads, {memgraph.count('reload')} reloads planned")
    print("\n".join(result.summary.lines()))
    return 0


def _model(args: argparse.Namespace):
    """The config (with --dtype applied) and its weights: a checkpoint, or random from --seed."""
    if args.weights is not None:
        folder = Path(args.weights)
        if not folder.is_dir():
            raise InputError(f"weights folder '{folder}' does not exist")
        if not (folder / "config.json").is_file():
            raise InputError(f"weights folder '{folder}' has no config.json")
        config = _dtype(llama.load_config(str(folder)), args.dtype)
        return config, llama.CheckpointWeights(folder, config)
    config = _dtype(llama.load_config(args.config), args.dtype)
    return config, llama.RandomWeights(config, args.seed)


def _dtype(config: llama.LlamaConfig, wanted: str | None) -> llama.LlamaConfig:
    dtype = wanted or ("float32" if config.dtype == "bfloat16" else config.dtype)
    return replace(config, dtype=dtype)


def _ids(args: argparse.Namespace, config: llama.LlamaConfig) -> np.ndarray:
    if args.tokens is not None:
        if args.tokens < 1:
            raise InputError(f"--tokens must be positive, got {args.tokens}")
        return llama.random_ids(config, args.tokens, args.seed)
    try:
        ids = np.load(args.input_ids, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"token ids file '{args.input_ids}' does not exist") from None
    except (OSError, ValueError) as err:
        raise InputError(f"token ids file '{args.input_ids}' is not a readable .npy: {err}") from None
    if ids.ndim == 2 and ids.shape[0] == 1:  # [1, T], as tokenizers return them
        ids = ids[0]
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"token ids in '{args.input_ids}' must be a non-empty 1-D integer array, got {ids.dtype} {list(ids.shape)}")
    bad = ids[(ids < 0) | (ids >= config.vocab_size)]
    if bad.size:
        raise InputError(f"token id {int(bad[0])} in '{args.input_ids}' is out of the vocabulary range [0, {config.vocab_size})")
    return ids.astype(np.int64)

"""`turnip generate`: new tokens for a batch of prompts from a LLaMA model under a per-GPU budget.

Thin: it reads the prompts (an .npy [P] or [B, P], an .npz of ragged 1-D prompts in the order the file
lists them, or B random prompts of P ids), opens a `turnip.Session` and calls `generate`, then prints a
summary and writes `generated` int64 [B, N] and the trace only after success. The sim backend computes
no values: it runs for timing only, feeding back token 0, says so, and refuses --outputs. --trace writes
the last decode step's trace. Every bad input is one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from frontend.workloads import llama
from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, resolve_backend
from runtime.array_files import read_arrays
from runtime.policies import ORDERS
from turnip import Session
from turnip_cli.llama_cmd import check_host_memory_for, model_input_files
from turnip_cli.planning import check_positive_options, check_seed, parse_size, warn_ignored_attention
from turnip_cli.run_cmd import run_files
from turnip_ir.errors import InputError
from turnip_ir.files import check_outputs, is_file, write_all
from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.limits import quoted
from turnip_ir.units import format_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", metavar="DIR", help="Hugging Face model folder (config.json and safetensors)")
    source.add_argument("--config", metavar="NAME_OR_JSON", help=f"preset ({', '.join(llama.PRESETS)}) or config.json; "
                        "weights are random from --seed")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--input-ids", metavar="FILE", help=".npy of token ids [P] or [B, P], or .npz of 1-D prompts of any lengths")
    prompts.add_argument("--prompt-tokens", type=int, metavar="P", help="draw --batch prompts of P ids from --seed")
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="prompts drawn with --prompt-tokens (default 1)")
    parser.add_argument("--max-new-tokens", type=int, required=True, metavar="N", help="new tokens per prompt, exactly")
    parser.add_argument("--memory", required=True, metavar="SIZE", help="per-GPU budget, e.g. 4GiB")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu; "
                        "sim: timing only")
    parser.add_argument("--gpus", type=int, default=1, metavar="N")
    parser.add_argument("--order", default="nondet", choices=ORDERS)
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seeds random weights, prompts, sampling and --order random")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="X", help="0: greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="X", help="nucleus sampling mass in (0, 1]")
    parser.add_argument("--outputs", metavar="OUT.npz", help="write generated int64 [B, N] to this .npz")
    parser.add_argument("--trace", metavar="TRACE.json", help="write the last decode step's Chrome/Perfetto trace")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="compute dtype (default: the "
                        "config's); bfloat16 is computed in float32 on the cpu backend")
    parser.add_argument("--stop-at-eos", action="store_true", help="after an end-of-sequence id, a prompt emits that id to the end")
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help="the cuda backend's attention provider "
                        "for the prefills; auto: torch-cudnn where torch with CUDA runs (a session does not rank the "
                        "providers: triton's first use in a process costs seconds)")
    parser.add_argument("--plan-dir", metavar="DIR", help="keep compiled plans in DIR and read them from there in later runs "
                        "(each verified when read)")


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    check_positive_options(args, "gpus", "batch", "prompt_tokens", "max_new_tokens")
    check_seed(args.seed)
    backend = resolve_backend(args.backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs a backend that computes")
    check_outputs({"--outputs": args.outputs, "--trace": args.trace}, model_input_files(args))  # before a long run
    if args.weights is not None and not is_file(Path(args.weights) / "config.json"):
        raise InputError(f"weights folder {quoted(args.weights)} does not exist or has no config.json")
    warn_ignored_attention(args.attention, backend)
    named = {"attention_provider": args.attention} if args.attention != "auto" and backend == "cuda" else None
    session = Session(config=args.config, weights=args.weights, memory=parse_size(args.memory), backend=backend,
                      gpus=args.gpus, order=args.order, seed=args.seed, dtype=args.dtype, plan_dir=args.plan_dir,
                      backend_options=named)
    with session:
        prompts = _prompts(args, session)
        print(f"generate {session.config.name}: {len(prompts)} prompt(s) of {', '.join(str(len(p)) for p in prompts)} tokens, "
              f"{args.max_new_tokens} new tokens each; budget {args.memory} per GPU on {backend}")
        result = session.generate(prompts, args.max_new_tokens, args.temperature, args.top_p, args.seed, args.stop_at_eos)
    written = write_all(run_files(args.outputs, lambda: {"generated": result.tokens}, args.trace, result.recorder))
    print("\n".join(summary_lines(result)))
    for path in written:
        print(f"wrote {path}")
    return 0


def summary_lines(result) -> list[str]:
    steps = result.step_seconds
    lines = [] if result.computed else ["sim backend: timing only, no tokens computed (token 0 fed back each step)"]
    lines += [
        f"prefill {result.prefill_seconds:.4f} s; decode {len(steps)} steps in {result.decode_seconds:.4f} s "
        f"({result.decode_seconds / len(steps) * 1e3:.3f} ms per step), {result.tokens_per_second:.1f} tokens/s",
        f"compiled {result.compiles} graph(s) in {result.compile_seconds:.3f} s, {result.cache_hits} cache hit(s)"
        + (f" ({result.plans_read} plan(s) read from --plan-dir)" if result.plans_read else ""),
        f"offloaded {format_size(result.bytes_offloaded)}, reloaded {format_size(result.bytes_reloaded)}; "
        f"peak arena use {format_size(result.peak_arena)}",
    ]
    if len(steps) > 1:  # what stayed on the GPU between steps shows in what later steps copy before they run
        later = sorted(result.step_bytes_placed[1:])
        spread = format_size(later[0]) if later[0] == later[-1] else f"{format_size(later[0])} to {format_size(later[-1])}"
        lines.append(f"inputs copied onto the GPU before a step: {format_size(result.step_bytes_placed[0])} at the first, "
                     f"then {spread} (what a step kept from the one before is not copied again)")
    return lines


def _prompts(args: argparse.Namespace, session: Session) -> list[np.ndarray]:
    """The prompts as given (checked by the session), or --batch random ones of --prompt-tokens ids; either
    way the run is held against host memory first (`_check_memory`), before random ids are drawn."""
    if args.prompt_tokens is not None:
        _check_memory(args, session, [args.prompt_tokens] * args.batch)
        ids = llama.random_ids(session.config, args.prompt_tokens * args.batch, args.seed)
        return list(ids.reshape(args.batch, args.prompt_tokens))
    path = Path(args.input_ids)
    loaded = read_arrays(path, "token ids file", "a .npy of integer token ids [P] or [B, P], or an .npz of 1-D prompts")
    if isinstance(loaded, dict):
        prompts = [_one_dimensional(array, f"array {quoted(name)} in '{path}'") for name, array in loaded.items()]
    elif loaded.ndim not in (1, 2):
        raise InputError(f"token ids in '{path}' must have shape [P] or [B, P], got {list(loaded.shape)}")
    else:
        prompts = [loaded] if loaded.ndim == 1 else list(loaded)
    _check_memory(args, session, [len(p) for p in prompts])
    return prompts


def _check_memory(args: argparse.Namespace, session: Session, lengths: list[int]) -> None:
    """The host memory a generation holds (llama_cmd.check_host_memory_for): the weights and the longest
    prefill's activations, the KV cache of every prompt with room for the new tokens (kv_block rows a
    column), the new ids and the prompts' ids; on the sim, only the ids."""
    config, new = session.config, args.max_new_tokens
    rows = -(-(max(lengths, default=1) + new) // session.kv_block) * session.kv_block
    row_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * DTYPE_BYTES[config.dtype]
    held = {} if session.backend == "sim" else {"KV cache": len(lengths) * rows * row_bytes}
    held |= {"token ids": 8 * (len(lengths) * new + sum(lengths))}
    arenas = session.memory * session.gpus if session.backend == "cpu" else 0
    check_host_memory_for(config, max(lengths, default=1), session.backend, arenas, held)


def _one_dimensional(array: np.ndarray, what: str) -> np.ndarray:
    if array.ndim != 1:
        raise InputError(f"{what} must be a 1-D prompt of token ids, got shape {list(array.shape)}")
    return array

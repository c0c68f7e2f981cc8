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
from runtime.inputs import NUMPY_READ_ERRORS
from runtime.policies import ORDERS
from turnip import Session
from turnip_cli.llama_cmd import model_input_files
from turnip_cli.planning import check_positive_options, parse_size, warn_ignored_attention
from turnip_cli.run_cmd import run_files
from turnip_ir.errors import InputError
from turnip_ir.files import check_outputs, write_all
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
    parser.add_argument("--memory", required=True, metavar="SIZE", help="per-GPU budget, the cuda backend's workspace included: "
                        "bytes, or a number (1.5, 1e9) with KiB, MiB or GiB (powers of 1024) or KB, MB or GB (powers of "
                        "1000), e.g. 4GiB; too small a one is refused with the budget the whole command needs")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu; "
                        "sim: timing only")
    parser.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs to split the layers over, a pipeline: layer l "
                        "on GPU l * N // L (default 1; at most the model's L layers)")
    parser.add_argument("--order", default="nondet", choices=ORDERS, help="which ready kernel or copy the runtime starts "
                        "next: nondet (the default) whatever is ready, the longest path first; fixed the plan's order; "
                        "random a seeded random ready one (--seed)")
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
                        "(each proven a plan of the run's graph and budget when read, else compiled again)")


def run(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs a backend that computes")
    check_outputs({"--outputs": args.outputs, "--trace": args.trace}, model_input_files(args))  # before a long run
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    check_positive_options(args, "gpus")
    if args.weights is not None and not (Path(args.weights) / "config.json").is_file():
        raise InputError(f"weights folder '{args.weights}' does not exist or has no config.json")
    warn_ignored_attention(args.attention, backend)
    named = {"attention_provider": args.attention} if args.attention != "auto" and backend == "cuda" else None
    session = Session(config=args.config, weights=args.weights, memory=parse_size(args.memory), backend=backend,
                      gpus=args.gpus, order=args.order, seed=args.seed, dtype=args.dtype, plan_dir=args.plan_dir,
                      backend_options=named)
    with session:
        prompts = _prompts(args, session.config)
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


def _prompts(args: argparse.Namespace, config: llama.LlamaConfig) -> list[np.ndarray]:
    """The prompts as given (checked by the session), or --batch random ones of --prompt-tokens ids."""
    if args.prompt_tokens is not None:
        if args.prompt_tokens < 1 or args.batch < 1:
            raise InputError(f"--prompt-tokens and --batch must be positive, got {args.prompt_tokens} and {args.batch}")
        ids = llama.random_ids(config, args.prompt_tokens * args.batch, args.seed)
        return list(ids.reshape(args.batch, args.prompt_tokens))
    path = Path(args.input_ids)
    if not path.is_file():
        raise InputError(f"token ids file '{path}' does not exist")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return [_one_dimensional(loaded[name], f"array '{name}' in '{path}'") for name in loaded.files]
    except NUMPY_READ_ERRORS as err:  # a damaged header makes numpy raise SyntaxError or TokenError too
        raise InputError(f"token ids file '{path}' is not a readable .npy or .npz: {' '.join(str(err).split())[:120]}") from None
    if loaded.ndim not in (1, 2):
        raise InputError(f"token ids in '{path}' must have shape [P] or [B, P], got {list(loaded.shape)}")
    return [loaded] if loaded.ndim == 1 else list(loaded)


def _one_dimensional(array: np.ndarray, what: str) -> np.ndarray:
    if array.ndim != 1:
        raise InputError(f"{what} must be a 1-D prompt of token ids, got shape {list(array.shape)}")
    return array

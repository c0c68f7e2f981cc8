"""`turnip generate`: new tokens for a batch of prompts from a LLaMA model under a per-GPU budget.

Thin: it reads the prompts (an .npy [P] or [B, P], an .npz of ragged 1-D prompts in the order the file
lists them, B random prompts of P ids, or text: --prompt, --prompt-file's JSON Lines, each tokenized by
the weights folder's tokenizer, with --chat through its chat template), opens a `turnip.Session` (with
--adapter's PEFT LoRA adapter merged into the weights) and calls `generate`, then prints a summary and
writes `generated` int64 [B, N] (and `text` [B], where the folder has a tokenizer) and the trace only
after success; without --outputs the text is printed, with --stream as the tokens arrive. The sim
backend computes no values: it runs for timing only, feeding back token 0, says so, and refuses --outputs
and --stream. --trace writes the last decode step's trace. Every bad input is one line and a non-zero
exit, before anything runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from frontend.text import TextStream, Tokenizer, jsonl_texts
from frontend.workloads import llama
from runtime.backends import ATTENTION_PROVIDERS, BACKENDS, resolve_backend
from runtime.array_files import read_arrays
from runtime.policies import ORDERS
from turnip import Session
from turnip.inputs import check_prefill_plan, checked_prompts
from turnip_cli import process
from turnip_cli.llama_cmd import add_adapter_argument, adapter_note, check_host_memory_for, model_input_files
from turnip_cli.progress import Progress, add_progress_argument
from turnip_cli.planning import check_positive_options, check_seed, parse_size, warn_ignored_attention
from turnip_cli.run_cmd import run_files
from turnip_ir.errors import InputError
from turnip_ir.files import check_outputs, is_file, write_all
from turnip_ir.kernels import DTYPE_BYTES
from turnip_ir.limits import PATH_CHARS, quoted
from turnip_ir.units import format_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", metavar="DIR", help="Hugging Face model folder (config.json and safetensors)")
    source.add_argument("--config", metavar="NAME_OR_JSON", help=f"preset ({', '.join(llama.PRESETS)}) or config.json; "
                        "weights are random from --seed")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--input-ids", metavar="FILE", help=".npy of token ids [P] or [B, P], or .npz of 1-D prompts of any lengths")
    prompts.add_argument("--prompt-tokens", type=int, metavar="P", help="draw --batch prompts of P ids from --seed")
    prompts.add_argument("--prompt", action="append", metavar="TEXT", help="a text prompt (repeatable), tokenized by "
                         "the --weights folder's tokenizer.json")
    prompts.add_argument("--prompt-file", metavar="FILE.jsonl", help='text prompts, one {"prompt": TEXT} a line')
    add_adapter_argument(parser)
    parser.add_argument("--chat", action="store_true", help="each text prompt is a user message of the folder's chat template")
    parser.add_argument("--stream", action="store_true", help="print each prompt's text as its tokens arrive (several "
                        "prompts: lines prefixed by the prompt's index)")
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
    parser.add_argument("--outputs", metavar="OUT.npz", help="write generated int64 [B, N] (and text [B] where the "
                        "folder has a tokenizer) to this .npz; without it the text is printed")
    parser.add_argument("--trace", metavar="TRACE.json", help="write the last decode step's Chrome/Perfetto trace")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="compute dtype (default: the "
                        "config's); bfloat16 is computed in float32 on the cpu backend")
    parser.add_argument("--stop-at-eos", action="store_true", help="after an end-of-sequence id, a prompt emits that id to the end")
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PROVIDERS, help="the cuda backend's attention provider "
                        "for the prefills; auto: torch-cudnn where torch with CUDA runs (a session does not rank the "
                        "providers: triton's first use in a process costs seconds)")
    parser.add_argument("--plan-dir", metavar="DIR", help="keep compiled plans in DIR and read them from there in later runs "
                        "(each proven a plan of the run's graph and budget when read, else compiled again)")
    parser.add_argument("--prefill-plan", type=prefill_plan_argument, default="auto", metavar="auto|default|NAME=VALUE,...",
                        help="how the prefill's plan is chosen. auto (default): on the sim and cuda backends, layer order, "
                        "token block, query group and schedule chosen by the sim where the budget binds (the choice kept "
                        "in $TURNIP_CACHE, else ~/.cache/turnip); default: the frontend's defaults, nothing searched; "
                        "or some forced, the rest chosen, e.g. block=4096,query_group=2 (names: layer_order, block, "
                        "query_group, schedule; a value may be auto)")
    add_progress_argument(parser)


def prefill_plan_argument(text: str):
    """`--prefill-plan`'s value: `auto`, `default`, or NAME=VALUE pairs (block and query_group as integers
    unless auto), checked as `Session` checks its `prefill_plan`."""
    if text in ("auto", "default"):
        return text
    plan: dict[str, object] = {}
    for pair in text.split(","):
        name, equals, value = pair.strip().partition("=")
        if not equals or not name or not value:
            raise argparse.ArgumentTypeError(f"must be auto, default or NAME=VALUE pairs separated by commas, got {quoted(text, PATH_CHARS)}")
        if name in ("block", "query_group") and value != "auto":
            try:
                value = int(value)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{name} must be a positive integer or auto, got {quoted(value, PATH_CHARS)}") from None
        plan[name.strip()] = value
    try:
        return check_prefill_plan(plan)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("prefill_plan: ")) from None


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    check_positive_options(args, "gpus", "batch", "prompt_tokens", "max_new_tokens")
    check_seed(args.seed)
    backend = resolve_backend(args.backend)
    if args.outputs and backend == "sim":
        raise InputError("the sim backend computes no values, so --outputs needs a backend that computes")
    check_outputs({"--outputs": args.outputs, "--trace": args.trace},
                  {**model_input_files(args), "--prompt-file": args.prompt_file})  # before a long run
    _check_text_options(args, backend)
    if args.weights is not None and not is_file(Path(args.weights) / "config.json"):
        raise InputError(f"weights folder {quoted(args.weights, PATH_CHARS)} does not exist or has no config.json")
    warn_ignored_attention(args.attention, backend)
    named = {"attention_provider": args.attention} if args.attention != "auto" and backend == "cuda" else None
    progress = Progress.for_args(args)
    began = time.perf_counter()
    with progress.phase("loading the model"):
        session = Session(config=args.config, weights=args.weights, memory=parse_size(args.memory), backend=backend,
                          gpus=args.gpus, order=args.order, seed=args.seed, dtype=args.dtype, plan_dir=args.plan_dir,
                          backend_options=named, adapter=args.adapter, prefill_plan=args.prefill_plan)
    loaded = time.perf_counter() - began
    with process.scope(session):
        prompts = _prompts(args, session)
        stream = Stream(session.tokenizer(), len(prompts)) if args.stream else None
        print(f"generate {session.config.name}: {len(prompts)} prompt(s) of {', '.join(str(len(p)) for p in prompts)} tokens, "
              f"{args.max_new_tokens} new tokens each; budget {args.memory} per GPU on {backend}"
              f"{adapter_note(args.adapter, session.adapter)}")
        steps = StepProgress(progress, args.max_new_tokens, len(prompts), stream)
        with progress.phase("set-up and prefill"):
            result = session.generate(prompts, args.max_new_tokens, args.temperature, args.top_p, args.seed, args.stop_at_eos,
                                      on_step=steps)
        last_token = time.perf_counter()
        steps.finish()
    if stream is not None:
        stream.finish()
    elif result.text is not None and not args.outputs:
        print("\n".join(prefixed(b, text, len(result.text)) for b, text in enumerate(result.text)))
    written = write_all(run_files(args.outputs, lambda: _arrays(result), args.trace, result.recorder))
    print("\n".join(summary_lines(result, loaded, last_token - process.started(began))))
    for path in written:
        print(f"wrote {path}")
    return 0


def summary_lines(result, load_seconds: float = 0.0, command_seconds: float = 0.0) -> list[str]:
    """The call's phases apart: set-up (loading the model, compiling, preparing plans), the prefill, the time
    to the first token, the steady decode step, and tokens/s at the steady step and end to end."""
    steps = result.step_seconds
    lines = [] if result.computed else ["sim backend: timing only, no tokens computed (token 0 fed back each step); "
                                        "prefill and steps are the sim's predicted times"]
    batch = len(result.tokens)
    ended = f" (every sequence ended after {len(steps)} of {result.tokens.shape[1]})" if len(steps) < result.tokens.shape[1] else ""
    lines += [
        f"set-up: model loaded in {load_seconds:.2f} s; compiled {result.compiles} graph(s) in {result.compile_seconds:.2f} s, "
        f"{result.cache_hits} cache hit(s)" + (f" ({result.plans_read} plan(s) read from --plan-dir)" if result.plans_read else "")
        + f"; plans prepared on the backend in {result.prepare_seconds:.2f} s (within the runs below)",
        *(f"prefill plan for {chosen.tokens} tokens: {chosen.describe()}" for chosen in result.prefill_plans),
        f"prefill {result.prefill_seconds:.4f} s; first token after {result.first_token_seconds:.3f} s of the call",
        f"decode {len(steps)} step(s){ended}: steady {result.steady_step_seconds * 1e3:.1f} ms a step, "
        f"{result.steady_tokens_per_second:.1f} tokens/s; first step {steps[0] * 1e3:.1f} ms; all steps {result.decode_seconds:.3f} s",
    ]
    if result.computed and command_seconds:
        lines.append(f"end to end: {command_seconds:.2f} s from the command's start to its last token, "
                     f"{batch * len(steps) / command_seconds:.1f} tokens/s")
    link = result.step_link
    if link is not None and len(steps) > 1:  # the floor a step's copies set: a step cannot be faster than its link time
        moved, rate = link
        floor = moved / rate
        lines.append(f"decode's link floor: a step copies {format_size(moved)} to the GPU (the weights and cache the arena "
                     f"does not keep), {floor * 1e3:.4g} ms at the {rate / 1e9:.1f} GB/s its copies ran at; "
                     f"the steady step is {result.steady_step_seconds / floor:.2f}x that")
    lines.append(f"offloaded {format_size(result.bytes_offloaded)}, reloaded {format_size(result.bytes_reloaded)}; "
                 f"peak arena use {format_size(result.peak_arena)}")
    if result.device_peak is not None:
        lines.append(process.device_memory_line(result.device_peak, result.device_context))
    if len(steps) > 1:  # what stayed on the GPU between steps shows in what later steps copy before they run
        later = sorted(result.step_bytes_placed[1:])
        spread = format_size(later[0]) if later[0] == later[-1] else f"{format_size(later[0])} to {format_size(later[-1])}"
        lines.append(f"inputs copied onto the GPU before a step: {format_size(result.step_bytes_placed[0])} at the first, "
                     f"then {spread} (what a step kept from the one before is not copied again)")
    return lines


class StepProgress:
    """`on_step` for `Session.generate`: ends the set-up phase at the first step, reports the decode's progress
    (a line every `DELAY` seconds: steps done and tokens/s) when progress is on, and passes the tokens to
    `stream` when streaming."""

    def __init__(self, progress: Progress, steps: int, batch: int, stream=None):
        self.progress, self.steps, self.batch, self.stream = progress, steps, batch, stream
        self.started = self.shown = None

    def __call__(self, step: int, tokens: np.ndarray) -> None:
        now = time.perf_counter()
        if step == 0:
            self.progress.end()
            self.started = self.shown = now
        elif self.progress.enabled and now - self.shown >= self.progress.delay:
            self.shown = now
            rate = self.batch * step / (now - self.started)
            print(f"turnip: decoding: step {step + 1} of {self.steps}, {rate:.1f} tokens/s", file=self.progress.stream, flush=True)
        if self.stream is not None:
            self.stream(step, tokens)

    def finish(self) -> None:
        self.progress.end()


def _check_text_options(args: argparse.Namespace, backend: str) -> None:
    """Text needs a folder's tokenizer, --chat needs text, and --stream values: one line each, before any work."""
    text = args.prompt is not None or args.prompt_file is not None
    if (text or args.stream) and args.weights is None:
        flag = "--prompt" if args.prompt is not None else "--prompt-file" if text else "--stream"
        raise InputError(f"{flag} needs --weights: the model folder's tokenizer.json turns text into ids and back, "
                         "and a --config has no tokenizer")
    if args.chat and not text:
        raise InputError("--chat applies the chat template to text prompts: give --prompt or --prompt-file")
    if args.stream and backend == "sim":
        raise InputError("the sim backend computes no values, so --stream needs a backend that computes")


def _arrays(result) -> dict[str, np.ndarray]:
    """What --outputs holds: the new tokens, and their text where the session has a tokenizer."""
    arrays = {"generated": result.tokens}
    if result.text is not None:
        arrays["text"] = np.array(result.text, dtype=np.str_)
    return arrays


def prefixed(b: int, text: str, prompts: int) -> str:
    """A prompt's text as printed: as it is for one prompt; for several, each line prefixed by its index."""
    return text if prompts == 1 else "\n".join(f"[{b}] {line}" for line in text.split("\n"))


class Stream:
    """--stream: the `on_step` callback printing each prompt's new text once it is complete (frontend/text.py
    `TextStream`): one prompt's as it comes, several prompts' as lines prefixed by the prompt's index."""

    def __init__(self, tokenizer: Tokenizer, prompts: int):
        self.texts = [TextStream(tokenizer) for _ in range(prompts)]

    def __call__(self, step: int, tokens: np.ndarray) -> None:
        for b, token in enumerate(tokens):
            self._show(b, self.texts[b].push([token]))

    def finish(self) -> None:
        for b, text in enumerate(self.texts):
            self._show(b, text.finish())
        if len(self.texts) == 1:
            print(flush=True)

    def _show(self, b: int, text: str) -> None:
        if text:
            print(prefixed(b, text, len(self.texts)), end="" if len(self.texts) == 1 else "\n", flush=True)


def _prompts(args: argparse.Namespace, session: Session) -> list[np.ndarray]:
    """The prompts as given (checked by the session): token ids, text tokenized by the folder's tokenizer, or
    --batch random ones of --prompt-tokens ids; the run is held against host memory first (`_check_memory`),
    before random ids are drawn."""
    config = session.config
    if args.prompt is not None or args.prompt_file is not None:
        texts = args.prompt if args.prompt is not None else jsonl_texts(args.prompt_file, "prompt")
        prompts = checked_prompts(texts, config, session.tokenizer, chat=args.chat)
        _check_memory(args, session, [len(p) for p in prompts])
        return prompts
    if args.prompt_tokens is not None:
        _check_memory(args, session, [args.prompt_tokens] * args.batch)
        ids = llama.random_ids(config, args.prompt_tokens * args.batch, args.seed)
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


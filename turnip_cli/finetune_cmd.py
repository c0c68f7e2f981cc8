"""`turnip finetune`: LoRA fine-tuning of a LLaMA-family model under a per-GPU memory budget.

Thin: it checks the flags and the output paths, opens a `turnip.Session` and calls `Session.finetune`
(turnip/finetune.py), showing each step's loss, tokens/s and the time left on stderr (a terminal, or
--progress), then writes the adapter folder (PEFT's adapter_config.json and adapter_model.safetensors, and
the optimizer state beside them, all or none: turnip_ir/files.py `write_all`) and the --log CSV, one row a
step. A loss that becomes inf or NaN stops the run: the adapter after the last good step is written and
the error line names the step. Every bad input is one line and a non-zero exit before any step, and no
output is ever one of the inputs.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from pathlib import Path

from frontend.workloads import llama
from runtime.backends import BACKENDS, resolve_backend
from runtime.policies import ORDERS
from turnip import Session
from turnip.finetune import FinetuneResult, StepRecord, TrainingStopped, check_computes
from turnip.lora import CONFIG_FILE, PROJECTIONS, STATE_FILE, WEIGHTS_FILE, Adapter, LoraSettings
from turnip_cli import process
from turnip_cli.planning import check_positive_options, parse_size
from turnip_cli.progress import add_progress_argument
from turnip_ir.errors import InputError
from turnip_ir.files import check_outputs, write_all
from turnip_ir.limits import shorten
from turnip_ir.units import format_size

LOG_COLUMNS = ("step", "loss", "lr", "tokens_per_s", "tokens", "seconds", "loss_scale", "skipped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", metavar="DIR", help="Hugging Face model folder (config.json and safetensors)")
    source.add_argument("--config", metavar="NAME_OR_JSON", help=f"preset ({', '.join(llama.PRESETS)}) or config.json; "
                        "weights are random from --seed")
    parser.add_argument("--data", required=True, metavar="FILE", help=".npy token ids [rows, T], .npz of 1-D sequences "
                        "(padded, padding ignored in the loss) or .jsonl with a \"text\" field (the --weights folder's tokenizer)")
    parser.add_argument("--steps", type=int, required=True, metavar="N", help="optimizer steps")
    parser.add_argument("--memory", required=True, metavar="SIZE", help="per-GPU budget, e.g. 8GiB")
    parser.add_argument("--adapter-out", required=True, metavar="DIR", help="write the PEFT LoRA adapter folder here "
                        "(and the optimizer state, to go on from)")
    parser.add_argument("--adapter-in", metavar="DIR", help="start from this PEFT LoRA adapter (its r, lora_alpha, "
                        "target_modules, and the optimizer state where turnip wrote one)")
    parser.add_argument("--lora-rank", type=int, metavar="R", help="adapter rank (default 8)")
    parser.add_argument("--lora-alpha", type=number_above(0), metavar="A", help="scaling alpha / r (default 2 r)")
    parser.add_argument("--lora-targets", type=targets, metavar="q_proj,v_proj,...", help="projections to adapt "
                        f"(default q_proj,v_proj; of {','.join(PROJECTIONS)})")
    parser.add_argument("--lr", type=number_above(0), default=1e-4, metavar="X", help="peak learning rate (default 1e-4)")
    parser.add_argument("--weight-decay", type=number_above(0, "a number of 0 or more", inclusive=True), default=0.01,
                        metavar="X", help="AdamW's decoupled weight decay (default 0.01)")
    parser.add_argument("--warmup-steps", type=int, default=0, metavar="S", help="linear warm-up from 0, then constant (default 0)")
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="examples per micro-batch (default 1)")
    parser.add_argument("--grad-accum", type=int, default=1, metavar="K", help="micro-batches per step (default 1)")
    parser.add_argument("--seq-len", type=int, metavar="T", help="tokens per example, longer ones cut, shorter padded "
                        "(default: the longest example)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is there, else cpu")
    parser.add_argument("--gpus", type=int, default=1, metavar="N")
    parser.add_argument("--order", default="nondet", choices=ORDERS)
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seeds a new adapter, random weights and --order random")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="compute dtype (default: the config's); "
                        "float16 scales the loss dynamically; bfloat16 is computed in float32 on the cpu backend")
    parser.add_argument("--log", metavar="FILE.csv", help=f"one row per step: {', '.join(LOG_COLUMNS)}")
    add_progress_argument(parser)


def number_above(least: float, kind: str = "a positive number", inclusive: bool = False):
    """An argparse type: a finite float above `least` (or at it, `inclusive`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < least or (value == least and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {kind}, got '{shorten(text)}'")
        return value

    return parse


def targets(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in PROJECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"'{shorten(unknown[0])}' is not a projection (known: {','.join(PROJECTIONS)})")
    return names


def run(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend)
    check_computes(backend)  # before the weights are read
    _check_paths(args)
    check_positive_options(args, "steps", "batch", "grad_accum", "gpus", "lora_rank", "seq_len")
    if args.warmup_steps < 0:
        raise InputError(f"--warmup-steps must be 0 or more, got {args.warmup_steps}")
    if args.seq_len == 1:
        raise InputError("--seq-len must be at least 2: one token predicts nothing")
    session = Session(config=args.config, weights=args.weights, memory=parse_size(args.memory), backend=backend,
                      gpus=args.gpus, order=args.order, seed=args.seed, dtype=args.dtype)
    with process.scope(session):
        adapter = _adapter_in(args, session.config)
        settings = adapter.settings if adapter else LoraSettings(args.lora_rank or 8, args.lora_alpha, args.lora_targets or ("q_proj", "v_proj"))
        print(f"finetune {session.config.name}: {settings.summary}; "
              f"{args.steps} steps of {args.grad_accum} x {args.batch} examples; budget {args.memory} per GPU on {backend}")
        progress = Bar(args.steps, args)
        try:
            result = session.finetune(args.data, args.steps, adapter=args.adapter_in, rank=settings.rank, alpha=settings.alpha,
                                      targets=settings.targets, lr=args.lr, weight_decay=args.weight_decay,
                                      warmup_steps=args.warmup_steps, batch=args.batch, grad_accum=args.grad_accum,
                                      seq_len=args.seq_len, seed=args.seed, base_model=_base_model(args), on_step=progress)
        except TrainingStopped as stop:
            _write(args, stop.result)
            raise InputError(f"{stop} (written to {args.adapter_out})") from None
        finally:
            progress.close()
    written = _write(args, result)
    print("\n".join(summary_lines(result)))
    for path in written:
        print(f"wrote {path}")
    return 0


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, an adapter folder that cannot be written or is the input adapter, and
    outputs that are inputs."""
    out = Path(args.adapter_out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--adapter-out {out} is a file; it must be a folder (PEFT's adapter folder)")
    if not out.resolve().parent.is_dir():
        raise InputError(f"cannot write --adapter-out {out}: its folder does not exist")
    if args.adapter_in is not None and out.resolve() == Path(args.adapter_in).resolve():
        raise InputError(f"--adapter-out {out} is the --adapter-in folder: writing it would destroy the input, choose another folder")
    config = args.config if args.config is not None and Path(args.config).is_file() else None
    files = {f"--adapter-out's {name}": out / name for name in (CONFIG_FILE, WEIGHTS_FILE, STATE_FILE)} if out.is_dir() else {}
    check_outputs({**files, "--log": args.log}, {"--data": args.data, "--config": config, "--weights": args.weights,
                                                 "--adapter-in": args.adapter_in})


def _adapter_in(args: argparse.Namespace, config: llama.LlamaConfig) -> Adapter | None:
    """--adapter-in's adapter (read here to check it before any step), and flags that disagree with it refused."""
    if args.adapter_in is None:
        return None
    adapter, _ = Adapter.read(args.adapter_in, config)
    given = {"--lora-rank": (args.lora_rank, adapter.settings.rank), "--lora-alpha": (args.lora_alpha, adapter.settings.alpha),
             "--lora-targets": (args.lora_targets and LoraSettings(1, 1, args.lora_targets).targets, adapter.settings.targets)}
    for flag, (value, read) in given.items():
        if value is not None and value != read:
            raise InputError(f"{flag} {value} disagrees with --adapter-in's {read}: leave it out to go on with the adapter's")
    return adapter


def _base_model(args: argparse.Namespace) -> str:
    return str(Path(args.weights).resolve()) if args.weights is not None else args.config


def _write(args: argparse.Namespace, result: FinetuneResult) -> list[Path]:
    """The adapter folder's files and the log, all or none."""
    out = Path(args.adapter_out)
    out.mkdir(exist_ok=True)
    files = result.adapter.files(out, result.state)
    if args.log is not None:
        files.append((Path(args.log), log_text(result.steps)))
    return write_all(files)


def log_text(steps: list[StepRecord]) -> str:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(LOG_COLUMNS)
    for s in steps:
        writer.writerow([s.step, repr(s.loss), repr(s.lr), f"{s.tokens_per_s:.3f}", s.tokens, f"{s.seconds:.6f}",
                         repr(s.loss_scale), int(s.skipped)])
    return text.getvalue()


def summary_lines(result: FinetuneResult) -> list[str]:
    steps, costs = result.steps, result.costs
    seconds = sum(s.seconds for s in steps)
    tokens = sum(s.tokens for s in steps)
    rate = tokens / seconds if seconds > 0 else 0.0
    lines = [f"loss {steps[0].loss:.4f} at step {steps[0].step}, {steps[-1].loss:.4f} at step {steps[-1].step}; "
             + f"{seconds:.2f} s, {rate:.1f} tokens/s"]
    skipped = sum(s.skipped for s in steps)
    if skipped:
        lines.append(f"{skipped} step(s) skipped by the fp16 loss scaler (scale now {result.state.scaler.scale:g})")
    if result.truncated:
        lines.append(f"{result.truncated} example(s) longer than the sequence length: their first tokens were read")
    if costs.compiles or costs.cache_hits:
        lines.append(f"compiled {costs.compiles} graph(s) in {costs.compile_seconds:.3f} s; offloaded {format_size(costs.bytes_offloaded)}, "
                     f"reloaded {format_size(costs.bytes_reloaded)}; peak arena use {format_size(costs.peak_arena)}")
    if costs.recompute:
        lines.append(f"the step {costs.recompute}")
    if result.device_peak is not None:
        lines.append(process.device_memory_line(result.device_peak, result.device_context))
    return lines


class Bar:
    """Each step's loss, tokens/s and the time left, on a tqdm bar over the steps (stderr, when shown)."""

    def __init__(self, steps: int, args: argparse.Namespace):
        from tqdm import tqdm

        shown = getattr(args, "progress", False) or sys.stderr.isatty()
        self.bar = tqdm(total=steps, unit="step", desc="finetune", disable=not shown, file=sys.stderr)
        self.done = 0

    def __call__(self, record: StepRecord) -> None:
        self.bar.set_postfix_str(f"loss {record.loss:.4f}, {record.tokens_per_s:.0f} tokens/s", refresh=False)
        self.bar.update(1)
        self.done += 1
        if self.done == 1:  # the plan, the backend and its work are made: later full collections skip them
            process.settle_heap()

    def close(self) -> None:
        self.bar.close()

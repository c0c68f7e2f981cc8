"""`turnip`: the user-facing command. Subcommands live in their own modules and stay thin.

Each subcommand module has `add_arguments(parser)` and `run(args) -> int`. `TurnipError`s become one
line on stderr and their exit code; nothing else a user can cause prints a traceback. Only the named
subcommand's module is imported (they import numpy, xDSL, the compiler and the runtime: `turnip --help`
imports none of them). No parser matches an option by a prefix (`--prompt` is not `--prompt-tokens`).
"""

from __future__ import annotations

from turnip_cli import process  # noqa: I001 (first: its clock is the command's start)

import argparse
import importlib
import sys

from turnip_cli import interrupt
from turnip_ir.errors import TurnipError

SUBCOMMANDS = {
    "run": ("turnip_cli.run_cmd", "compile (if needed) and execute a graph"),
    "viz": ("turnip_cli.viz_cmd", "draw a taskgraph or memgraph with graphviz"),
    "explain": ("turnip_cli.explain_cmd", "what a plan offloads and reloads, and why"),
    "build": ("turnip_cli.build_cmd", "write a workload's taskgraph (matmul, ffn, llama)"),
    "llama": ("turnip_cli.llama_cmd", "LLaMA prefill under a memory budget: weights and token ids to hidden states"),
    "generate": ("turnip_cli.generate_cmd", "LLaMA generation under a memory budget: prompts to new tokens"),
    "finetune": ("turnip_cli.finetune_cmd", "LoRA fine-tuning of a LLaMA model under a memory budget: data to a PEFT adapter"),
}


def main(argv: list[str] | None = None) -> int:
    try:
        with interrupt.guard():
            return _main(argv)
    except KeyboardInterrupt:  # also while the subcommands import, not only while they run
        print("turnip: interrupted", file=sys.stderr)
        return 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (`turnip run: error: ...`, exit 2), not the usage text and a
    line; `--help` still prints the usage. Options are matched whole, never by a prefix."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None) -> tuple[argparse.ArgumentParser, dict]:
    """`turnip`'s parser with every subcommand, and the arguments of `command` alone (its module imported,
    returned by name); the others parse nothing but `--help`."""
    parser = _Parser(prog="turnip", description="Turnip: run computations larger than GPU memory")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(sub_parser)
    return parser, modules


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((word for word in argv if not word.startswith("-")), None)  # turnip's own options take no value
    parser, modules = build_parser(command)
    args = parser.parse_args(argv)
    try:
        return modules[args.command].run(args)
    except TurnipError as err:
        interrupt.check()  # an error that follows a swallowed Ctrl-C is the interrupt's doing
        print(f"turnip {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # a path the user gave that cannot be read or written
        interrupt.check()
        where = f"{err.filename}: " if err.filename else ""
        print(f"turnip {args.command}: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1


def cli() -> None:
    """The `turnip` command: `main`, then the process ends at once (turnip_cli/process.py)."""
    process.ends_with_command()
    process.end(main())


if __name__ == "__main__":
    cli()

"""The command line as a new user meets it (issue 47): a Ctrl-C that lands in a ctypes callback during a
cold numba compile still ends in "interrupted"; no option is matched by a prefix; `turnip --help` imports
no subcommand."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import turnip_cli.run_cmd
from turnip_cli import interrupt
from turnip_cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def _swallowed_ctrl_c() -> None:
    """SIGINT inside a ctypes callback, as in llvmlite's object cache while numba compiles: the handler's
    KeyboardInterrupt is printed as "Exception ignored" (hidden by the guard) and the callback returns."""
    callback = ctypes.CFUNCTYPE(None)(lambda: signal.raise_signal(signal.SIGINT))
    callback()


@pytest.mark.parametrize("then", [RuntimeError("no compiled object yet for <Library 'llama'>"), ValueError("x"), None])
def test_ctrl_c_swallowed_during_a_cold_compile_is_the_interrupted_line(then, monkeypatch, capsys):
    def run(args):
        _swallowed_ctrl_c()
        if then is not None:
            raise then  # what numba raises when it asks the object cache for what the interrupted callback never stored
        return 0

    monkeypatch.setattr(turnip_cli.run_cmd, "run", run)
    assert main(["run", "in.json", "--memory", "1MiB"]) == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["turnip: interrupted"], err


def test_an_error_after_a_swallowed_ctrl_c_is_the_interrupt_not_its_message(monkeypatch, capsys):
    from turnip_ir.errors import KernelError

    def run(args):
        _swallowed_ctrl_c()
        raise KernelError("kernel 'matmul' raised: no compiled object yet")

    monkeypatch.setattr(turnip_cli.run_cmd, "run", run)
    assert main(["run", "in.json", "--memory", "1MiB"]) == 130
    assert capsys.readouterr().err.splitlines() == ["turnip: interrupted"]


def test_an_error_without_a_ctrl_c_is_still_its_own(monkeypatch):
    def run(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(turnip_cli.run_cmd, "run", run)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["run", "in.json", "--memory", "1MiB"])
    assert not interrupt._pending


# ----- options are never matched by a prefix --------------------------------------------------------
def _prefixes(parser):
    """Each long option of `parser` cut by one character, where that is no option itself."""
    options = {name for action in parser._actions for name in action.option_strings}
    return [name[:-1] for name in sorted(options) if name.startswith("--") and len(name) > 3 and name[:-1] not in options]


def _refused(parser, prefix, positionals) -> bool:
    """Whether `prefix` is left unknown (not taken as the option it begins), with every option optional."""
    for action in parser._actions:
        action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    try:
        _, unknown = parser.parse_known_args([*positionals, prefix, "1"])
    except SystemExit:
        return False  # taken as the option, then its value refused
    return prefix in unknown


@pytest.mark.parametrize("command", sorted(__import__("turnip_cli.main").main.SUBCOMMANDS))
def test_no_option_of_any_command_is_matched_by_a_prefix(command):
    from turnip_cli.main import build_parser

    parser, _ = build_parser(command)
    sub = parser._subparsers._group_actions[0].choices[command]
    positionals = [next(iter(action.choices or ["x"])) for action in sub._actions if not action.option_strings and action.nargs not in ("?", "*")]
    prefixes = _prefixes(sub)
    assert prefixes, "the command has long options"
    taken = [prefix for prefix in prefixes if not _refused(sub, prefix, positionals)]
    assert taken == []


def test_a_prefix_of_an_option_is_an_unrecognized_argument(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["generate", "--config", "tiny", "--input-ids", "ids.npy", "--prompt-tok", "6", "--max-new-tokens", "2",
              "--memory", "1MiB"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.splitlines() == ["turnip: error: unrecognized arguments: --prompt-tok 6"]


def test_turnip_opt_matches_no_option_by_a_prefix(tmp_path, monkeypatch):
    from turnip_cli import opt_driver

    seen = {}
    register = opt_driver.TurnipOptMain.register_all_arguments

    def keep(self, arg_parser):
        register(self, arg_parser)
        seen["parser"] = arg_parser

    monkeypatch.setattr(opt_driver.TurnipOptMain, "register_all_arguments", keep)
    source = tmp_path / "in.mlir"
    source.write_text("")
    opt_driver.main([str(source)])
    parser = seen["parser"]
    prefixes = _prefixes(parser)
    assert "--emi" in prefixes and "--stat" in prefixes
    assert [prefix for prefix in prefixes if not _refused(parser, prefix, [str(source)])] == []


# ----- turnip --help imports no subcommand ----------------------------------------------------------
HEAVY = ("numpy", "xdsl", "numba", "passes", "runtime", "frontend", "turnip")


def _imported_by(args: list[str]) -> set[str]:
    code = ("import sys\nfrom turnip_cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.splitlines()[-1].split())  # the last line: the help comes before it


def test_turnip_help_imports_no_subcommand_and_a_subcommand_only_its_own():
    top = _imported_by(["--help"])
    assert not {name for name in top if name.split(".")[0] in HEAVY}
    assert not {name for name in top if name.startswith("turnip_cli.") and name not in ("turnip_cli.main", "turnip_cli.interrupt", "turnip_cli.process")}
    viz = _imported_by(["viz", "--help"])
    assert "turnip_cli.viz_cmd" in viz and "turnip_cli.generate_cmd" not in viz and "turnip_cli.llama_cmd" not in viz


# ----- turnip generate --help says what each option does ----------------------------------------------
def test_turnip_generate_help_describes_every_option_and_the_units_memory_takes():
    from turnip_cli.main import build_parser
    from turnip_ir.units import _UNITS

    parser, _ = build_parser("generate")
    sub = parser._subparsers._group_actions[0].choices["generate"]
    undescribed = [action.option_strings[0] for action in sub._actions if action.option_strings and not action.help]
    assert undescribed == []
    memory = next(action.help for action in sub._actions if "--memory" in action.option_strings)
    named = {word.lower() for word in re.findall(r"\b[KMG]i?B\b", memory)}
    assert named == {unit for unit in _UNITS if len(unit) > 1}

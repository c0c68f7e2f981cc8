"""What README.md and docs/generation.md say is true (issue 47, item 19): the layout table names every
`turnip` command, the dependency list every dependency, `make test` has a time; the bytes generation.md
quotes are what the command it quotes prints; the errors it names can be imported from `turnip`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import turnip
from turnip_cli.main import SUBCOMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
GENERATION = (ROOT / "docs" / "generation.md").read_text()


def test_the_layout_table_names_every_command_and_the_api():
    row = next(line for line in README.splitlines() if line.startswith("| `turnip_cli/`"))
    assert [name for name in SUBCOMMANDS if f"`{name}`" not in row] == []
    assert any(line.startswith("| `turnip/`") for line in README.splitlines())


def test_the_requirements_name_every_dependency():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9_.-]+", spec).group(0) for spec in dependencies]
    requirements = README[README.index("Requirements:"):]
    assert [name for name in names if not re.search(rf"\b{re.escape(name)}\b", requirements)] == []


def test_make_test_says_how_long_it_takes():
    line = next(line for line in README.splitlines() if line.startswith("make test"))
    assert re.search(r"\d+(-\d+)? minutes", line)


def test_the_copied_bytes_generation_md_quotes_are_what_the_command_prints(capsys):
    quoted = re.search(r"`(turnip generate [^`]*--memory 1MiB --backend cpu)` copies (\S+ \S+) before the first step, "
                       r"(\S+ \S+)\s+before each of the others", GENERATION.replace("\n  ", " "))
    assert quoted, "generation.md quotes a command and the bytes it copies"
    assert main(quoted.group(1).split()[1:]) == 0
    printed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("inputs copied onto the GPU"))
    assert f"{quoted.group(2)} at the first, then {quoted.group(3)} " in printed


def test_the_errors_generation_md_names_can_be_imported_from_turnip():
    section = GENERATION[GENERATION.index("## Python"):GENERATION.index("## `turnip generate`")]
    named = set(re.findall(r"`(\w+Error)`", section))
    assert {"TurnipError", "InputError", "BudgetError"} <= named
    assert [name for name in named if not issubclass(getattr(turnip, name, type(None)), turnip.TurnipError)] == []

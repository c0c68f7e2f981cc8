"""README's "In six commands" block runs as written: in a copy of examples/, each command in turn exits 0."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## In six commands"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith(". ")]


def test_the_block_is_what_this_test_runs() -> None:
    commands = _commands()
    assert len(commands) == 6 and all(c.split()[0] in ("turnip", "turnip-opt") for c in commands)


def test_readme_commands_run_in_order(tmp_path: Path) -> None:
    """In a copy of examples/, one after the other, as a reader would type them."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "out").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in _commands():
        if " viz " in f" {command} " and shutil.which("dot") is None:
            continue  # pictures need graphviz's dot; the CLI's own tests cover the message without it
        tool, *args = shlex.split(command)
        module = {"turnip": "turnip_cli.main", "turnip-opt": "turnip_cli.opt"}[tool]
        done = subprocess.run([sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"

"""The help texts list what the code accepts: placements from the workloads' own tables, turnip-opt's passes
with their options from the registry, and an example pipeline that runs."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from frontend.workloads import ffn, llama, matmul
from passes.registry import all_passes
from turnip_cli.main import main as turnip
from turnip_cli.opt import main as turnip_opt
from turnip_cli.opt_driver import EXAMPLE


def _help(tool, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        tool(argv)
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines and may split words at hyphens


def test_build_help_lists_every_placement(capsys) -> None:
    text = _help(turnip, ["build", "--help"], capsys).replace("- ", "-")
    for placement in (*matmul.PLACEMENTS, *ffn.PLACEMENTS, *llama.PLACEMENTS):
        assert placement in text, placement
    assert "zigzag" in text


def test_llama_gpus_has_help(capsys) -> None:
    text = _help(turnip, ["llama", "--help"], capsys)
    assert "--gpus N GPUs to spread the blocks over" in text


def test_opt_help_lists_turnip_passes_with_options_and_no_foreign_targets(capsys) -> None:
    text = _help(turnip_opt, ["--help"], capsys)
    for name, factory in all_passes().items():
        assert name in text
        for field in dataclasses.fields(factory()):
            if field.init:
                assert f"{field.name}=" in text, (name, field.name)
    assert "turnip-memgraph{budget=" in text
    for foreign in ("riscv-asm", "arm-asm", "wgsl"):
        assert foreign not in text


def test_opt_refuses_foreign_targets(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        turnip_opt(["x.mlir", "-t", "riscv-asm"])
    assert exit_.value.code == 2


def test_opt_help_example_runs(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert turnip(["build", "matmul", "-o", "graph.json"]) == 0
    argv = shlex.split(EXAMPLE.splitlines()[-1])
    assert argv[0] == "turnip-opt"
    assert turnip_opt(argv[1:]) == 0, capsys.readouterr().err
    assert '"format": "turnip.memgraph' in (tmp_path / "plan.json").read_text()

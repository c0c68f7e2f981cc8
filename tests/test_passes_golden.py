"""Golden IR tests of every pass, MLIR-lit style, through `turnip-opt` itself.

Each `golden_passes/X.mlir` starts with `// PIPELINE: <pass pipeline>` (and `// EXIT: N` when the run
must fail). A passing run's output must equal `X.out.mlir`; a failing run must exit N with the one-line
diagnostic in `X.err` and write nothing. Regenerate with `TURNIP_UPDATE_GOLDEN=1` and review the diff.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from goldens import compare

from turnip_cli.opt import main as opt_main
from turnip_ir.io import load_memgraph

GOLDEN = Path(__file__).parent / "golden_passes"
CASES = sorted(p for p in GOLDEN.glob("*.mlir") if not p.name.endswith(".out.mlir"))


def _header(path: Path, key: str) -> str | None:
    match = re.search(rf"^// {key}: (.*)$", path.read_text(), re.MULTILINE)
    return match.group(1).strip() if match else None


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_pass_golden(path: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out.mlir"
    code = opt_main([str(path), "-p", _header(path, "PIPELINE"), "-o", str(out)])
    err = capsys.readouterr().err
    want_exit = int(_header(path, "EXIT") or 0)
    assert code == want_exit, err
    if want_exit:
        assert not out.exists() and err.count("\n") == 1 and "Traceback" not in err
        compare(path.with_suffix(".err"), err.replace(str(path), path.name))
    else:
        compare(path.with_suffix(".out.mlir"), out.read_text())


def test_seed_example_five_slots_reuses_without_offload_four_slots_offloads() -> None:
    five = load_memgraph(GOLDEN / "seed_five_slots.out.mlir")
    four = load_memgraph(GOLDEN / "seed_four_slots.out.mlir")
    reused = [n for n in five.nodes if n.mem_deps or n.redundant_deps]  # all implied by data paths here
    assert five.count("offload") == 0 and reused
    assert four.count("offload") == 1 and four.count("reload") == 1


def test_a_redundant_edge_is_marked() -> None:
    marked = load_memgraph(GOLDEN / "insert_memory_deps.out.mlir")
    assert any(n.redundant_deps for n in marked.nodes)

"""Golden IR files, MLIR-lit style: `golden/valid/X.mlir` prints as `X.out.mlir`; `golden/invalid/X.mlir`
fails with the one-line diagnostic in `X.err` (with `file:line:col`).

Regenerate the expected files with `TURNIP_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_ir_golden.py`,
then review the diff: a golden file is only as good as the reading it got.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from goldens import compare

from turnip_ir.errors import InputError
from turnip_ir.io import module_text, parse_ir

GOLDEN = Path(__file__).parent / "golden"
VALID = sorted(p for p in (GOLDEN / "valid").glob("*.mlir") if not p.name.endswith(".out.mlir"))
INVALID = sorted((GOLDEN / "invalid").glob("*.mlir"))


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_prints_as_expected(path: Path) -> None:
    module = parse_ir(path.read_text(), path.name)
    compare(path.with_suffix(".out.mlir"), module_text(module))


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_expected_output_is_a_fixed_point(path: Path) -> None:
    """The printed form parses back and prints identically, in custom and generic form."""
    expected = path.with_suffix(".out.mlir").read_text()
    module = parse_ir(expected, path.name)
    assert module_text(module) == expected
    generic = module_text(module, generic=True)
    assert generic.startswith('"builtin.module"()')
    assert module_text(parse_ir(generic, path.name)) == expected


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_gives_its_diagnostic(path: Path) -> None:
    with pytest.raises(InputError) as caught:
        parse_ir(path.read_text(), path.name)
    message = str(caught.value)
    assert "\n" not in message
    compare(path.with_suffix(".err"), message + "\n")


def test_every_golden_input_has_its_expectation() -> None:
    assert len(VALID) >= 10 and len(INVALID) >= 13
    for path in VALID:
        assert path.with_suffix(".out.mlir").exists(), path.name
    for path in INVALID:
        assert path.with_suffix(".err").exists(), path.name

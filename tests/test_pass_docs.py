"""The pass reference in docs/passes.md is what the passes' docstrings render, so it cannot go stale."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from passes.graph_pass import GraphPass
from tools.pass_docs import BEGIN, END, main, render, render_pass, replace_reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "passes.md"


def test_docs_pass_reference_matches_the_docstrings() -> None:
    doc = DOC.read_text()
    fresh = replace_reference(doc, render())
    assert fresh == doc, "docs/passes.md has drifted from the docstrings: run .venv/bin/python -m tools.pass_docs --write docs/passes.md"


def test_every_registered_pass_and_option_is_in_the_reference() -> None:
    reference = render()
    for name in ("turnip-memgraph", "turnip-place-devices", "turnip-insert-offload", "turnip-insert-memory-deps",
                 "turnip-minimize-memory-deps", "turnip-reduce-memory-deps", "turnip-verify-memgraph"):
        assert f"### `{name}`" in reference
    assert "| `schedule` | `given` |" in reference and "| `budget` | required |" in reference
    assert "`order`" not in reference
    assert "Stage: reads `graph`, `cost`, `kept`, `start_on_gpu`; adds `graph`, `source`.\n" in reference  # turnip-insert-offload
    assert "Stage: reads `graph`, `source`; adds nothing.\n" in reference  # turnip-verify-memgraph


def test_every_pass_reads_and_adds_only_fields_of_the_compilation_state() -> None:
    import dataclasses

    from passes.compilation import Compilation
    from passes.registry import all_passes

    fields = {field.name for field in dataclasses.fields(Compilation)}
    for factory in all_passes().values():
        cls = factory()
        assert set(cls.reads) | set(cls.adds) <= fields, cls.name


def test_check_fails_on_a_drifted_copy_and_write_fixes_it(tmp_path, capsys) -> None:
    copy = tmp_path / "passes.md"
    copy.write_text(DOC.read_text().replace("Give a GPU to every kernel without one", "Give a GPU to some kernels"))
    assert main(["--check", str(copy)]) == 1
    assert "differs from the docstrings" in capsys.readouterr().err
    assert main(["--write", str(copy)]) == 0 and copy.read_text() == DOC.read_text()


def test_text_outside_the_markers_is_kept() -> None:
    doc = f"intro\n{BEGIN}\nold\n{END}\nreading\n"
    assert replace_reference(doc, "new") == f"intro\n{BEGIN}\nnew\n{END}\nreading\n"
    with pytest.raises(ValueError, match="passes:reference"):
        replace_reference("no markers\n", "new")


@dataclass(frozen=True)
class _Undocumented(GraphPass):
    """A pass whose option says nothing.

    Its one option has no docstring under it.
    """

    name = "test-undocumented"
    budget: int = 0


@dataclass(frozen=True)
class _LongSummary(GraphPass):
    """A summary that runs
    onto a second line."""

    name = "test-long-summary"


def test_an_undocumented_option_or_a_long_summary_cannot_be_rendered() -> None:
    with pytest.raises(ValueError, match="test-undocumented: option 'budget' has no docstring"):
        render_pass(_Undocumented)
    with pytest.raises(ValueError, match="test-long-summary: the docstring's summary must be one line"):
        render_pass(_LongSummary)

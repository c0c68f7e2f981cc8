"""The example graphs in examples/ are what examples/make_examples.py writes today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_examples_are_regenerated():
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stale = [name for name, text in module.texts().items() if (EXAMPLES / name).read_text() != text]
    assert stale == [], f"run `python examples/make_examples.py`: {stale} differ from what it writes"

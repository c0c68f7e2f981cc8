"""Every reference resolves: the links, file paths and modules that the docs and the code mention exist.

Checked in docs/*.md, README.md, the Makefile and the Python sources: relative markdown links, paths into
the repository's folders (`turnip_ir/kernels.py`, `tests/golden/valid/*.mlir`), markdown files named
bare (`workloads.md`), and dotted names of our modules (`turnip_ir.io.load_memgraph`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("turnip_ir", "frontend", "passes", "runtime", "turnip_cli", "tools")
SOURCES = (*PACKAGES, "tests", "bench", "examples")
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
CODE = [p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py")) if p != Path(__file__).resolve()]
CODE.append(ROOT / "Makefile")

LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./~-])((?:[\w.-]+/)+[\w.*-]+\.(?:py|md|sh|mlir|json|toml|err))(?![\w/])")
MARKDOWN = re.compile(r"(?<![\w./(-])([\w-]+\.md)\b")
MODULE = re.compile(r"(?<![\w.])((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")


def _exists(mention: str, near: Path) -> bool:
    """A path relative to the file that mentions it or to the repository root; a glob must match."""
    for base in (near.parent, ROOT):
        if "*" in mention and any(base.glob(mention)):
            return True
        if (base / mention).exists():
            return True
    return False


def _defines(source: Path, name: str) -> bool:
    text = source.read_text()
    pattern = rf"^\s*(def|class) {name}\b|^\s*{name}\s*[:=]|^from .* import .*\b{name}\b|^\s+{name},$"
    return re.search(pattern, text, re.MULTILINE) is not None


def _module_resolves(dotted: str) -> bool:
    """`a.b.c`: the longest prefix that is one of our modules, and the next name defined in it."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:k])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.exists():
            return k == len(parts) or _defines(source, parts[k])
    return False


def _generated_tops() -> set[str]:
    """Top-level names .gitignore lists (out/, .venv/, ...): made by `make demo` and the like, so a doc may
    name a file under them that does not exist yet, whether or not the folder does."""
    path = ROOT / ".gitignore"
    names = set()
    for line in path.read_text().splitlines() if path.exists() else []:
        line = line.strip().strip("/")
        if line and not any(c in line for c in "*?[!#"):
            names.add(line)
    return names


def _missing(path: Path) -> list[str]:
    text = path.read_text()
    top = {entry.name for entry in ROOT.iterdir()} - _generated_tops()
    missing = []
    for link in LINK.findall(text) if path.suffix == ".md" else []:
        target = link.split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:") and not _exists(target, path):
            missing.append(f"link {link}")
    for mention in PATH.findall(text):
        if mention.split("/")[0] in top and not _exists(mention, path):
            missing.append(f"path {mention}")
    for name in MARKDOWN.findall(text):
        if not (_exists(name, path) or (ROOT / "docs" / name).exists()):
            missing.append(f"file {name}")
    for dotted in MODULE.findall(text):
        if not dotted.endswith((".md", ".py")) and not _module_resolves(dotted):
            missing.append(f"module {dotted}")
    return missing


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_mention_only_what_exists(path: Path) -> None:
    assert _missing(path) == []


def test_code_mentions_only_what_exists() -> None:
    missing = [f"{path.relative_to(ROOT)}: {what}" for path in CODE for what in _missing(path)]
    assert missing == []


def test_the_checker_sees_what_is_missing(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "See [the guide](guide.md), `turnip_ir/verify_ir.py`, NOTES.md and `turnip_ir.verify_ir`;"
        " [ir](../docs/ir.md) is wrong from here, `turnip_ir/kernels.py` and `turnip_ir.io.parse_ir` are fine.\n"
    )
    assert _missing(doc) == [
        "link guide.md",
        "link ../docs/ir.md",
        "path turnip_ir/verify_ir.py",
        "file NOTES.md",
        "module turnip_ir.verify_ir",
    ]


def test_readme_opens_with_the_two_setup_commands() -> None:
    """The set-up contract: README.md's first code block is exactly `make demo` and `make test`."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```\w*\n(.*?)```", text, re.S)
    assert first is not None and text.index("```") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]

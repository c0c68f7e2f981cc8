"""The pass reference of docs/passes.md, rendered from the registered passes' own docstrings.

Per pass, in registry order (passes/registry.py): its name and module, the docstring's first line
(the summary), the rest of the docstring (the description), what the stage reads from and adds to
the compilation state (its `reads` and `adds`, passes/compilation.py), and a table of its options:
name, default ("required" for a field without one) and meaning, the meaning being the string literal
written under the option's field (an attribute docstring). A pass whose summary is not one line, or
an option without its docstring, is an error, not a gap in the docs.

    .venv/bin/python -m tools.pass_docs                          # print the reference
    .venv/bin/python -m tools.pass_docs --write docs/passes.md   # replace it between the markers
    .venv/bin/python -m tools.pass_docs --check docs/passes.md   # exit 1 if the file has drifted

In the file the reference sits between `<!-- passes:reference -->` and `<!-- /passes:reference -->`;
the hand-written text around the markers is kept. tests/test_pass_docs.py runs the check.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap

from passes.registry import all_passes
from tools.generated import replace_between, write_or_check

BEGIN = "<!-- passes:reference -->"
END = "<!-- /passes:reference -->"


def option_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring: the string literal right under `name: type = default` in the class."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs: dict[str, str] = {}
    for statement, following in zip(body, body[1:]):
        literal = following.value if isinstance(following, ast.Expr) else None
        if isinstance(statement, ast.AnnAssign) and isinstance(literal, ast.Constant) and isinstance(literal.value, str):
            docs[statement.target.id] = " ".join(literal.value.split())
    return docs


def _default(value: object) -> str:
    if value is dataclasses.MISSING:
        return "required"
    return '`""`' if value == "" else f"`{value}`"


def _stage(cls: type) -> str:
    """The line saying which fields of the compilation state the stage reads and adds."""
    reads = ", ".join(f"`{name}`" for name in cls.reads)
    adds = ", ".join(f"`{name}`" for name in cls.adds) or "nothing"
    return f"Stage: reads {reads}; adds {adds}."


def render_pass(cls: type) -> str:
    """One pass's section: heading, summary, description, stage fields, options table."""
    summary, _, description = inspect.getdoc(cls).partition("\n\n")
    if "\n" in summary:
        raise ValueError(f"{cls.name}: the docstring's summary must be one line, then a blank line")
    module = cls.__module__.replace(".", "/") + ".py"
    parts = [f"### `{cls.name}` ({module})", summary]
    if description:
        parts.append(description)
    parts.append(_stage(cls))
    fields = [field for field in dataclasses.fields(cls) if field.init]
    if fields:
        docs = option_docs(cls)
        rows = ["| option | default | meaning |", "| --- | --- | --- |"]
        for field in fields:
            if field.name not in docs:
                raise ValueError(f"{cls.name}: option '{field.name}' has no docstring (a string literal under its field)")
            rows.append(f"| `{field.name}` | {_default(field.default)} | {docs[field.name]} |")
        parts.append("\n".join(rows))
    else:
        parts.append("No options.")
    return "\n\n".join(parts)


def render() -> str:
    """The whole reference, every registered pass in registry order."""
    return "\n\n".join(render_pass(factory()) for factory in all_passes().values())


def replace_reference(doc: str, reference: str) -> str:
    """`doc` with what lies between the markers replaced by `reference`."""
    return replace_between(doc, BEGIN, END, reference)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(argv, __doc__.splitlines()[0], render, replace_reference,
                          "the pass reference differs from the docstrings; run python -m tools.pass_docs --write FILE")


if __name__ == "__main__":
    sys.exit(main())

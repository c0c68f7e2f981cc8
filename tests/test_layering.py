"""The layers only look down: data classes below formats inside `turnip_ir`, and across packages
`turnip_ir` at the floor; `frontend`, `passes` and `runtime` each on it and never on each other;
`turnip` (the Python API) on those four; `turnip_cli` on top of all five; `tools/` (not shipped) may use everything, and nothing shipped uses it.
The folder table of docs/index.md states the same relation; a test here holds it to `BELOW`.

Imports are read from the source (function-level ones included, `if TYPE_CHECKING:` blocks left out),
so an import hidden inside a method counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("turnip_ir", "frontend", "passes", "runtime", "turnip", "turnip_cli", "tools")
SHIPPED = PACKAGES[:-1]
DATA = ("turnip_ir.taskgraph", "turnip_ir.memgraph")
FORMATS = ("turnip_ir.dialect", "turnip_ir.convert", "turnip_ir.io", "turnip_ir.json_taskgraph", "turnip_ir.json_memgraph", "turnip_ir.dot")
BELOW = {
    "turnip_ir": set(),
    "frontend": {"turnip_ir"},
    "passes": {"turnip_ir"},
    "runtime": {"turnip_ir"},
    "turnip": {"turnip_ir", "frontend", "passes", "runtime"},
    "turnip_cli": set(SHIPPED),
    "tools": set(PACKAGES),
}
"""Which packages each package may import: the runtime never imports a pass, a pass never the runtime, and
neither knows the model frontend; the API (`turnip`) sits on all four and under the CLI; nothing shipped imports `tools`."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path) -> set[str]:
    """Every module of the project `path` imports, at any depth of its code."""
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if _is_type_checking(node):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(_from_target(node.module, alias.name) for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _from_target(module: str, name: str) -> str:
    """The module `from module import name` needs: `module.name` when that is a submodule, else `module`."""
    folder = ROOT.joinpath(*module.split("."))
    return f"{module}.{name}" if (folder / f"{name}.py").exists() or (folder / name).is_dir() else module


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports as a list of modules, or None."""
    state: dict[str, int] = {}
    for root in sorted(graph):
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        if root in state:
            continue
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_no_module_imports_itself_through_others() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_data_classes_import_no_format() -> None:
    graph = _graph()
    for data in DATA:
        reached, todo = set(), [data]
        while todo:
            for module in graph[todo.pop()] - reached:
                reached.add(module)
                todo.append(module)
        assert not reached & set(FORMATS), f"{data} reaches {sorted(reached & set(FORMATS))}"


def test_packages_only_look_down() -> None:
    for module, imported in _graph().items():
        package = module.split(".")[0]
        for other in imported:
            target = other.split(".")[0]
            assert target == package or target in BELOW[package], f"{module} imports {other}"


def test_data_classes_load_without_xdsl() -> None:
    """What the runtime needs to read a plan in Python never pulls in xDSL or a reader."""
    names = ", ".join(repr(m) for m in ("xdsl", *FORMATS))
    code = f"import sys, turnip_ir.taskgraph, turnip_ir.memgraph; print([m for m in ({names}) if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"


def test_the_checks_see_a_planted_cycle(tmp_path: Path) -> None:
    """The import reader finds a function-level import, and the cycle finder reports it."""
    planted = tmp_path / "m.py"
    planted.write_text("def load():\n    from turnip_ir.io import load_graph\n")
    assert "turnip_ir.io" in _imports(planted)
    graph = dict(_graph())
    graph["turnip_ir.taskgraph"] = graph["turnip_ir.taskgraph"] | {"turnip_ir.io"}
    assert _cycle(graph) is not None


def _folder_table(text: str) -> dict[str, str]:
    """The rows of docs/index.md's folder table: folder name (without the slash) -> its "may import" cell."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3 and cells[0].endswith("/`"):
            rows[cells[0].strip("`").rstrip("/")] = cells[2]
    return rows


def _table_mismatches(rows: dict[str, str]) -> list[str]:
    """How a folder table differs from PACKAGES and BELOW: packages missing or extra, "may import" cells that differ."""
    packages = {folder for folder in rows if (ROOT / folder / "__init__.py").exists()}
    found = [f"package {name} missing" for name in sorted(set(PACKAGES) - packages)]
    found += [f"package {name} not in PACKAGES" for name in sorted(packages - set(PACKAGES))]
    for package in sorted(packages & set(PACKAGES)):
        cell = rows[package]
        named = set() if cell == "nothing of ours" else {name.strip().strip("`") for name in cell.split(",")}
        if named != BELOW[package] - {package}:
            found.append(f"{package} may import {sorted(named)}, BELOW says {sorted(BELOW[package] - {package})}")
    return found


def test_the_folder_table_of_the_design_overview_is_the_enforced_layering() -> None:
    """docs/index.md names every package of PACKAGES, no other package, and the same "may import" as BELOW."""
    assert _table_mismatches(_folder_table((ROOT / "docs" / "index.md").read_text())) == []


def test_a_folder_table_that_drifted_is_caught() -> None:
    rows = _folder_table((ROOT / "docs" / "index.md").read_text())
    rows["passes"] = "`turnip_ir`, `runtime`"
    del rows["tools"]
    assert _table_mismatches(rows) == ["package tools missing", "passes may import ['runtime', 'turnip_ir'], BELOW says ['turnip_ir']"]

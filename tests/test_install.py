"""The install a new user gets works from the folder above a clone named `turnip` (issue 47, item 17).

`git clone` of a repository named turnip gives a folder `turnip/` holding the package `turnip/turnip/`.
Run from the folder above, the clone is a folder without `__init__.py` in the current directory: a
namespace package, which Python's own path search returns before setuptools' editable import finder
(appended after it) is asked, so `from turnip import Session` failed. The Makefile's editable install
puts the checkout on sys.path instead (`editable_mode=compat`). The test builds the editable wheel the
Makefile's mode gives with setuptools (no pip, no network), installs it into a fresh venv by unpacking
it, and imports from the folder above the clone; the default mode is shown failing beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parent.parent


def _makefile_mode() -> str:
    """The editable mode every `pip install -e` of the Makefile passes."""
    text = (ROOT / "Makefile").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and " -e " in line]
    modes = {re.search(r"editable_mode=(\w+)", line.replace("$(EDITABLE)", _variable(text, "EDITABLE"))) for line in installs}
    assert installs and None not in modes, "every editable install of the Makefile names its mode"
    (mode,) = {found.group(1) for found in modes}
    return mode


def _variable(makefile: str, name: str) -> str:
    found = re.search(rf"^{name}\s*:?=\s*(.*)$", makefile, re.M)
    return found.group(1) if found else ""


def _clone(parent: Path) -> Path:
    """What a clone holds that an install reads (pyproject.toml, README.md, the packages), copied into
    parent/turnip, the folder `git clone` gives."""
    clone = parent / "turnip"
    clone.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, clone / name)
    for package in ("turnip_ir", "frontend", "passes", "runtime", "turnip", "turnip_cli"):
        shutil.copytree(ROOT / package, clone / package, ignore=shutil.ignore_patterns("__pycache__"))
    return clone


def _installed(parent: Path, clone: Path, mode: str | None) -> Path:
    """A fresh venv with the clone installed editable in `mode` (None: setuptools' default); its python.
    The dependencies come from this interpreter's site-packages, as a plain path (its .pth files unread)."""
    wheels = parent / f"wheels-{mode}"
    settings = "None" if mode is None else f"{{'editable_mode': '{mode}'}}"
    subprocess.run([sys.executable, "-c", f"import setuptools.build_meta as b; b.build_editable({str(wheels)!r}, {settings})"],
                   cwd=clone, check=True, capture_output=True, timeout=120)
    venv = parent / f"venv-{mode}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    with zipfile.ZipFile(next(wheels.glob("*.whl"))) as wheel:
        wheel.extractall(site)
    (site / "zz_dependencies.pth").write_text(str(Path(numpy.__file__).parent.parent) + "\n")  # read after the install's .pth
    return venv / "bin" / "python"


def _import_from(folder: Path, python: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    code = "from turnip import Session; import turnip; print(turnip.__file__)"
    return subprocess.run([str(python), "-c", code], cwd=folder, capture_output=True, text=True, env=env, timeout=300)


def test_from_turnip_import_session_works_from_the_folder_above_a_clone_named_turnip(tmp_path):
    mode = _makefile_mode()
    clone = _clone(tmp_path)
    done = _import_from(tmp_path, _installed(tmp_path, clone, mode))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(clone / "turnip" / "__init__.py")
    default = _import_from(tmp_path, _installed(tmp_path, clone, None))  # why the Makefile names a mode
    assert default.returncode != 0 and "cannot import name 'Session' from 'turnip' (unknown location)" in default.stderr

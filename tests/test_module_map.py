"""docs/design.md holds the one map of the modules: it names every one, and the README's table names none that is gone.

Four hand-kept maps (README, docs/design.md, ``beam_jobs/__init__.py``, the package docstrings) once
disagreed; the package docstrings now say what a folder is for and point to docs/design.md, and the
README's table is a summary by folder.
"""

from __future__ import annotations

import os
import re

from tests.conftest import REPO

PACKAGES = ("beam_jobs", "converter", "reader", "record_files", "bench", "examples")


def _modules() -> list[str]:
    found = ["record_schema.py"]
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "results")]
            found += [os.path.relpath(os.path.join(folder, name), REPO) for name in files if name.endswith(".py")]
    return sorted(found)


def _read(name: str) -> str:
    with open(os.path.join(REPO, name), encoding="utf-8") as handle:
        return handle.read()


def test_the_design_notes_name_every_module():
    design = _read("docs/design.md")
    named_folders = {os.path.dirname(path) for path in re.findall(r"`([\w/]+\.py)`", design)} | \
        {path.rstrip("/") for path in re.findall(r"`([\w/]+/)`", design)}
    missing = []
    for path in _modules():
        folder, name = os.path.split(path)
        if f"`{path}`" in design:
            continue
        if name == "__init__.py" and folder in named_folders:
            continue  # a package: its folder's row
        if f"`{name}`" in design and folder in named_folders:
            continue  # named in its folder's row
        missing.append(path)
    assert not missing, f"docs/design.md's module map does not name {missing}"


def test_the_readme_names_only_modules_that_exist():
    modules = set(_modules())
    folders = {os.path.dirname(path) for path in modules}
    readme = _read("README.md")
    table = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    stale = []
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        where = re.match(r"\| `([\w/.]+)`", row).group(1)
        folder = where.rstrip("/") if where.endswith("/") else os.path.dirname(where)
        for name in re.findall(r"`([\w/]+\.py)`", row):
            if not any(path in modules for path in (name, os.path.join(folder, name), os.path.join(folder, os.path.basename(name)))):
                stale.append(name)
        if where.endswith("/") and where.rstrip("/") not in folders:
            stale.append(where)
    assert not stale, f"named but gone: {stale}"

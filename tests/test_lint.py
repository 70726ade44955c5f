"""The code passes ruff (pyflakes and bugbear rules, see ruff.toml)."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.e2e
def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", REPO],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@functools.cache  # 1.5 s of parsing, asked three times; read only
def _imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at the top or inside a function alike)."""
    import ast
    import os

    modules = {}
    for package in ("beam_jobs", "reader", "converter", "bench", "record_files"):
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    modules[module] = path
    graph = {module: set() for module in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    graph[module].add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[module].update(alias.name for alias in node.names)
        # Importing a.b.c runs a/__init__ and a/b/__init__ first: a package's __init__ counts as imported.
        targets = set(graph[module])
        for target in list(targets):
            parts = target.split(".")
            targets.update(".".join(parts[:i]) for i in range(1, len(parts)))
        graph[module] = {target for target in targets if target in modules and target != module
                         and not module.startswith(target + ".")}
    return graph


def test_every_import_arrow_points_one_way():
    """No import circles: a module's dependencies never import it back, even lazily inside a function."""
    graph, state, path, circles = _imports(), {}, [], []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not circles, circles


# beam_jobs' folders from the bottom up: a module imports only from its own layer or those below it.
LAYERS = (("beam_jobs.options", "beam_jobs.stage_records", "beam_jobs.annotations", "beam_jobs.placed_codec", "beam_jobs.masks", "beam_jobs.formats", "beam_jobs.image_headers", "beam_jobs.faults"),
          ("beam_jobs.files",), ("beam_jobs.runtime",), ("beam_jobs.planning",), ("beam_jobs.sources",),
          ("beam_jobs.stages",), ("beam_jobs.transforms",), ("beam_jobs.pipeline",), ("beam_jobs.update",))


def _layer(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in layer):
            return index
    return -1


def test_beam_jobs_folders_import_only_downwards_in_the_data_flow():
    """planning, sources, stages, files, runtime: the listing reads as the flow, and no folder reaches up."""
    upward = [f"{module} -> {target}" for module, targets in _imports().items() if module.startswith("beam_jobs.")
              for target in targets if target.startswith("beam_jobs.") and _layer(target) > _layer(module) >= 0]
    assert not upward, upward
    assert all(_layer(module) >= 0 for module in _imports() if module.startswith("beam_jobs.")
               and module != "beam_jobs"), "a module of beam_jobs outside every layer"

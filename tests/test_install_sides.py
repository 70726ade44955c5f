"""A trainer's install needs no Beam and a converting worker's no TensorFlow (setup.py's ``read`` and ``convert``
extras over the shared core, ``IMGSHARDS_BASE=core``), while ``pip install .`` installs both (the README's set-up).

The lists are read from setup.py as pip would get them; the imports are checked in a fresh process whose
import system refuses the other side's framework, module by module, so a module-level import of Beam in
``reader`` (or of TensorFlow in ``beam_jobs``) fails here by the module's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import apache_beam
import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # subprocesses


def _requirements(base: str | None) -> dict:
    """setup.py's install_requires and extras, with ``IMGSHARDS_BASE`` set to ``base`` (None: unset)."""
    code = ("import json, distutils.core\n"
            "d = distutils.core.run_setup('setup.py', stop_after='init')\n"
            "print(json.dumps({'base': d.install_requires, **d.extras_require}))\n")
    env = {key: value for key, value in os.environ.items() if key != "IMGSHARDS_BASE"}
    if base is not None:
        env["IMGSHARDS_BASE"] = base
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(line).name.lower() for line in requirements}


def test_pip_install_dot_installs_both_sides_and_a_core_base_neither():
    default, core = _requirements(None), _requirements("core")
    assert {"apache-beam", "tensorflow", "keras"} <= _names(default["base"])  # the README's `pip install .`
    assert not {"apache-beam", "tensorflow", "keras"} & _names(core["base"])
    assert "tensorflow" in _names(core["read"]) and "apache-beam" not in _names(core["read"])
    assert "apache-beam" in _names(core["convert"]) and "tensorflow" not in _names(core["convert"])
    assert {"apache-beam", "tensorflow"} <= _names(core["test"])  # `.[test]` brings everything whatever the base


def test_beam_is_pinned_to_the_minor_versions_tested_and_this_one_is_among_them():
    beam = [Requirement(line) for line in _requirements(None)["base"] if line.startswith("apache-beam")]
    (pin,) = beam
    assert any(spec.operator == "<" for spec in pin.specifier), f"{pin}: no upper bound"
    assert pin.specifier.contains(apache_beam.__version__), f"the Beam tested here ({apache_beam.__version__}) " \
                                                            f"is outside setup.py's {pin}"


_IMPORT_ALL = """
import importlib, importlib.abc, pkgutil, sys
blocked = sys.argv[1].split(",")

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not installed on this side")

sys.meta_path.insert(0, Refuse())
failed = []
for package in sys.argv[2:]:
    names = [package]
    module = importlib.import_module(package)
    if hasattr(module, "__path__"):
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")
                  if not info.name.endswith("__main__")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            failed.append(f"{name}: {err}")
print("\\n".join(failed))
"""


@pytest.mark.parametrize("blocked, packages", [
    ("apache_beam", ["record_schema", "record_files", "reader"]),
    ("tensorflow,keras,tf_keras", ["record_schema", "record_files", "beam_jobs", "converter"]),
], ids=["a trainer's reader without Beam", "a converting worker's beam_jobs without TensorFlow"])
def test_each_side_imports_every_module_without_the_other_sides_framework(blocked, packages):
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL, blocked, *packages], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", f"modules that import {blocked} at module import:\n{proc.stdout}"

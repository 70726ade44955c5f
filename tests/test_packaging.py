"""The installed package is the whole package: built as a wheel, installed alone, run outside the checkout.

The tests run from the checkout root, where every module is importable whatever
the wheel holds; a package list kept by hand once left out ``beam_jobs.sources``
and the installed converter could not convert. Here the wheel is built from
the tracked files, checked module by module against the source tree, and
installed into a fresh virtual environment whose only copy of this project is
that wheel. Its dependencies (TensorFlow, Beam...) come from this test
environment through a ``.pth`` file, so the test takes seconds, not an
install of TensorFlow.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

from tests.conftest import REPO, checkout_copy

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

PACKAGES = ("converter", "beam_jobs", "reader", "record_files")
# Run from a clone, never installed: ``import bench`` in every user's environment was a name taken for nothing (#58).
NOT_SHIPPED = ("bench", "tests", "examples")


def _source_modules() -> set[str]:
    """Every Python file of the shipped packages, and the top-level modules, as wheel paths."""
    files = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = [name for name in files.decode().split("\0") if name]
    return {name for name in tracked if name.split("/")[0] in PACKAGES or name == "record_schema.py"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("wheel")
    checkout = checkout_copy(folder / "checkout")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(folder / "dist"), checkout], check=True, capture_output=True, timeout=300)
    (built,) = (folder / "dist").glob("imgshards-*.whl")
    return str(built)


def test_the_wheel_holds_every_module_of_the_source_tree(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = sorted(_source_modules() - names)
    assert not missing, f"the wheel leaves out {missing}"
    shipped = {name.split("/")[0] for name in names}
    assert not shipped & set(NOT_SHIPPED), f"the wheel installs {sorted(shipped & set(NOT_SHIPPED))}"


def test_the_test_extra_brings_every_tool_the_tests_use(wheel):
    """``pip install ".[test]"`` is CI's whole set-up: its extra must carry the servers, engines and formats the
    tests start (a comment once cut the list short, and only a fresh install would have shown it)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(name).decode() for name in archive.namelist() if name.endswith("/METADATA"))
    test_extra = {line.split(":", 1)[1].split(";")[0].strip().split("[")[0].split(">")[0].split("=")[0].lower()
                  for line in metadata.splitlines() if line.startswith("Requires-Dist:") and 'extra == "test"' in line}
    for tool in ("pytest", "hypothesis", "datasets", "moto", "dask", "boto3", "gcp-storage-emulator",
                 "tensorflow-datasets", "pillow-heif", "matplotlib", "scikit-image", "psutil"):
        assert tool in test_extra, f"the test extra lacks {tool}: {sorted(test_extra)}"


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> str:
    """A fresh virtual environment with the wheel installed; returns its python."""
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", wheel],
                   check=True, capture_output=True, timeout=300)
    # Dependencies from this environment, after the venv's own site-packages (so the wheel's copy wins).
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in dict.fromkeys(ours))
    with open(os.path.join(purelib, "zz_test_dependencies.pth"), "w", encoding="utf-8") as handle:
        handle.write(lines)
    return python


def _run(python: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_installed_wheel_converts_verifies_and_reads_outside_the_checkout(installed, tmp_path):
    _run(installed, ["-m", "converter.demo", "shapes", "--per-class", "12"], tmp_path)
    converted = _run(installed, ["-m", "converter", "--src", "shapes", "--shards", "2", "--val-fraction", "0.25"],
                     tmp_path)
    assert "published" in converted.stdout
    verified = _run(installed, ["-m", "converter", "verify", "shapes-tfrecords"], tmp_path)
    assert "ok" in verified.stdout.lower()
    # Every module imports, and from the wheel's copy: none from the checkout; and the reader reads. One process
    # for both (each would import TensorFlow first).
    modules = sorted(name[:-3].replace("/", ".").removesuffix(".__init__") for name in _source_modules())
    read = _run(installed, ["-c", f"import importlib; [print(importlib.import_module(m).__file__) for m in {modules!r}]\n"
                            "import reader; ds = reader.build_dataset('shapes-tfrecords', 'validation', "
                            "batch_size=4, image_size=32, training=False); print(sum(int(x.shape[0]) for x, _ in ds))"],
                tmp_path).stdout.split()
    where = read[:-1]
    assert len(where) == len(modules)
    assert not [path for path in where if path.startswith(REPO + os.sep)]
    assert read[-1] == "9"  # a quarter of 3 x 12

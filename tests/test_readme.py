"""The README and docs/ are executed: the set-up commands (twice), then every code block, as written.

The README's blocks come first, then each page of ``DOCS`` in that order (a
page may use what an earlier block made: the demo dataset, ``demo/...``).

A block that needs what this machine lacks (a cloud project, a cluster, twenty
minutes) is preceded by ``<!-- readme-test: skip: REASON -->``; the reason
names the test that covers it instead. A block whose inputs a user downloads
(ImageNet) is preceded by ``<!-- readme-test: given: NAME -->`` and runs as
written on a miniature of those inputs that the test generates (``GIVEN``).
Everything else runs in a copy of this checkout, where a new user would run it.

The set-up command runs once per test run (twice in a row, checked; the two
test processes share it through a lock file), in a virtual environment of its
own (:func:`readme_venv`), as a user's ``pip install .`` would go into theirs:
it never replaces the environment running the tests (a developer's editable
install of this checkout), yet TensorFlow, Beam and the rest come from that
environment through a ``.pth`` file. Then the blocks run in a few
independent chains (``CHAINS``), side by side: each chain in its own copy of
the checkout as the set-up command left it, its blocks in the pages' order.
A block joins the first chain naming one of its words (what it reads that only
that chain's blocks make), else the last chain. A block that needs what another
chain made fails loudly (a missing file); the fix is a word in ``CHAINS``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import site
import sys
import sysconfig
import venv
from typing import Optional

import pytest

from tests.conftest import REPO, checkout_copy, write_imagenet_tree


def _imagenet(cwd: str, images: dict[str, bytes], s3_server) -> dict[str, str]:
    """The Kaggle ImageNet release's layout: ILSVRC/Data/CLS-LOC/{train,val} and LOC_*.{csv,txt} beside it."""
    root = os.path.join(cwd, "ILSVRC", "Data", "CLS-LOC")
    if not os.path.isdir(root):
        write_imagenet_tree(root, cwd, images)
    return {}


def _imagenet_tars(cwd: str, images: dict[str, bytes], s3_server) -> dict[str, str]:
    """image-net.org's release: imagenet/ILSVRC2012_img_{train,val}.tar (a tar of class tars; flat), labels beside."""
    from tests.archive_data import imagenet_archives

    if not os.path.isdir(os.path.join(cwd, "imagenet")):
        tree = os.path.join(cwd, "imagenet-tree")
        write_imagenet_tree(tree, cwd, images)
        imagenet_archives(tree, os.path.join(cwd, "imagenet"))
    return {}


def _webdataset(cwd: str, images: dict[str, bytes], s3_server) -> dict[str, str]:
    """img2dataset's output: shards/0000N.tar of <key>.jpg + .cls + .json + .txt samples (the demo's shapes)."""
    from tests.archive_data import webdataset_shards

    if not os.path.isdir(os.path.join(cwd, "shards")):
        webdataset_shards(os.path.join(cwd, "demo", "shapes"), os.path.join(cwd, "shards"), shards=2)
    return {}


def _hub(cwd: str, images: dict[str, bytes], s3_server) -> dict[str, str]:
    """What ``huggingface-cli download --repo-type dataset beans --local-dir beans`` leaves: README.md, data/*.parquet."""
    from tests.hub_data import hub_snapshot

    if not os.path.isdir(os.path.join(cwd, "beans")):
        hub_snapshot(os.path.join(cwd, "beans"))
    return {}


def _s3(cwd: str, images: dict[str, bytes], s3_server) -> dict[str, str]:
    """An S3 endpoint with a bucket ``my-bucket``, configured the usual way: AWS environment variables."""
    client = s3_server.client()
    if "my-bucket" not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="my-bucket")
    return s3_server.env


# What a block marked ``<!-- readme-test: given: NAME -->`` needs: NAME -> (cwd, images, s3) -> environment.
GIVEN = {"imagenet": _imagenet, "imagenet-tars": _imagenet_tars, "webdataset": _webdataset, "hub": _hub, "s3": _s3}

# The pages of docs/, in the order their blocks run (after the README's).
DOCS = ("docs/converter.md", "docs/update.md", "docs/format.md", "docs/reader.md", "docs/scaling.md",
        "docs/benchmarks.md", "docs/report.md", "docs/design.md")

SKIP = re.compile(r"<!-- readme-test: skip: (.+?) -->\n$")
GIVEN_MARK = re.compile(r"<!-- readme-test: given: (\S+) -->\n$")
BLOCK = re.compile(r"```(\w*)\n(.*?)\n```", flags=re.S)


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as handle:
        return handle.read()


def _setup_commands(readme: str) -> list[str]:
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)


def readme_blocks(readme: str) -> list[tuple[str, str, str]]:
    """``(language, code, skip reason or "")`` of every fenced block, in order."""
    blocks = []
    for match in BLOCK.finditer(readme):
        before = readme[:match.start()]
        skip = SKIP.search(before[-300:])
        blocks.append((match.group(1), match.group(2), skip.group(1) if skip else ""))
    return blocks


def _given(readme: str, code: str) -> str:
    """The NAME of ``<!-- readme-test: given: NAME -->`` right before the block holding ``code``, or ""."""
    before = readme[:readme.index(f"\n{code}\n```")]
    mark = GIVEN_MARK.search(before[-100:].rsplit("```", 1)[0])
    return mark.group(1) if mark else ""


def test_readme_opens_with_exactly_two_setup_commands_and_ci_runs_the_test_one():
    readme = _read("README.md")
    commands = _setup_commands(readme)[:2]
    install_and_run, test = commands
    assert "pip install ." in install_and_run and "python -m converter " in install_and_run
    assert test == 'pip install ".[test]" && pip install --no-deps "tf-models-official>=2.20" && python -m pytest'
    ci = _read(".ci", "run")
    assert test in ci.splitlines()
    # "Exactly two set-up commands": the block after them is the optional next step, not set-up.
    assert readme.split("## Set up", 1)[1].index(test) < readme.split("## Set up", 1)[1].index("Next:")


def _pages() -> list[tuple[str, str]]:
    """``(name, text)`` of the README and every page of docs/, in the order their blocks run."""
    assert sorted(DOCS) == sorted(f"docs/{name}" for name in os.listdir(os.path.join(REPO, "docs"))
                                  if name.endswith(".md")), "a page of docs/ is missing from DOCS"
    return [(name, _read(*name.split("/"))) for name in ("README.md", *DOCS)]


def test_every_block_is_run_or_skipped_for_a_stated_reason():
    skipped = []
    for _, page in _pages():
        blocks = readme_blocks(page)
        for language, code, reason in blocks:
            assert language in ("bash", "python", "text"), f"block without a known language:\n{code}"
            if reason:
                assert language == "bash" and len(reason) > 20
        skipped += [code for _, code, reason in blocks if reason]
        assert {_given(page, code) for _, code, _ in blocks} <= {"", *GIVEN}
    assert len(skipped) <= 7  # cloud, cluster and hour-long blocks only


def test_the_readme_is_a_manual_of_at_most_500_lines_and_links_every_page_of_docs():
    readme = _read("README.md")
    assert readme.count("\n") <= 500
    for name in DOCS:
        assert f"]({name})" in readme or name == "docs/design.md" and "](docs/design.md)" in readme, name


def readme_venv(env_dir: str) -> str:
    """A virtual environment at ``env_dir`` for the README's commands, as a user's activated one; returns its folder.

    Its own site-packages is empty and comes first: ``pip install .`` installs this project there, and the blocks
    import that copy. After it, this test environment's site-packages, added by a ``.pth`` file as Python adds them
    (``site.addsitedir``: their own ``.pth`` files too), so the dependencies are not installed again (minutes of
    TensorFlow). Not ``--system-site-packages``: that is the base Python's, not a CI virtual environment's. pip
    sees the distributions there as installed, and leaves them alone ("Not uninstalling imgshards at ...,
    outside environment"). Its ``pip`` is this environment's pip run by the venv's python (``python -m pip``,
    as a console script does), which installs into the venv; a pip of its own (ensurepip) costs seconds for the
    same command.
    """
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = os.path.join(env_dir, "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    with open(os.path.join(purelib, "zz_test_environment.pth"), "w", encoding="utf-8") as handle:
        handle.write("".join(f"import site; site.addsitedir({path!r})\n" for path in dict.fromkeys(ours)))
    pip = os.path.join(env_dir, "bin", "pip")
    with open(pip, "w", encoding="utf-8") as handle:
        handle.write('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    os.chmod(pip, 0o755)
    return env_dir


def _run(language: str, code: str, cwd: str, env_dir: str,
         extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """``code`` run as a user runs it in ``cwd``, with the virtual environment ``env_dir`` activated."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(extra_env or {})}
    env.pop("PYTHONPATH", None)  # what the user has: the installed package, run from the checkout
    env.pop("PYTHONHOME", None)
    bin_dir = os.path.join(env_dir, "bin")
    if language == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        argv = [os.path.join(bin_dir, "python"), "-c", code]
    # What `source ENV/bin/activate` sets: `python` and `pip` are the venv's.
    env["VIRTUAL_ENV"] = env_dir
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _shards(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder)) if name.endswith(".tfrecord")}


# The chains of blocks, each run in its own copy of the set-up checkout: (name, words). A block joins the first
# chain whose words it holds (the files only that chain's blocks make or train on), else the last one.
# Six: the two test processes then stay busy to the end (train_classifier.py alone takes as long as a chain), and
# no chain nears pytest's timeout on a loaded machine (the rest, sources with it, once ran 900 s there).
CHAINS = (("objects", ("shapes-coco", "shapes-yolo")),
          ("classifier", ("train_classifier.py",)),
          ("keras", (".fit(", "apply_gradients(")),
          ("folders", ("folders-tfrecords",)),
          ("sources", ("imagenet-tfrecords", "beans-tfrecords", "shards-tfrecords", "s3://my-bucket")),
          ("the-rest", ()))


def _chain_of(code: str) -> str:
    return next(name for name, words in CHAINS if not words or any(word in code for word in words))


def runnable_blocks() -> list[tuple[str, str, str, str]]:
    """``(page, language, code, given)`` of every block the tests run, in the pages' order."""
    commands = _setup_commands(_read("README.md"))[:2]
    return [(name, language, code, _given(page, code)) for name, page in _pages()
            for language, code, reason in readme_blocks(page)
            if language != "text" and not reason and code not in commands]


def test_every_runnable_block_is_in_exactly_one_chain_and_every_chain_runs_some():
    chains = [_chain_of(code) for _, _, code, _ in runnable_blocks()]
    assert len(chains) >= 6
    assert sorted(set(chains)) == sorted(name for name, _ in CHAINS), chains


def _lock(path: str):
    """An exclusive lock on ``path`` (fcntl, released when the file closes): one test process at a time."""
    handle = open(path, "a+")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


@pytest.fixture(scope="session")
def setup_checkout(tmp_path_factory) -> dict:
    """A copy of this checkout after set-up command 1 ran there twice, in the virtual environment :func:`readme_venv`
    made: its folder, the environment's, both runs' results, the shards.

    Made once per test run: the two test processes (pytest-xdist) share it through a lock (two ``pip install .``
    at once would write one environment's site-packages together); a single process keeps it in its own folder.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, record = str(shared / "readme-setup"), str(shared / "readme-setup.json")
    with _lock(str(shared / "readme-setup.lock")):
        if not os.path.exists(record):
            checkout = checkout_copy(folder)
            env_dir = readme_venv(str(shared / "readme-venv"))
            install_and_run = _setup_commands(_read("README.md"))[0]
            dataset = os.path.join(checkout, "demo", "shapes-tfrecords")
            runs = []
            for _ in range(2):  # the second run must succeed too, with the same bytes
                proc = _run("bash", install_and_run, checkout, env_dir)
                runs.append({"returncode": proc.returncode, "output": proc.stdout + proc.stderr,
                             "shards": _shards(dataset) if os.path.isdir(dataset) else {}})
            with open(record + ".tmp", "w") as handle:
                json.dump({"checkout": checkout, "venv": env_dir, "runs": runs}, handle)
            os.rename(record + ".tmp", record)
        with open(record) as handle:
            return json.load(handle)


@pytest.mark.e2e
def test_setup_command_one_runs_twice_with_the_same_bytes(setup_checkout, tmp_path):
    first, second = setup_checkout["runs"]
    assert first["returncode"] == 0, first["output"]
    assert len(first["shards"]) == 10  # 8 train + 2 validation
    assert second["returncode"] == 0, second["output"]
    assert second["shards"] == first["shards"]
    # It installed into its own environment: the blocks import that copy, and the environment running the tests
    # still imports the one it had (a developer's editable install stays theirs).
    where = "import converter; print(converter.__file__)"
    venv_python = os.path.join(setup_checkout["venv"], "bin", "python")
    installed = subprocess.run([venv_python, "-c", where], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert installed.stdout.startswith(setup_checkout["venv"] + os.sep), installed.stdout
    ours = subprocess.run([sys.executable, "-c", where], cwd=tmp_path, capture_output=True, text=True)
    assert not ours.stdout.startswith(setup_checkout["venv"] + os.sep), ours.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("chain", [name for name, _ in CHAINS])
def test_every_readme_block_runs_as_written_after_the_setup_commands(chain, tmp_path, sample_images, request,
                                                                       setup_checkout):
    assert all(run["returncode"] == 0 for run in setup_checkout["runs"]), "set-up command 1 failed (test above)"
    checkout = str(tmp_path / "checkout")
    shutil.copytree(setup_checkout["checkout"], checkout, symlinks=True)
    ran = 0
    for name, language, code, given in runnable_blocks():
        if _chain_of(code) != chain:
            continue
        s3_server = request.getfixturevalue("s3_server") if given == "s3" else None
        extra_env = GIVEN[given](checkout, sample_images, s3_server) if given else {}
        proc = _run(language, code, checkout, setup_checkout["venv"], extra_env)
        assert proc.returncode == 0, (f"{name} block failed:\n{code}\n--- stdout\n{proc.stdout}\n--- stderr\n"
                                      f"{proc.stderr}")
        if "train_classifier.py" in code and "--mirrored" not in code:
            accuracy = float(re.findall(r'"val_accuracy": ([0-9.]+)', proc.stdout)[-1])
            assert accuracy >= 0.9, proc.stdout  # the demo trains to a clearly useful accuracy
        ran += 1
    assert ran >= 1

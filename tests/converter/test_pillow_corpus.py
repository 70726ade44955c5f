"""The converter on Pillow's own collection of odd, broken and exotic images (its sdist's Tests/images).

About 1,060 real files: every format Pillow reads, fuzzer crashers, truncated
and malformed TIFFs, JPEGs and PNGs. No file may crash the run, every file is
accounted for, and two runs on different runners give the same bytes.
The corpus comes from the registry like any dependency (``pip download``,
cached under ``~/.cache/imgshards``); ``IMGSHARDS_PILLOW_IMAGES`` may point at
an unpacked ``Tests/images`` instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import pytest

import record_schema
from record_files.croissant import CROISSANT_FILE

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

PILLOW = "12.3.0"
# Mutated copies of Pillow test images that libtiff decodes to different pixels every time (see its README).
UNSTABLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "unstable-decode")
# Mutated fax TIFFs that decode the same every time but make libtiff report errors.
DECODE_ERRORS = os.path.join(os.path.dirname(UNSTABLE), "decode-errors")


@pytest.fixture(scope="session")
def pillow_images() -> str:
    given = os.environ.get("IMGSHARDS_PILLOW_IMAGES")
    if given:
        return given
    cache = os.path.join(os.path.expanduser("~"), ".cache", "imgshards", f"pillow-{PILLOW}")
    images = os.path.join(cache, f"pillow-{PILLOW}", "Tests", "images")
    os.makedirs(cache, exist_ok=True)
    # Test processes running side by side (pytest-xdist) download and unpack it once, one at a time.
    with open(os.path.join(cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(images):
            _download_pillow_images(cache)
    return images


def _download_pillow_images(cache: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "download", f"pillow=={PILLOW}", "--no-binary", ":all:",
                           "--no-deps", "-d", cache, "-q"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"Pillow's sdist could not be downloaded: {proc.stderr.strip()[-300:]}")
    unpacked = tempfile.mkdtemp(dir=cache)
    with tarfile.open(os.path.join(cache, f"pillow-{PILLOW}.tar.gz")) as archive:
        members = [m for m in archive.getmembers() if "/Tests/images/" in m.name and (m.isfile() or m.isdir())]
        archive.extractall(unpacked, members=members, filter="data")
    shutil.rmtree(os.path.join(cache, f"pillow-{PILLOW}"), ignore_errors=True)  # a half-unpacked earlier attempt
    os.rename(os.path.join(unpacked, f"pillow-{PILLOW}"), os.path.join(cache, f"pillow-{PILLOW}"))
    os.rmdir(unpacked)


def _listed(folder) -> int:
    """The files the converter lists: an archive reads as the folder its extraction gives (the corpus holds
    one, hopper.tar of two images), so it counts as its files."""
    count = 0
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".tar"):
                with tarfile.open(os.path.join(root, name)) as archive:
                    count += sum(1 for member in archive.getmembers() if member.isfile())
            else:
                assert not name.endswith((".zip", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")), name
                count += 1
    return count


def _files(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if name not in (record_schema.MANIFEST_FILE, CROISSANT_FILE)}  # both name the run's OUT


def test_pillows_corpus_converts_with_everything_accounted_for_and_the_same_bytes_every_run(
        tmp_path, pillow_images, converter):
    src = tmp_path / "src"
    shutil.copytree(pillow_images, src / "pillow", symlinks=False)
    shutil.copytree(UNSTABLE, src / "unstable", ignore=shutil.ignore_patterns("*.md"))  # see the test below
    shutil.copytree(DECODE_ERRORS, src / "decode-errors", ignore=shutil.ignore_patterns("*.md"))
    listed = _listed(src)
    outs = []
    for runner in (["--no-progress"], ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]):
        out = tmp_path / f"out{len(outs)}"
        converter("--src", str(src), "--out", str(out), "--shards", "4", "--max-bad-fraction", "1", *runner,
                  check=True, timeout=900)
        outs.append(out)
    manifest = json.loads((outs[0] / record_schema.MANIFEST_FILE).read_text())
    written = manifest["splits"]["train"]["num_examples"]
    assert written + manifest["num_rejected"] + manifest["num_skipped"] == listed
    assert written > 700  # the formats Pillow reads are converted, not refused
    reasons = manifest["rejected_by_reason"]
    assert set(reasons) <= {"not-an-image", "unsupported-format", "undecodable", "too-many-pixels", "zero-sized",
                            "empty-file", "unstable-decode", "decode-errors"}
    # Pillow's own files all decode stably, and libtiff reports errors only for one it cannot decode.
    assert reasons["unstable-decode"] == len(os.listdir(src / "unstable"))
    assert reasons["decode-errors"] == len(os.listdir(src / "decode-errors"))
    assert reasons["unsupported-format"] > 0 and reasons["not-an-image"] > 0
    for format_name in ("ppm", "tga", "ico", "sgi", "psd", "jpeg2000", "dds", "tiff"):
        assert manifest["splits"]["train"]["reencoded_by_reason"].get(format_name, 0) > 0, format_name
    # Same input, same bytes: shards, labels and the rejection report, on two runners.
    assert _files(outs[0]) == _files(outs[1])
    report = (outs[0] / record_schema.REJECTED_FILE).read_text()
    assert " at 0x" not in report
    assert converter("verify", str(outs[0]), timeout=900).returncode == 0


def _original(name: str) -> str:
    """``g4_orientation_5-2-bytes-changed.tif`` -> ``g4_orientation_5.tif``, the Pillow test image it came from."""
    return name.rsplit("-", 3)[0] + ".tif"


def test_files_that_decode_differently_every_time_are_rejected_so_every_run_writes_the_same_bytes(
        tmp_path, pillow_images, converter):
    """Mutated TIFFs that make libtiff read memory they never wrote, beside the Pillow test images they came from.

    Before the guard, every run stored different pixels for them (different shard bytes each run).
    """
    src = tmp_path / "src"
    mutants = sorted(name for name in os.listdir(UNSTABLE) if name.endswith(".tif"))
    for index, name in enumerate(mutants):
        label = "a" if index % 2 else "b"
        os.makedirs(src / label, exist_ok=True)
        shutil.copy(os.path.join(UNSTABLE, name), src / label / name)
        shutil.copy(os.path.join(pillow_images, _original(name)), src / label / _original(name))
    outs = []
    runners = (["--no-progress"], ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"],
               ["--direct_running_mode=multi_processing", "--direct_num_workers=2", "--no-progress"])
    for runner in runners:
        out = tmp_path / f"out{len(outs)}"
        converter("--src", str(src), "--out", str(out), "--shards", "2", "--max-bad-fraction", "1", *runner,
                  check=True)
        outs.append(out)
    assert _files(outs[0]) == _files(outs[1]) == _files(outs[2])
    manifest = json.loads((outs[0] / record_schema.MANIFEST_FILE).read_text())
    assert manifest["rejected_by_reason"] == {"unstable-decode": len(mutants)}
    assert manifest["splits"]["train"]["num_examples"] == len(mutants)  # the originals decode the same every time
    report = [json.loads(line) for line in (outs[0] / record_schema.REJECTED_FILE).read_text().splitlines()]
    assert sorted(os.path.basename(entry["path"]) for entry in report) == mutants

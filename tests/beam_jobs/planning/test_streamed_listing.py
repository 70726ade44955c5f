"""Planning from scratch files: the same plan as in memory, in memory that does not grow with the images."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from beam_jobs.planning import carve, discover
from beam_jobs.planning.discover import list_tree, plan_inputs
from beam_jobs.sources import imagenet, label_file, unlisted
from record_schema import SPLITS
from tests.conftest import REPO


def _same_plan(held, streamed) -> None:
    in_plan_order = sorted(streamed.refs, key=lambda ref: (SPLITS.index(ref.split), ref.relpath))
    assert in_plan_order == list(held.refs) and len(streamed.refs) == len(held.refs)
    assert (streamed.classes, streamed.skipped, streamed.warnings, streamed.split_sizes()) == \
        (held.classes, held.skipped, held.warnings, held.split_sizes())


def _tree(root, files) -> None:
    for relpath in files:
        path = os.path.join(root, *relpath.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(b"x")


@pytest.mark.parametrize("budget", [carve.CARVE_BUDGET, 1, 50])
def test_a_streamed_plan_equals_the_held_one_and_the_carve_is_exact_at_any_budget(tmp_path, monkeypatch, budget):
    """The radix selection of the validation carve finds the same images as sorting each class."""
    monkeypatch.setattr(carve, "CARVE_BUDGET", budget)
    rng = random.Random(budget)
    files = [f"c{c}/{i:04d}.jpg" for c in range(5) for i in range(rng.choice([1, 2, 7, 300, 900]))]
    files += ["stray.jpg", ".hidden/x.jpg", "c0/Thumbs.db", "c1/.DS_Store"]
    _tree(str(tmp_path / "src"), files)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    held = plan_inputs(list_tree(str(tmp_path / "src")), val_fraction=0.15, seed=4)
    streamed = plan_inputs(list_tree(str(tmp_path / "src"), str(scratch)), val_fraction=0.15, seed=4,
                           scratch=str(scratch))
    _same_plan(held, streamed)
    assert held.split_sizes()["validation"] == sum(ref.split == "validation" for ref in held.refs)


def test_streamed_split_folders_imagenet_and_label_files_plan_as_held(tmp_path):
    _tree(str(tmp_path / "splits"), ["train/a/1.jpg", "train/b/2.jpg", "val/a/3.jpg", "test/b/4.jpg", "train/5.jpg"])
    scratch = str(tmp_path)
    _same_plan(plan_inputs(list_tree(str(tmp_path / "splits"))),
               plan_inputs(list_tree(str(tmp_path / "splits"), scratch), scratch=scratch))

    _tree(str(tmp_path / "inet"), ["train/n1/a.JPEG", "train/n2/b.JPEG", "val/v1.JPEG", "val/v2.JPEG"])
    truth = tmp_path / "gt.txt"
    truth.write_text("n2\nn1\n")
    _same_plan(imagenet.plan(str(tmp_path / "inet"), list_tree(str(tmp_path / "inet")), str(truth), None, 0),
               imagenet.plan(str(tmp_path / "inet"), list_tree(str(tmp_path / "inet"), scratch), str(truth), None, 0,
                             scratch=scratch))

    csv = tmp_path / "labels.csv"
    csv.write_text("path,label,split\n" + "".join(f"{i}.jpg,{i % 3},{'test' if i % 4 else ''}\n" for i in range(40)))
    _same_plan(label_file.plan("SRC", str(csv), None, 0.0, 0),
               label_file.plan("SRC", str(csv), None, 0.0, 0, scratch=scratch))


def test_a_path_listed_twice_is_found_by_the_hash_ranges_too(tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"{i}.jpg,a\n" for i in range(500)) + "77.jpg,b\n")
    for scratch in (None, str(tmp_path)):
        with pytest.raises(discover.InputError, match="lists '77.jpg' twice: lines 79 and 502"):
            label_file.plan("SRC", str(csv), None, 0.0, 0, scratch=scratch)


def test_the_files_a_label_file_leaves_out_are_the_same_found_in_memory_or_range_by_range(tmp_path):
    """``unlisted.account``'s comparison of SRC's files with the listed paths: through scratch files (a path a
    line, JSON only for the odd names) it finds what a set finds, in the same order at every run."""
    odd = ['"quoted.jpg', "line\nbreak.jpg", "cr\rreturn.jpg", "nul\0.jpg", "sur\udcff.jpg", "", "\u2028.jpg"]
    listed = [f"images/{i:04d}.jpg" for i in range(3000)] + odd[::2]
    files = listed + [f"extra/{i}.txt" for i in range(200)] + odd[1::2]
    in_memory = list(unlisted.unlisted(files, listed, None))
    ranged = list(unlisted.unlisted(iter(files), iter(listed), str(tmp_path)))
    assert sorted(ranged) == sorted(in_memory) == sorted([f"extra/{i}.txt" for i in range(200)] + odd[1::2])
    assert ranged == list(unlisted.unlisted(iter(files), iter(listed), str(tmp_path)))


_PLAN_A_LABEL_FILE = """
import resource, sys
from beam_jobs.planning import carve
from beam_jobs.sources import label_file
carve.CARVE_BUDGET = int(sys.argv[3])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
plan = label_file.plan("SRC", sys.argv[1], None, 0.1, 0, scratch=sys.argv[2])
count = sum(1 for _ in plan.refs)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
print(count, len(plan.refs), plan.split_sizes()["validation"], grown)
"""

# The bound on the plan's growth of peak RSS: a fixed part and a part a row. Measured (growth, KiB): 12,988 and
# 13,056 at 125,000 rows, 13,088 and 13,160 at 250,000, 13,028 and 13,212 at 500,000 (and 13,040 at 1M rows with
# the default budget): flat in the rows (~12.8 MiB), so the fixed part is that with ~1 MiB to spare. The part a
# row: the million-row test's 40 MiB let a leak of (40 MiB - 13,040 KiB) / 1M = 28.6 bytes a row pass; 24 bytes a
# row and the fixed part's headroom let (14 MiB + 24 B x 250,000 - 13,212 KiB) / 250,000 = 28.6 bytes a row pass.
_FIXED_BYTES = 14 << 20
_BYTES_A_ROW = 24


@pytest.mark.e2e
def test_a_label_file_of_a_quarter_million_rows_is_planned_in_bounded_memory(tmp_path):
    """Held in memory, 250,000 rows cost ~100 MB (~400 bytes a row); streamed through scratch files, ~12.8 MiB of
    peak RSS at 125,000 to 500,000 rows alike, under a fixed part and a part a row (as strict a row as the million
    rows' 40 MB bound was). The carve's candidate budget is cut 16-fold, from 262,144 keys (~26 MB) to 16,384, so
    that it takes the radix pass that a million rows take at the default (below the budget, every train image's
    carve key would be held at once): a million rows cost 3.5x the CPU (28 s) for the same check."""
    rows = 250_000
    csv = tmp_path / "labels.csv"
    with open(csv, "w") as handle:
        handle.write("path,label\n")
        for index in range(rows):
            handle.write(f"images/{index % 1000:03d}/{index:07d}.jpg,class{index % 100}\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run([sys.executable, "-c", _PLAN_A_LABEL_FILE, str(csv), str(scratch), str(1 << 14)], cwd=REPO,
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": REPO})
    count, length, validation, grown_kib = map(int, proc.stdout.split())
    assert count == length == rows and validation == rows // 10
    bound = _FIXED_BYTES + _BYTES_A_ROW * rows
    assert grown_kib * 1024 < bound, \
        f"planning {rows:,} rows grew the peak RSS by {grown_kib:,} KiB (bound {bound >> 10:,} KiB: " \
        f"{_FIXED_BYTES >> 20} MiB and {_BYTES_A_ROW} bytes a row)"

"""The command line in groups (#58 §3): each flag under what it is for, one flag a setting, old spellings kept
for a release with a warning naming the new one, bad values named by flag; and the commands on a converted
dataset parse their arguments before TensorFlow loads (#58 §1), so their ``--help`` works without it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from converter.cli import build_convert_parser
from converter.convert_flags import convert_options, deprecations
from tests.conftest import REPO

GROUPS = {
    "the conversion": ["--src", "--out", "--shards", "--val-fraction", "--seed", "--labels", "--overwrite",
                       "--update", "--rehash"],
    "label files (CSV, TSV, JSON Lines) and COCO JSON": ["--annotations", "--annotation-columns", "--label-separator"],
    "ImageNet as it ships": ["--val-labels", "--synsets"],
    "WebDataset (img2dataset's tars)": ["--label-member"],
    "the Hub's Parquet (Hugging Face datasets)": ["--config", "--image-column", "--label-column", "--bbox-format",
                                                  "--local-paths"],
    "objects (COCO, Pascal VOC, YOLO, CVAT, the Hub's objects)": ["--masks", "--annotation-frame",
                                                                  "--keep-partial-images"],
    "archives (tar, zip: wherever a folder is read)": ["--archive-scan"],
    "image policy": ["--max-side", "--min-side", "--quality", "--max-pixels", "--max-bad-fraction"],
    "duplicates and leaks": ["--near-distance", "--drop-leaks"],
    "Croissant card (croissant.json)": ["--card", "--license", "--citation"],
    "advanced (never change the output)": ["--part-size", "--no-progress", "-v"],
}


def _sections(text: str) -> dict[str, list[str]]:
    """``--help``'s sections (a line ``title:``, then its flags each at the start of a line, two spaces in)."""
    sections, title = {}, None
    for line in text.splitlines():
        if re.fullmatch(r"\S.*:", line):
            title = line[:-1]
            sections[title] = []
        elif title and (flag := re.match(r"  (-[\w-]+)", line)):
            sections[title].append(flag.group(1))
    return sections


def test_help_shows_each_flag_once_in_its_group_in_order_and_the_description_names_every_layout():
    text = build_convert_parser().format_help()
    sections = _sections(text.split("\nOther commands:")[0])  # the epilog's examples are not flags
    assert [title for title in sections if title in GROUPS] == list(GROUPS)
    for title, flags in GROUPS.items():
        assert sections[title] == flags, title
    listed = [flag for flags in sections.values() for flag in flags]
    assert sorted(listed) == sorted([*(f for flags in GROUPS.values() for f in flags), "-h"])  # old ones hidden
    description = text.split("\n\n")[1]
    for layout in ("class folders", "label file", "ImageNet", "WebDataset", "Hugging Face", "COCO", "Pascal VOC",
                   "YOLO", "CVAT", "masks", "tar or zip"):
        assert layout in description, layout


def _parsed(*flags: str):
    return build_convert_parser().parse_args(["--src", "images", "--out", "images-tfrecords", *flags])


@pytest.mark.parametrize("old,new,says", [
    (["--no-near-duplicates"], ["--near-distance", "off"], "use --near-distance off"),
    (["--dali-index"], [], "does nothing"),
])
def test_an_old_spelling_makes_its_new_ones_options_and_a_warning_naming_it(old, new, says):
    assert convert_options(_parsed(*old)) == convert_options(_parsed(*new))
    assert deprecations(_parsed(*new)) == []
    (warning,) = deprecations(_parsed(*old))
    assert warning.startswith(f"{old[0]} is deprecated") and says in warning


def test_near_distance_off_takes_no_hash_and_the_old_spelling_beside_a_distance_is_refused():
    assert convert_options(_parsed("--near-distance", "off")).encode.perceptual_hash is False
    assert convert_options(_parsed("--near-distance", "OFF")) == convert_options(_parsed("--no-near-duplicates"))
    on = convert_options(_parsed("--near-distance", "5"))
    assert (on.near_distance, on.encode.perceptual_hash) == (5, True)
    with pytest.raises(ValueError, match="--no-near-duplicates and --near-distance 5 disagree"):
        convert_options(_parsed("--no-near-duplicates", "--near-distance", "5"))


@pytest.mark.parametrize("flags,message", [
    (["--near-distance", "far"], "argument --near-distance: must be 'auto', 'off' or an integer in 0..12 (bits), "
                                 "got 'far'"),
    (["--near-distance", "13"], "argument --near-distance: must be 'auto', 'off' or an integer in 0..12"),
    (["--shards", "many"], "argument --shards: must be a positive integer or 'auto', got 'many'"),
    (["--annotation-frame", "sideways"], "argument --annotation-frame: invalid choice: 'sideways'"),
])
def test_a_bad_value_is_a_usage_error_naming_the_flag(capsys, flags, message):
    with pytest.raises(SystemExit) as exited:
        _parsed(*flags)
    assert exited.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.e2e
def test_near_distance_off_writes_the_manifest_of_no_near_duplicates_which_still_works_and_warns(converter, tmp_path):
    from converter.demo import write_demo

    src = str(tmp_path / "shapes")
    write_demo(src, per_class=3, seed=2, size_range=(40, 48))
    fast = ("--shards", "1", "--no-progress", "--direct_running_mode=in_memory", "--direct_num_workers=1")
    old = converter("--src", src, "--out", str(tmp_path / "old"), "--no-near-duplicates", *fast, check=True)
    new = converter("--src", src, "--out", str(tmp_path / "new"), "--near-distance", "off", *fast, check=True)
    assert "warning: --no-near-duplicates is deprecated: use --near-distance off" in old.stderr
    assert "deprecated" not in new.stderr
    manifests = []
    for out in ("old", "new"):
        manifest = json.loads((tmp_path / out / "manifest.json").read_text())
        del manifest["created"], manifest["options"]["out"]
        manifests.append(manifest)
    assert manifests[0] == manifests[1]
    assert manifests[1]["duplicates"]["near_threshold"] is None and not manifests[1]["options"]["encode"][
        "perceptual_hash"]


# Each dataset command's --help and a usage error of each, in one interpreter where TensorFlow cannot load.
_WITHOUT_TENSORFLOW = """
import contextlib, io, json, sys

class NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError("tensorflow is not installed here (the test's stand-in for its absence)")

sys.meta_path.insert(0, NoTensorFlow())
from converter.cli import main

seen = {}
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit_:
            status = exit_.code
    seen[" ".join(argv)] = [status, (out.getvalue() + err.getvalue()).split("\\n")[0]]
print(json.dumps({"commands": seen, "loaded": sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "apache_beam"})}))
"""


@pytest.mark.e2e
def test_each_dataset_commands_help_and_usage_errors_come_before_tensorflow_loads():
    commands = ("verify", "inspect", "report", "card", "reindex", "tfds-metadata")
    argvs = [["--help"], *([command, "--help"] for command in commands), *([command] for command in commands),
             ["verify", "OUT", "--sample", "-1"], ["inspect", "OUT", "--per-class", "many"], ["report", "OUT", "--nope"]]
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TENSORFLOW, json.dumps(argvs)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["loaded"] == []  # neither TensorFlow nor Beam
    for argv in argvs:
        status, first_line = result["commands"][" ".join(argv)]
        prog = "python -m converter" + ("" if argv[0] == "--help" else f" {argv[0]}")
        assert (status, first_line.startswith(f"usage: {prog} ")) == (0 if "--help" in argv else 2, True), argv

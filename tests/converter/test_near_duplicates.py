"""Near-duplicates and leakage between splits, end to end: planted copies of real photos found, within and across
splits, in duplicates.jsonl and the manifest; --drop-leaks leaves out exactly the evaluation copies, the same
bytes whatever the part size."""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from tests.photo_data import source_photos
from tests.conftest import read_records, run_converter

pytestmark = pytest.mark.e2e  # runs the converter's command line

ARGS = ("--shards", "2", "--no-progress", "--direct_running_mode=in_memory", "--direct_num_workers=1")


def _jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _resized(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((round(image.width * factor), round(image.height * factor)), Image.Resampling.BILINEAR)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> str:
    """train/validation/test of real photos with planted copies (photo 7 is photo 6's stereo twin: left out)."""
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # encode_image sets it: other tests' limits
    try:
        photos = [_resized(p, 320 / max(p.size)) for p in source_photos()]
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    files = {
        "train/a/p0.jpg": _jpeg(photos[0]), "train/a/p0_small.jpg": _jpeg(_resized(photos[0], 0.6)),
        "train/b/p1.jpg": _jpeg(photos[1]), "validation/b/p1_q50.jpg": _jpeg(photos[1], 50),
        "test/b/p1_small.jpg": _jpeg(_resized(photos[1], 0.75)),
        "train/a/p2.jpg": _jpeg(photos[2]), "test/a/p2.jpg": _jpeg(photos[2]),
        "validation/a/p3.jpg": _jpeg(photos[3]), "test/a/p3_small.jpg": _jpeg(_resized(photos[3], 0.7)),
        "test/b/p4.jpg": _jpeg(photos[4]), "train/b/p5.jpg": _jpeg(photos[5]), "train/a/p6.jpg": _jpeg(photos[6]),
        "validation/b/p8.jpg": _jpeg(photos[8]), "test/a/p9.jpg": _jpeg(photos[9]),
        "train/b/p10.jpg": _jpeg(photos[10]),
    }
    src = tmp_path_factory.mktemp("planted") / "src"
    for relpath, data in files.items():
        os.makedirs(src / os.path.dirname(relpath), exist_ok=True)
        (src / relpath).write_bytes(data)
    return str(src)


# (image, its partner, kind): a byte-identical copy of a training image, and near copies of one. test/a/p3_small.jpg
# stays: it is near a validation image, not a training one (#56 §2: leaks are judged against what was trained on).
LEAKED = [("test", "test/a/p2.jpg", "train/a/p2.jpg"), ("test", "test/b/p1_small.jpg", "train/b/p1.jpg"),
          ("validation", "validation/b/p1_q50.jpg", "train/b/p1.jpg")]


def _lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()]


def _paths(group: dict) -> list[tuple[str, str]]:
    return [(image["split"], image["path"]) for image in group["images"]]


def _filenames(out, split: str) -> set[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {record["image/filename"].decode("utf-8") for shard in manifest["splits"][split]["shards"]
            for record in read_records(str(out / shard["file"]))}


def _digests(out) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in sorted(os.listdir(out))
            if name not in ("manifest.json", "croissant.json")}  # both name the folder they are in


def test_planted_near_duplicates_are_found_within_and_across_splits_with_their_distance(planted, tmp_path):
    out = tmp_path / "out"
    run_converter("--src", planted, "--out", str(out), *ARGS, check=True)
    lines = _lines(out)
    assert [line for line in (out / "duplicates.jsonl").read_text().splitlines()] == \
        sorted((out / "duplicates.jsonl").read_text().splitlines())
    exact = [_paths(g) for g in lines if g["kind"] == "exact"]
    near = {tuple(_paths(g)): g for g in lines if g["kind"] == "near"}
    assert exact == [[("test", "test/a/p2.jpg"), ("train", "train/a/p2.jpg")]]
    assert set(near) == {
        (("train", "train/a/p0.jpg"), ("train", "train/a/p0_small.jpg")),
        (("train", "train/b/p1.jpg"), ("validation", "validation/b/p1_q50.jpg"), ("test", "test/b/p1_small.jpg")),
        (("validation", "validation/a/p3.jpg"), ("test", "test/a/p3_small.jpg")),
    }
    for group in near.values():
        distances = [image["distance"] for image in group["images"]]
        assert distances[0] == 0 and all(0 <= d <= 3 for d in distances[1:])
        assert set(group["images"][0]) == {"split", "label", "path", "distance"}
    # the path is the record's image/filename
    assert {"train/a/p0.jpg", "train/a/p0_small.jpg"} <= _filenames(out, "train")
    duplicates = json.loads((out / "manifest.json").read_text())["duplicates"]
    assert (duplicates["num_cross_split"], duplicates["num_near_groups"], duplicates["num_near_within_split"],
            duplicates["num_near_cross_split"], duplicates["near_threshold"]) == (1, 3, 1, 2, 3)
    # --near-distance auto, as chosen for 15 images, is what the manifest's options record
    assert json.loads((out / "manifest.json").read_text())["options"]["near_distance"] == 3
    assert duplicates["num_dropped"] == 0 and duplicates["dropped_file"] is None and \
        not (out / "dropped.jsonl").exists() and _filenames(out, "test") >= {"test/a/p2.jpg", "test/b/p1_small.jpg"}


def test_drop_leaks_leaves_out_exactly_the_evaluation_copies_and_reruns_give_the_same_bytes(planted, tmp_path):
    outs = []
    for index, extra in enumerate([(), ("--part-size", "2")]):
        out = tmp_path / f"out{index}"
        run_converter("--src", planted, "--out", str(out), "--drop-leaks", *ARGS, *extra, check=True)
        outs.append(out)
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    duplicates = manifest["duplicates"]
    listed = (outs[0] / "dropped.jsonl").read_bytes()
    lines = [json.loads(line) for line in listed.splitlines()]
    assert [(d["split"], d["path"], d["partner"]["path"]) for d in lines] == LEAKED
    assert all(d["partner"]["split"] == "train" and 0 <= d["distance"] <= 3 for d in lines)
    assert lines[0]["distance"] == 0  # the byte-identical copy
    assert (duplicates["num_dropped"], duplicates["dropped_file"], duplicates["dropped_sha256"]) == \
        (3, "dropped.jsonl", hashlib.sha256(listed).hexdigest())
    assert {split: s["num_examples"] for split, s in manifest["splits"].items()} == \
        {"train": 7, "validation": 2, "test": 3}
    assert _filenames(outs[0], "validation") == {"validation/a/p3.jpg", "validation/b/p8.jpg"}
    assert _filenames(outs[0], "test") == {"test/b/p4.jpg", "test/a/p9.jpg", "test/a/p3_small.jpg"}
    assert sum(len(_filenames(outs[0], split)) for split in manifest["splits"]) == 12
    # duplicates.jsonl still shows every group, the dropped copies with them
    assert len(_lines(outs[0])) == 4
    assert _digests(outs[0]) == _digests(outs[1])
    assert json.loads((outs[1] / "manifest.json").read_text())["duplicates"] == duplicates


def test_near_distance_off_keeps_the_exact_search_and_drop_leaks_its_copies(planted, tmp_path):
    out = tmp_path / "out"
    run_converter("--src", planted, "--out", str(out), "--near-distance", "off", "--drop-leaks", *ARGS, check=True)
    assert [g["kind"] for g in _lines(out)] == ["exact"]
    duplicates = json.loads((out / "manifest.json").read_text())["duplicates"]
    assert duplicates["near_threshold"] is None and duplicates["num_near_groups"] == 0
    lines = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert lines == [{"split": "test", "label": "a", "path": "test/a/p2.jpg",
                      "partner": {"split": "train", "label": "a", "path": "train/a/p2.jpg"}, "distance": 0}]
    assert "test/a/p2.jpg" not in _filenames(out, "test")


def test_other_objects_photographed_on_one_background_form_no_group_even_at_a_wide_distance(tmp_path):
    """#56 §1: ten photos of other objects laid on one patterned cloth hash 6-14 bits apart, so at 10 bits the
    bands pair many of them; the thumbnail check turns every such pair down: no group, nothing dropped."""
    from tests.beam_jobs.stages.test_perceptual_hash import _scene

    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        photos = [_resized(p, 320 / max(p.size)) for index, p in enumerate(source_photos()) if index != 7]
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    rng = np.random.default_rng(5)
    checks = np.kron(rng.integers(0, 2, (25, 33)), np.ones((16, 16)))[:384, :512] * 90 + 80
    cloth = Image.fromarray((checks + rng.normal(0, 12, checks.shape)).clip(0, 255).astype(np.uint8)).convert("RGB")
    src = tmp_path / "src"
    for index, photo in enumerate(photos):
        split = ("train", "validation", "test")[index % 3]
        os.makedirs(src / split / "shoe", exist_ok=True)
        (src / split / "shoe" / f"item{index}.jpg").write_bytes(_jpeg(_scene(photo, cloth, index)))
    out = tmp_path / "out"
    run_converter("--src", str(src), "--out", str(out), "--near-distance", "10", "--drop-leaks", *ARGS, check=True)
    duplicates = json.loads((out / "manifest.json").read_text())["duplicates"]
    assert (duplicates["num_near_groups"], duplicates["num_dropped"]) == (0, 0)
    assert (out / "duplicates.jsonl").read_text() == ""


def test_a_near_distance_out_of_range_is_refused_naming_the_flag(planted, tmp_path):
    proc = run_converter("--src", planted, "--out", str(tmp_path / "out"), "--near-distance", "40", *ARGS)
    assert proc.returncode != 0 and "--near-distance" in proc.stderr

"""Pascal VOC as it ships: split lists, 1-based inclusive boxes, the OD API's class ids, difficult kept."""

from __future__ import annotations

import json

import numpy as np

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.object_data import object_records, jpeg, picture, red_fraction, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _xml(width, height, objects) -> str:
    parts = [f"<annotation><filename>x.jpg</filename><size><width>{width}</width><height>{height}</height>"
             "<depth>3</depth></size>"]
    for name, (x0, y0, x1, y1), difficult in objects:
        parts.append(f"<object><name>{name}</name><pose>Left</pose><truncated>0</truncated>"
                     f"<difficult>{difficult}</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
                     f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>")
    return "".join(parts) + "</annotation>"


def test_voc_converts_with_its_split_lists_and_the_od_apis_ids(tmp_path):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    # Pixels 10..29 and 50..69 (0-based) are red: VOC writes them 1-based, inclusive: 11..30 and 51..70.
    write_file(str(root / "JPEGImages/2008_000001.jpg"), jpeg(picture(80, 48, [(10, 5, 30, 20), (50, 30, 70, 44)])))
    write_file(str(root / "Annotations/2008_000001.xml"),
               _xml(80, 48, [("dog", (11, 6, 30, 20), 0), ("person", (51, 31, 70, 44), 1), ("cat", (9, 1, 5, 5), 0)]))
    write_file(str(root / "JPEGImages/2008_000002.jpg"), jpeg(picture(40, 40, [(0, 0, 40, 40)], seed=2)))
    write_file(str(root / "Annotations/2008_000002.xml"), _xml(40, 40, [("cat", (1, 1, 40, 40), 0)]))
    write_file(str(root / "JPEGImages/2008_000003.jpg"), jpeg(picture(40, 40, [], seed=3)))
    write_file(str(root / "Annotations/2008_000003.xml"), "<annotation><object>")  # cut short
    write_file(str(root / "JPEGImages/2008_000009.jpg"), jpeg(picture(40, 40, [], seed=9)))  # in no list
    write_file(str(root / "ImageSets/Main/train.txt"), "2008_000001\n2008_000003\n")
    write_file(str(root / "ImageSets/Main/val.txt"), "2008_000002\n")
    write_file(str(root / "ImageSets/Main/trainval.txt"), "2008_000001\n2008_000002\n2008_000003\n")
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(tmp_path / "VOCdevkit"), out=str(out), shards=1, max_bad_fraction=0.5), FAST,
        show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"][1] == "aeroplane" and manifest["classes"][12] == "dog"  # pascal_label_map.pbtxt
    assert {s: v["num_examples"] for s, v in manifest["splits"].items()} == {"train": 1, "validation": 1}
    records = object_records(out)
    first = records["VOC2012/JPEGImages/2008_000001.jpg"]
    assert first["image/object/class/label"] == [12, 15] and first["image/object/difficult"] == [0, 1]
    assert np.allclose(first["boxes"], [(10 / 80, 5 / 48, 30 / 80, 20 / 48), (50 / 80, 30 / 48, 70 / 80, 44 / 48)])
    for box in first["boxes"]:
        assert red_fraction(first["pixels"], box) > 0.9
    assert np.allclose(records["VOC2012/JPEGImages/2008_000002.jpg"]["boxes"], [(0, 0, 1, 1)])  # the whole image
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert {(r["path"], r["reason"], r.get("annotation")) for r in rejected} == {
        ("VOC2012/JPEGImages/2008_000001.jpg", "box-empty", "VOC2012/JPEGImages/2008_000001.jpg object 3"),
        ("VOC2012/JPEGImages/2008_000003.jpg", "bad-annotation", None)}
    assert manifest["skipped_by_reason"]["not-in-split-lists"] == 1

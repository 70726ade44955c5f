"""One rule for objects that cannot be written (issue #57 §3), whatever the source.

An object with an extent that cannot be written (an unknown class, a box past the image's edge, a bad mask) rejects
its image, naming the object: written without it, the object would train as background. ``--keep-partial-images``
writes the image without it (the behaviour before). An object without an extent (a box of zero width or height)
drops out of its image and is counted, as Model Garden's and Detectron2's loaders drop them.
"""

from __future__ import annotations

import json

from beam_jobs import annotations, placed_codec
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from beam_jobs.stage_records import Accepted, ImageRef, RejectedInput
from beam_jobs.stages.validate import validate_ref
from converter.cli import build_convert_parser
from tests.object_data import jpeg, object_records, picture, write_coco, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _ref(tmp_path, *boxes: annotations.Box) -> ImageRef:
    write_file(str(tmp_path / "a.jpg"), jpeg(picture(40, 30, [(4, 4, 20, 20)])))
    objects = annotations.Objects("1", tuple(boxes), (40, 30), False)
    return ImageRef("train", "a.jpg", 0, "", annotations.encode(objects))


GOOD = annotations.Box("a.json annotation 1", 1, 4, 4, 20, 20)
OUTSIDE = annotations.Box("a.json annotation 2", 1, 30, 20, 60, 29)  # 20 px past the right edge
FLAT = annotations.Box("a.json annotation 3", 1, 5, 5, 5, 15)  # zero width


def test_an_object_past_the_edge_rejects_its_image_naming_it_and_keep_partial_images_writes_it_without(tmp_path):
    ref = _ref(tmp_path, GOOD, OUTSIDE)
    rejected = validate_ref(str(tmp_path), ref, EncodeOptions())
    assert isinstance(rejected, RejectedInput) and rejected.reason == annotations.BOX_OUTSIDE
    assert rejected.detail.startswith("a.json annotation 2: box x 30..60") and "--keep-partial-images" in rejected.detail
    accepted, _, _ = validate_ref(str(tmp_path), ref, EncodeOptions(keep_partial_images=True))
    placed = placed_codec.decode_placed(accepted.ref.annotation)  # packed for the writer
    assert [box.name for box in placed.boxes] == ["a.json annotation 1"]
    assert [(name, reason) for name, reason, _ in placed.rejected] == [("a.json annotation 2", annotations.BOX_OUTSIDE)]


def test_a_box_without_an_extent_drops_out_and_its_image_is_written(tmp_path):
    result = validate_ref(str(tmp_path), _ref(tmp_path, GOOD, FLAT), EncodeOptions())
    assert isinstance(result[0], Accepted)
    placed = placed_codec.decode_placed(result[0].ref.annotation)
    assert [box.name for box in placed.boxes] == ["a.json annotation 1"]
    assert [(name, reason) for name, reason, _ in placed.rejected] == [("a.json annotation 3", annotations.BOX_EMPTY)]


def test_a_source_refused_object_rejects_its_image_and_several_are_counted_in_its_detail(tmp_path):
    objects = annotations.Objects("1", (GOOD,), (40, 30), False, (
        ("a.xml object 2", annotations.UNKNOWN_CLASS, "'Dog' is not a VOC class: did you mean 'dog'?"),
        ("a.xml object 3", annotations.UNKNOWN_CLASS, "'dogs' is not a VOC class: did you mean 'dog'?")))
    write_file(str(tmp_path / "a.jpg"), jpeg(picture(40, 30, [])))
    rejected = validate_ref(str(tmp_path), ImageRef("train", "a.jpg", 0, "", annotations.encode(objects)),
                            EncodeOptions())
    assert rejected.reason == annotations.UNKNOWN_CLASS
    assert rejected.detail.startswith("a.xml object 2: 'Dog' is not a VOC class: did you mean 'dog'? (and 1 more object)")


def test_a_coco_run_rejects_the_image_of_an_unknown_category_and_counts_a_flat_box(tmp_path):
    root = tmp_path / "coco"
    files = {f"{i}.jpg": jpeg(picture(40, 30, [(4, 4, 20, 20)], seed=i)) for i in (1, 2, 3)}
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 40, "height": 30} for i in (1, 2, 3)]
    anns = [{"id": 11, "image_id": 1, "category_id": 1, "bbox": [4, 4, 16, 16], "area": 256, "iscrowd": 0},
            {"id": 12, "image_id": 1, "category_id": 9, "bbox": [4, 4, 16, 16], "area": 256, "iscrowd": 0},  # unknown
            {"id": 21, "image_id": 2, "category_id": 1, "bbox": [4, 4, 16, 16], "area": 256, "iscrowd": 0},
            {"id": 22, "image_id": 2, "category_id": 1, "bbox": [4, 4, 0, 16], "area": 0, "iscrowd": 0},  # flat
            {"id": 31, "image_id": 3, "category_id": 1, "bbox": [4, 4, 16, 16], "area": 256, "iscrowd": 0}]
    write_coco(str(root), "train2017", images, anns, [{"id": 1, "name": "cat"}], files)
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(root), out=str(out), shards=1, max_bad_fraction=0.5), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] == 2 and manifest["splits"]["train"]["num_objects"] == 2
    assert manifest["rejected_by_reason"] == {"unknown-class": 1}
    assert manifest["rejected_objects_by_reason"] == {"box-empty": 1}
    assert sorted(object_records(out)) == ["train2017/2.jpg", "train2017/3.jpg"]
    lines = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    image = next(line for line in lines if "annotation" not in line)
    assert image["path"] == "train2017/1.jpg" and image["detail"].startswith("instances_train2017.json annotation 12: ")


def test_keep_partial_images_is_a_flag_of_convert():
    args, _ = build_convert_parser().parse_known_args(["--src", "a", "--out", "b", "--keep-partial-images"])
    assert args.keep_partial_images is True
    assert build_convert_parser().parse_known_args(["--src", "a", "--out", "b"])[0].keep_partial_images is False

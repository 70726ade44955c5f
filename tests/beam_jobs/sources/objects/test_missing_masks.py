"""An image without its mask (images/ beside masks/) is skipped and named, not only counted (issue #57 §5)."""

from __future__ import annotations

import json

from beam_jobs import sources
from beam_jobs.options import ConvertOptions
from tests.object_data import class_mask_png, jpeg, picture, write_file


def test_an_image_without_its_mask_and_a_mask_without_its_image_are_named(tmp_path):
    src = tmp_path / "seg"
    write_file(str(src / "images/a.jpg"), jpeg(picture(32, 24, [(4, 4, 20, 12)], seed=1)))
    write_file(str(src / "masks/a.png"), class_mask_png(32, 24, (4, 4, 20, 12), 1))
    write_file(str(src / "images/b.jpg"), jpeg(picture(32, 24, [], seed=2)))  # its mask is missing
    write_file(str(src / "masks/z.png"), class_mask_png(32, 24, (0, 0, 4, 4), 1))  # no image
    write_file(str(tmp_path / "labels.txt"), "background\nroad\n")
    plan = sources.plan_inputs(ConvertOptions(src=str(src), out=str(tmp_path / "ds"),
                                              labels_file=str(tmp_path / "labels.txt")))
    assert plan.skipped == {"no-mask": 1, "mask-without-image": 1}
    named = [json.loads(line) for line in plan.skipped_files.lines()]
    assert named == [{"path": "images/b.jpg", "reason": "no-mask", "detail": "no mask masks/b.png beside it"},
                     {"path": "masks/z.png", "reason": "mask-without-image",
                      "detail": "no image images/z.<ext> beside it"}]
    assert "1 image has no mask in masks/: skipped (images/b.jpg; each in skipped.jsonl)" in plan.warnings

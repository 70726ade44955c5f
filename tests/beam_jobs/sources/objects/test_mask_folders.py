"""Semantic masks beside their images (images/ and masks/ of the same stems): class ids on the image's pixels."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from reader.tools.verify import verify
from tests.object_data import class_mask_png, jpeg, jpeg_as_stored, object_records, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_masks_beside_images_convert_with_their_class_ids_on_the_pixels_exif_turned_too(tmp_path):
    src = tmp_path / "seg"
    box = (8, 8, 40, 24)
    write_file(str(src / "images/training/a.jpg"), jpeg(picture(80, 48, [box], seed=1)))
    write_file(str(src / "annotations/training/a.png"), class_mask_png(80, 48, box, 2))
    # Stored turned (EXIF 6): its mask is drawn on the stored pixels, as the file's pixels are.
    write_file(str(src / "images/validation/b.jpg"), jpeg_as_stored(picture(80, 48, [box], seed=2), 6))
    write_file(str(src / "annotations/validation/b.png"), class_mask_png(80, 48, box, 1))
    write_file(str(src / "images/training/c.jpg"), jpeg(picture(16, 16, [], seed=3)))  # no mask: skipped
    write_file(str(tmp_path / "labels.txt"), "background\nroad\ncar\n")
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(src), out=str(out), shards=1, labels_file=str(tmp_path / "labels.txt")), FAST,
        show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "segmentation" and manifest["classes"] == ["background", "road", "car"]
    assert manifest["skipped_by_reason"]["no-mask"] == 1
    records = object_records(out)
    for name, class_id in (("images/training/a.jpg", 2), ("images/validation/b.jpg", 1)):
        record = records[name]
        ids = np.asarray(Image.open(io.BytesIO(record["image/segmentation/class/encoded"][0])))
        assert ids.shape == record["pixels"].shape[:2]
        reddish = record["pixels"][..., 0].astype(int) - record["pixels"][..., 1].astype(int) > 40
        assert reddish[ids == class_id].mean() > 0.9 and (ids == class_id).sum() > 100, name
    assert records["images/validation/b.jpg"]["pixels"].shape[:2] == (80, 48)  # upright
    assert verify(str(out)).ok


def test_masks_without_labels_is_an_error_naming_the_flag(tmp_path):
    write_file(str(tmp_path / "seg/images/a.jpg"), jpeg(picture(8, 8, [])))
    write_file(str(tmp_path / "seg/masks/a.png"), class_mask_png(8, 8, (0, 0, 2, 2), 1))
    with pytest.raises(InputError, match="--labels"):
        run(ConvertOptions(src=str(tmp_path / "seg"), out=str(tmp_path / "ds")), FAST, show_progress=False)

"""--masks on a COCO JSON whose segmentations are broken: each costs only its object (``bad-mask``), never the run.

A polygon of strings, an RLE with negative counts, an RLE of another image's size (once stretched silently) or of
65535x65535 (4 GB in a worker) used to end the run at the write stage, with nothing published.
"""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from tests.object_data import jpeg, object_records, picture, write_coco

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_broken_segmentations_are_each_rejected_by_name_and_the_others_written(tmp_path):
    root = tmp_path / "coco"
    files = {"a.jpg": jpeg(picture(80, 48, [(10, 5, 30, 20)]))}
    images = [{"id": 1, "file_name": "a.jpg", "width": 80, "height": 48}]
    box = [10, 5, 20, 15]
    good = [[10, 5, 30, 5, 30, 20, 10, 20]]
    broken = {
        2: [["10", "5", "30", "5", "30", "20"]],  # a polygon of strings
        3: {"size": [48, 80], "counts": [-5, 3845]},  # negative counts
        4: {"size": [2000, 3000], "counts": [6_000_000]},  # another image's size: would be stretched onto this one
        5: {"size": [48, 80], "counts": "0`"},  # a compressed RLE cut short
        6: {"size": [65535, 65535], "counts": [65535 * 65535]},  # 4 GB
    }
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": box, "area": 300, "iscrowd": 0, "segmentation": good}]
    anns += [{"id": i, "image_id": 1, "category_id": 1, "bbox": box, "area": 300, "iscrowd": int(isinstance(seg, dict)),
              "segmentation": seg} for i, seg in broken.items()]
    write_coco(str(root), "val2017", images, anns, [{"id": 1, "name": "thing"}], files)
    out = tmp_path / "ds"
    # The image keeps its good object beside the broken ones (--keep-partial-images; by default it is rejected).
    run(ConvertOptions(src=str(root), out=str(out), shards=1, masks=True, max_bad_fraction=0.9,
                       encode=EncodeOptions(keep_partial_images=True)), FAST, show_progress=False)
    record = object_records(out)["val2017/a.jpg"]
    [mask] = record["image/object/mask"]
    pixels = np.asarray(Image.open(io.BytesIO(mask)))
    assert pixels.shape == (48, 80) and pixels[5:20, 10:30].all() and pixels.sum() == 20 * 15
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["annotation"], r["reason"]) for r in rejected) == [
        (f"instances_val2017.json annotation {i}", "bad-mask") for i in sorted(broken)]
    details = {r["annotation"].rsplit(" ", 1)[1]: r["detail"] for r in rejected}
    assert "not a finite number" in details["2"] and "non-negative" in details["3"]
    assert "[2000, 3000]" in details["4"] and "80x48" in details["4"]
    assert "cut short" in details["5"] and "[65535, 65535]" in details["6"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rejected_objects_by_reason"] == {"bad-mask": 5}

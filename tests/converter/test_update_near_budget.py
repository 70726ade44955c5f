"""``--update`` (issue #59): ``--max-bad-fraction`` judges the update's conversion over the version it writes.

The fraction is of the version's objects (kept records' and converted ones', and the rejected ones: the new
images' and those rejected before from the images the version keeps), as a conversion of the whole of SRC would
count them, not of the update's few images: one bad object among three new images of a 40-object dataset passes
a 0.05 budget (it failed it: 1 of 5), and the rejection stays in the next version's report. One COCO export,
its conversion and two updates, in this process on the in-memory runner.
"""

from __future__ import annotations

import json
import os

import pytest

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline.budgets import TooManyRejectedError
from record_files import versions
from tests.converter.test_update import FAST
from tests.converter.test_update_objects import W, _export, _write_coco


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, shards=1, max_bad_fraction=0.05,
                          encode=EncodeOptions(keep_partial_images=True))


def _images(count: int, first: int = 1) -> dict:
    return {f"img{i}.jpg": [(4, 4, 20, 18, "cat"), (24, 20, 44, 36, "dog")] for i in range(first, first + count)}


@pytest.mark.slow
def test_an_updates_rejected_objects_are_judged_over_the_versions_objects(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    images = _images(20)  # 40 objects
    _export(src, _write_coco, images, ["cat", "dog"], new=images)
    conversion.run(_options(src, out), FAST, show_progress=False)

    # Three new images, one with a box past the right edge: 1 bad object of 46 (2.2%), not 1 of 6.
    new = _images(3, first=21)
    new["img21.jpg"] = new["img21.jpg"] + [(30, 10, W + 20, 30, "dog")]
    images.update(new)
    _export(src, _write_coco, images, ["cat", "dog"], new=new)
    assert update.run(_options(src, out), FAST).version == 2
    report = [json.loads(line) for line in open(os.path.join(out, versions.in_version(2, "rejected.jsonl")))]
    assert [item["path"] for item in report] == ["train/img21.jpg"] and "annotation" in report[0]

    # Two more such images: 3 bad objects of 53 (5.7%), the version's, with the kept one: refused.
    more = {name: boxes + [(30, 10, W + 20, 30, "dog")] for name, boxes in _images(2, first=24).items()}
    images.update(more)
    _export(src, _write_coco, images, ["cat", "dog"], new=more)
    with pytest.raises(TooManyRejectedError, match=r"3 of 53 objects"):
        update.run(_options(src, out), FAST)

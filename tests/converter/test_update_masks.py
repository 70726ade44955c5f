"""``--update`` of images with masks of their own files (issue #59): a semantic mask PNG (a mask folder's, VOC's
SegmentationClass/) is a file whose bytes no annotation digest holds, so its stamp (size, modification time) is
folded into its image's (beam_jobs/sources/source_stamps.py): a changed mask makes its image changed. (COCO's
polygons and RLEs, and VOC's instance masks read at planning, are in the annotation digest already.)

The rule of tests/converter/test_update.py: after masks and images are added, changed and deleted, the latest
version holds exactly SRC; every unchanged image keeps its split and shard file; nothing changed writes no
version; the updated version holds what a fresh conversion of the new SRC holds, record by record. SRC is
``images/`` beside ``masks/``, converted once for the module.
"""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

import record_schema
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from reader.info import dataset_info
from tests.converter.test_update import FAST
from tests.object_data import class_mask_png
from tests.update_data import version_features

W, H = 24, 20


def _photo(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(H, W, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _write(src: str, name: str, seed: int, box=(2, 2, 12, 10), class_id: int = 1) -> None:
    for folder, data in (("images", _photo(seed)), ("masks", class_mask_png(W, H, box, class_id))):
        os.makedirs(os.path.join(src, folder), exist_ok=True)
        with open(os.path.join(src, folder, f"{name}.{'jpg' if folder == 'images' else 'png'}"), "wb") as handle:
            handle.write(data)


_LABELS: list[str] = []  # the module's labels.txt (--labels is an option an update keeps: one path for all)


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=2, labels_file=_LABELS[0])


def _records(out: str) -> dict[str, tuple[str, str, bytes, bytes]]:
    """path -> (split, shard file relative to OUT, image bytes, the mask's pixels) of the latest version."""
    return {path: (split, shard, feature[record_schema.IMAGE_ENCODED].bytes_list.value[0],
                   np.asarray(Image.open(io.BytesIO(
                       feature[record_schema.SEGMENTATION_ENCODED].bytes_list.value[0]))).tobytes())
            for path, split, shard, feature in version_features(out)}


def _check(src: str, out: str, before: dict, changed: set[str]) -> dict:
    """The latest version holds exactly SRC's images, each with its mask's pixels now; each unchanged one keeps its
    split and shard file (unless that shard was compacted)."""
    now = _records(out)
    images = sorted(os.listdir(os.path.join(src, "images")))
    assert sorted(now) == [f"images/{name}" for name in images]
    for name in images:
        with open(os.path.join(src, "masks", name[:-4] + ".png"), "rb") as handle:
            assert now[f"images/{name}"][3] == np.asarray(Image.open(handle)).tobytes(), name
    info = dataset_info(out)
    files = {os.path.relpath(shard.path, out) for split in info.splits.values() for shard in split.shards}
    for path, (split, shard, _, _) in before.items():
        if path in now and path not in changed:
            assert now[path][0] == split, path
            assert now[path][1] == shard or shard not in files, path
    return now


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[str, dict]:
    """``(root holding src, labels.txt and out, records)``: six images beside their masks, converted once."""
    root = str(tmp_path_factory.mktemp("masks"))
    with open(os.path.join(root, "labels.txt"), "w", encoding="utf-8") as handle:
        handle.write("background\nshape\nother\n")
    _LABELS[:] = [os.path.join(root, "labels.txt")]
    for i in range(6):
        _write(os.path.join(root, "src"), f"m{i}", i)
    conversion.run(_options(os.path.join(root, "src"), os.path.join(root, "out")), FAST, show_progress=False)
    return root, _check(os.path.join(root, "src"), os.path.join(root, "out"), {}, set())


@pytest.mark.slow
def test_a_changed_mask_png_changes_its_image_and_masks_update_as_files_do(converted, tmp_path):
    root, first = converted
    shutil.copytree(os.path.join(root, "src"), tmp_path / "src", copy_function=shutil.copy2)  # stamps kept
    shutil.copytree(os.path.join(root, "out"), tmp_path / "out")
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    assert update.run(_options(src, out), FAST).version is None  # nothing changed

    # m1's mask redrawn (its image untouched), m6 added with its mask, m2 deleted with its mask.
    with open(os.path.join(src, "masks", "m1.png"), "wb") as handle:
        handle.write(class_mask_png(W, H, (4, 4, 20, 16), 2))
    _write(src, "m6", 6)
    for folder, name in (("images", "m2.jpg"), ("masks", "m2.png")):
        os.remove(os.path.join(src, folder, name))
    done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["added"], done.changes["changed"], done.changes["deleted"]) == (2, 1, 1, 1)
    _check(src, out, first, {"images/m1.jpg"})

    assert update.run(_options(src, out), FAST).version is None
    # --rehash reads image and mask bytes: the rows an update wrote hold their hash and are unchanged; version 1's
    # hold none (a conversion records no source hash), so its 4 images left are converted again, once, in place.
    done = update.run(_options(src, out), FAST, rehash=True)
    assert (done.version, done.changes["changed"], done.changes["added"]) == (3, 4, 0)
    assert update.run(_options(src, out), FAST, rehash=True).version is None

    fresh = str(tmp_path / "fresh")
    conversion.run(_options(src, fresh), FAST, show_progress=False)
    assert {p: r[2:] for p, r in _records(out).items()} == {p: r[2:] for p, r in _records(fresh).items()}


def test_a_voc_class_png_is_part_of_its_images_stamp_and_a_mask_that_appears_changes_it(tmp_path):
    """VOC with ``--masks``: SegmentationClass/<id>.png is a file of its own beside the image (its instance masks are
    read at planning, into the annotation digest): its stamp is folded into the image's, so a redrawn class PNG,
    or one that appears for an image rejected without it, changes the image's stamp. Planning only: no conversion."""
    from beam_jobs.sources import plan_inputs
    from beam_jobs.sources.source_stamps import for_plan
    from tests.object_data import jpeg, picture, voc_palette_png, voc_xml, write_file

    root = tmp_path / "VOC2012"
    for image_id in ("a", "b"):
        write_file(str(root / f"JPEGImages/{image_id}.jpg"), jpeg(picture(40, 24, [], seed=len(image_id))))
        write_file(str(root / f"Annotations/{image_id}.xml"), voc_xml(40, 24, [("dog", (5, 5, 20, 20), 0)]))
    write_file(str(root / "SegmentationClass/a.png"), voc_palette_png(40, 24, [((5, 5, 20, 20), 12)]))
    write_file(str(root / "ImageSets/Segmentation/train.txt"), "a\nb\n")
    options = ConvertOptions(src=str(root), masks=True)

    def stamps() -> dict[str, tuple[int, int]]:
        plan = plan_inputs(options)
        items = for_plan(options, plan)
        return {ref.relpath: items.stamp(ref) for ref in plan.refs}

    first = stamps()
    assert first == stamps()  # the same files: the same stamps
    image = os.stat(root / "JPEGImages/a.jpg")
    assert first["JPEGImages/a.jpg"][0] == image.st_size and first["JPEGImages/a.jpg"][1] != image.st_mtime_ns
    os.utime(root / "SegmentationClass/a.png", ns=(1_600_000_000 * 10**9,) * 2)  # the class PNG touched
    write_file(str(root / "SegmentationClass/b.png"), voc_palette_png(40, 24, [((5, 5, 20, 20), 12)]))
    second = stamps()
    assert second["JPEGImages/a.jpg"] != first["JPEGImages/a.jpg"]
    assert second["JPEGImages/b.jpg"] != first["JPEGImages/b.jpg"]  # rejected without its mask before

"""Annotations read as they ship at scale: a COCO JSON in one pass whatever its order, from a zip as a stream,
and YOLO's label files read in parallel to the plan a sequential read makes.

Plans only (no conversion): each test compares what the plan holds, refs with their encoded objects.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import zipfile

import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from beam_jobs.sources.archives import archive_members, archives, zip_members
from beam_jobs.sources.objects import annotated_plan, coco
from beam_jobs.sources.archives.archive_members import ArchiveError
from tests.archive_data import zip_folder
from tests.object_data import write_file

CATEGORIES = [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]


def _coco_lists(images: int = 40) -> tuple[list, list]:
    """Images, and three annotations an image with the faults a file holds: an unknown category, a bad bbox,
    an orphan, a second entry for one file."""
    entries = [{"id": i, "file_name": f"{i:06d}.jpg", "width": 64, "height": 48} for i in range(1, images + 1)]
    entries.append({"id": 99999, "file_name": "000001.jpg", "width": 64, "height": 48})  # refused: file of id 1
    anns = [{"id": 100 * i + k, "image_id": i, "category_id": (1, 18, 7)[k] if i % 5 else 18,
             "bbox": [k, k, 10, 12] if i % 7 else [k, 1, 2], "area": 5.0, "iscrowd": k == 1}
            for i in range(1, images + 1) for k in range(3)]
    anns += [{"id": 5, "image_id": 4242, "category_id": 1, "bbox": [1, 1, 2, 2]},  # an orphan
             {"id": 6, "image_id": 99999, "category_id": 1, "bbox": [1, 1, 2, 2]}]  # of the refused entry
    return entries, anns


def _write_coco(root, keys_in_order: list[str], images: list, anns: list) -> None:
    lists = {"images": images, "annotations": anns, "categories": CATEGORIES}
    body = ", ".join(f'"{key}": {json.dumps(lists[key])}' for key in keys_in_order)
    write_file(str(root / "annotations" / "instances_val2017.json"), "{" + body + "}")
    write_file(str(root / "val2017" / "000001.jpg"), b"")  # planning reads no image


def _planned(plan, src: str = "") -> tuple:
    """What a plan says, whatever holds the files (locators differ between a folder and a zip), SRC's name
    left out of its warnings."""
    return (plan.classes, tuple(w.replace(src, "SRC") for w in plan.warnings), plan.split_counts, plan.listed_objects,
            [(ref.split, ref.relpath, ref.annotation) for ref in plan.refs])


def test_a_coco_file_plans_the_same_whatever_the_order_of_its_lists_and_entries(tmp_path):
    """COCO's own files put categories last; an annotation may come before its image's entry."""
    images, anns = _coco_lists()
    _write_coco(tmp_path / "usual", ["images", "annotations", "categories"], images, anns)
    _write_coco(tmp_path / "odd", ["categories", "annotations", "images"], images, anns)
    mixed = anns[:30] + images[:20] + anns[30:] + images[20:]  # half the annotations before their images
    _write_coco(tmp_path / "mixed", ["annotations", "images", "categories"], [], [])
    write_file(str(tmp_path / "mixed" / "annotations" / "instances_val2017.json"), json.dumps(
        {"annotations": [a for a in mixed if "image_id" in a], "images": [i for i in mixed if "file_name" in i],
         "categories": CATEGORIES}))
    usual = _planned(plan_inputs(ConvertOptions(src=str(tmp_path / "usual"), out="o")), str(tmp_path / "usual"))
    for name in ("odd", "mixed"):
        other = _planned(plan_inputs(ConvertOptions(src=str(tmp_path / name), out="o")), str(tmp_path / name))
        assert other[:4] == usual[:4], name
        assert sorted(other[4]) == sorted(usual[4]), name  # the same images, each with the same objects
    warnings = "\n".join(usual[1])
    assert "image id 99999 names the file of image id 1: refused, with its 1 annotations" in warnings
    assert "1 annotations name an image id that its \"images\" do not list" in warnings and "ids 5)" in warnings
    rejected = [line for ref in plan_inputs(ConvertOptions(src=str(tmp_path / "odd"), out="o")).refs
                for line in json.loads(ref.annotation)[5]]
    assert ["instances_val2017.json annotation 702", "unknown-class",
            "category_id 7 is not in the file's categories"] in rejected
    assert ["instances_val2017.json annotation 700", "bad-annotation",
            "bbox [0, 1, 2] is not [x, y, width, height]"] in rejected


class _CountingReader(archives.LauncherReader):
    """The launcher's reader, counting what the plan asks of it and each read of the streams it gives."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.opened, self.whole, self.reads = [], [], []

    def __call__(self, path, source):
        self.whole.append(path)
        return super().__call__(path, source)

    def open(self, path, source):
        self.opened.append(path)
        stream, reads = super().open(path, source), self.reads

        class Counted:
            def read(self, size=-1):
                data = stream.read(size)
                reads.append(len(data))
                return data

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

        return Counted()


def test_a_coco_file_in_a_zip_is_opened_once_and_read_as_a_stream_to_the_plan_of_its_folder(tmp_path):
    images, anns = _coco_lists(images=1500)  # a JSON of ~300 KB: many of ijson's reads
    _write_coco(tmp_path / "tree", ["images", "annotations", "categories"], images, anns)
    packed = zip_folder(str(tmp_path / "tree"), tmp_path / "coco.zip")
    found = archives.list_tree(packed)
    options = ConvertOptions(src=packed, out=str(tmp_path / "o"))
    with _CountingReader(packed, found.inflated) as read:
        zipped = coco.plan(options, found.listing, read, None)
    size = (tmp_path / "tree" / "annotations" / "instances_val2017.json").stat().st_size
    assert read.opened == ["annotations/instances_val2017.json"] and read.whole == []  # one pass, streamed
    assert sum(read.reads) == size and max(read.reads) < size // 4  # consumed a piece at a time
    folder = plan_inputs(ConvertOptions(src=str(tmp_path / "tree"), out=str(tmp_path / "o")))
    assert _planned(zipped, packed) == _planned(folder, str(tmp_path / "tree"))


def test_a_member_stream_that_does_not_inflate_is_an_error_naming_the_file(tmp_path):
    _write_coco(tmp_path / "tree", ["images", "annotations", "categories"], *_coco_lists(images=200))
    packed = zip_folder(str(tmp_path / "tree"), tmp_path / "coco.zip")
    with zipfile.ZipFile(packed) as archive:
        info = archive.getinfo("annotations/instances_val2017.json")
    data = bytearray((tmp_path / "coco.zip").read_bytes())
    middle = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    data[middle:middle + 64] = bytes(64)  # the deflated JSON, corrupt halfway
    (tmp_path / "coco.zip").write_bytes(bytes(data))
    with pytest.raises(InputError, match="instances_val2017.json"):
        plan_inputs(ConvertOptions(src=packed, out=str(tmp_path / "o")))


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_member_stream_gives_its_bytes_a_piece_at_a_time_and_refuses_a_wrong_length(tmp_path, method):
    data = json.dumps([{"id": i, "text": "x" * (i % 50)} for i in range(3000)]).encode()
    with zipfile.ZipFile(tmp_path / "a.zip", "w", method) as archive:
        archive.writestr("a.json", data)
    with open(tmp_path / "a.zip", "rb") as handle:
        member = next(iter(zip_members.scan_zip(handle)))
        stream = archive_members.MemberStream(handle, member, chunk=4096)
        pieces = list(iter(lambda: stream.read(1000), b""))
        assert b"".join(pieces) == data and max(map(len, pieces)) <= 1000
        claims_more = dataclasses.replace(member, length=member.length + 1, size=member.size)
        with pytest.raises(ArchiveError, match="a.json: inflates to"):
            archive_members.open_member(handle, claims_more).read()


def _yolo_tree(root, images: int) -> None:
    write_file(str(root / "data.yaml"), "train: images/train\nval: images/val\nnames: [a, b, c]\n")
    rng = random.Random(3)
    for i in range(images):
        split = "val" if i % 4 == 0 else "train"
        write_file(str(root / f"images/{split}/{i:04d}.jpg"), b"")  # planning does not read images
        if i % 9:
            lines = [f"{rng.randrange(4)} {rng.random():.4f} {rng.random():.4f} 0.1 0.2" for _ in range(i % 6)]
            write_file(str(root / f"labels/{split}/{i:04d}.txt"), "\n".join(lines + ["bad line"] * (i % 11 == 0)))


def test_yolo_label_files_read_in_parallel_plan_as_read_one_at_a_time(tmp_path, monkeypatch):
    _yolo_tree(tmp_path / "yolo", 300)
    options = ConvertOptions(src=str(tmp_path / "yolo"), out=str(tmp_path / "o"))
    parallel = _planned(plan_inputs(options))
    monkeypatch.setattr(annotated_plan, "READERS", 1)
    assert _planned(plan_inputs(options)) == parallel
    assert sum(parallel[3].values()) > 300  # objects were read


def test_reads_in_order_come_back_in_order_however_long_each_takes():
    def read(path, source):
        time.sleep(random.random() / 500)
        return path.encode()

    wanted = [(f"{i}.txt", "") if i % 3 else None for i in range(200)]
    got = list(annotated_plan.read_in_order(read, wanted, threads=8))
    assert got == [None if item is None else item[0].encode() for item in wanted]

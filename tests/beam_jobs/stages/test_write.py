"""The shard writer copies a re-encoded image's spilled bytes: no second read of the source, no second encode."""

from __future__ import annotations

import hashlib

from beam_jobs.options import EncodeOptions
from beam_jobs.stage_records import Accepted, ImageRef
from beam_jobs.stages.validate import validate_chunk
from beam_jobs.stages.write import write_shard
from tests.conftest import read_records


def test_reencoded_images_are_written_from_the_spill_without_reading_the_source_again(tmp_path, sample_images):
    src, work, out = tmp_path / "src", tmp_path / "work", tmp_path / "out"
    for folder in (src / "a", work, out):
        folder.mkdir(parents=True)
    (src / "a" / "p.png").write_bytes(sample_images["png_rgb"])
    (src / "a" / "j.jpg").write_bytes(sample_images["jpeg_rgb"])
    refs = [ImageRef("train", "a/j.jpg", 0), ImageRef("train", "a/p.png", 0)]
    results = validate_chunk(str(src), refs, EncodeOptions(), str(work), chunk=7)
    assert all(isinstance(r, Accepted) for r in results)
    passthrough, png = results
    assert passthrough.spill == () and png.spill[:2] == (7, 0)
    (src / "a" / "p.png").unlink()  # the writer must not need the source of a re-encoded image
    result = write_shard(str(src), str(out), "train", 0, 1, results, ["a"], EncodeOptions(), work=str(work))
    rows = read_records(str(out / result.file))
    assert [r["image/filename"] for r in rows] == [b"a/j.jpg", b"a/p.png"]
    spilled = (work / "spill-000000000007.jpeg-bytes").read_bytes()
    assert rows[1]["image/encoded"] == spilled and hashlib.sha256(spilled).hexdigest().encode() == rows[1]["image/key/sha256"]
    assert rows[0]["image/encoded"] == sample_images["jpeg_rgb"]

"""Record indexes (always written; ``--dali-index`` is deprecated, with a warning): the index files NVIDIA DALI's TFRecord reader needs, checked against DALI itself.

DALI's own ``tfrecord2idx`` (installed with the ``nvidia-dali`` wheel) must
write the same bytes, and a DALI pipeline on the CPU must read every record
through our index files, in order.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sys

import pytest

import record_schema
from tests.conftest import read_records

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

dali = pytest.importorskip("nvidia.dali", reason="the dali extra is not installed: pip install '.[dali]'")

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


@pytest.fixture(scope="module")
def indexed(demo_src, tmp_path_factory):
    from tests.conftest import run_converter

    out = tmp_path_factory.mktemp("dali") / "out"
    proc = run_converter("--src", demo_src, "--out", str(out), "--shards", "3", "--val-fraction", "0.2",
                         "--dali-index", *FAST, check=True)
    assert "warning: --dali-index is deprecated and does nothing" in proc.stderr
    return out


def _shards(out):
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    return [shard for split in manifest["splits"].values() for shard in split["shards"]]


def test_index_files_are_the_bytes_dalis_tfrecord2idx_writes_and_verify_checks_them(indexed, tmp_path, converter):
    tool = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
    shards = _shards(indexed)
    assert len(shards) == 4 and all(s["dali_index"] == s["file"] + ".idx" for s in shards)
    # DALI's tool on one shard, run by this interpreter as its own would run it (its first act is to import
    # TensorFlow: seconds of CPU in a new process, loaded here already); verify checks every index against its
    # shard's records the same way.
    argv = sys.argv
    sys.argv = [tool, str(indexed / shards[0]["file"]), str(tmp_path / "ref.idx")]
    try:
        runpy.run_path(tool, run_name="__main__")
    finally:
        sys.argv = argv
    assert (indexed / shards[0]["dali_index"]).read_bytes() == (tmp_path / "ref.idx").read_bytes()
    assert converter("verify", str(indexed), check=True).returncode == 0
    damaged = tmp_path / "damaged"
    shutil.copytree(indexed, damaged)
    victim = damaged / shards[0]["dali_index"]
    victim.write_text(victim.read_text().replace("\n", "\n", 1).replace(" ", "  ", 1))
    proc = converter("verify", str(damaged))
    assert proc.returncode == 1 and f"{shards[0]['dali_index']}: record index does not match" in proc.stdout


def test_dali_reads_every_record_in_order_through_our_index_files(indexed):
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali import tfrecord as tfrec

    shards = [s for s in _shards(indexed) if s["file"].startswith("train-")]
    total = sum(s["num_examples"] for s in shards)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)  # CPU only: no GPU here
    def pipe():
        inputs = fn.readers.tfrecord(
            path=[str(indexed / s["file"]) for s in shards], index_path=[str(indexed / s["dali_index"]) for s in shards],
            features={record_schema.FILENAME: tfrec.FixedLenFeature((), tfrec.string, ""),
                      record_schema.LABEL: tfrec.FixedLenFeature([1], tfrec.int64, -1),
                      record_schema.IMAGE_ENCODED: tfrec.FixedLenFeature((), tfrec.string, "")},
            random_shuffle=False, name="Reader")
        images = fn.decoders.image(inputs[record_schema.IMAGE_ENCODED], device="cpu")
        return inputs[record_schema.FILENAME], inputs[record_schema.LABEL], images

    pipeline = pipe()
    pipeline.build()
    got = []
    for _ in range(total):
        names, labels, images = pipeline.run()
        assert images.at(0).shape[-1] == 3  # and DALI decodes the stored JPEG
        got.append((bytes(names.at(0)).decode(), int(labels.as_array()[0][0])))
    expected = [(row[record_schema.FILENAME].decode(), row[record_schema.LABEL])
                for shard in shards for row in read_records(str(indexed / shard["file"]))]
    assert got == expected

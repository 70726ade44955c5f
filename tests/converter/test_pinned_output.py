"""The bytes the converter writes, pinned: shards, labels.txt and the reports of a shipped input.

The input (``tests/data/pinned/src``) is shipped, not generated, and every image
in it is a clean JPEG stored byte for byte, so these hashes depend on nothing
but the converter: the order (keyed hash of seed and path), the validation
carve, the cut into shards, the record serialization, the record indexes and the report's format.
Not on Pillow's encoder, which a library upgrade may change. The records tables (``*.records.parquet``) are
pinned by their rows and footer figures, not their bytes: the Parquet footer names the pyarrow that wrote it
(every run of one install writes the same bytes: tests/converter/test_resume.py compares them). The input also
has a content duplicate under two labels, an empty file, a text file named
``.jpg``, a system file, grayscale JPEGs and a non-ASCII class name (every
rejection's detail is the converter's own wording, not a library's).

Any redesign of how the conversion is computed (parts, buckets, runners) must
leave these hashes as they are: "same input and options, same bytes", whatever
the part size (which sets how many parts, key buckets and hash ranges the work
is cut into: one part of everything, or one image per part).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil

import pytest

import record_schema
from record_files import versions
from record_files.records_table import RecordsTable
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

SRC = os.path.join(REPO, "tests", "data", "pinned", "src")
ARGS = ["--shards", "3", "--val-fraction", "0.25", "--seed", "7", "--max-bad-fraction", "0.1", "--no-progress"]

# sha256 of each file the conversion writes (manifest.json holds times and paths, so it is not pinned here).
PINNED = {
    "croissant.json": "cf68d9f476659e16ebb7e8c66a245b58c9010f52e6283c1a1c560268bd525579",  # the card (#48), same every run
    "duplicates.jsonl": "e1f5b665f2033d4dbef9e87a0e7e43af708d6a987cca3b9b8fbe9a8ada93cbba",  # lines {"kind", "images"} since #48
    "labels.txt": "ce09cc9a875f311dac7683caff6c9e1979dac0fea02c6adf9f074a4bea7ebfaa",
    "rejected.jsonl": "3cd90d5cf45eac720ff492af8cd8b6f82bbdc853596756f94c58156c7d07b958",
    "skipped.jsonl": "19f0c1135ec85d9b1a7d8520db656c204ff32da7e4a9c17e9fca2e9e56e4ecf1",  # the system file (#57)
    "train-00000-of-00003.tfrecord": "b582f70c9e8c99a7b6f36ecb6d9b722980140a9d94333e4206e31c376a3c5da3",
    "train-00000-of-00003.tfrecord.idx": "38fa44961dae3567c3e52424e4ab6d9b9afa794877830945336a94cf86d3ff0c",
    "train-00001-of-00003.tfrecord": "22acd2eea0f12e8f9de986cf1d58d363bad0464831b12a72e04a5154703ebd90",
    "train-00001-of-00003.tfrecord.idx": "f42adc6c5e90d2a87a386ea1d376af928f3c88984c0c21966853acac7e8fcb78",
    "train-00002-of-00003.tfrecord": "8999a96754a10171970e1052a19911fceafb0018d897d5bacbfde45c56c60b38",
    "train-00002-of-00003.tfrecord.idx": "a7c3ca30d1fe08941f30ab6ac1c9d27b98296f6dd414a22d1604d65e7ab1e691",
    "validation-00000-of-00001.tfrecord": "4d400d51668977df4c58fb632601fefd2a29697354a4e4aa2f85315a6c640172",
    "validation-00000-of-00001.tfrecord.idx": "5cab17007c1780c2d7b2f8aa10a0b58498b478bae9320ae8c0bc78655009e90d",
}


# sha256 of each records table's rows and footer figures (_table_digest), since issue #56.
PINNED_TABLES = {
    "train.records.parquet": "f8dd778dd23a948cab6e153a94ec888c0722a01061d7c11c187b57f7cfd60928",
    "validation.records.parquet": "a4bf624ee191513042c0ebdd4478b3558ffdf0c9bca33751a62fcd6cabf71a22",
}


# sha256 of version 1's sources table's rows but their mtime_ns (#59: the checkout's times; each stamped row's must
# be its file's, checked apart). Its bytes hold the times, so they are not pinned.
PINNED_SOURCES = "11c2390c103ea3f7c2408ca4467e37e88b3596248eb8ddaf17e9c3b8a8dd1f65"


def _digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))
            if name not in ("manifest.json", versions.SOURCES_TABLE)
            and not name.endswith(record_schema.RECORDS_TABLE_SUFFIX)}


def _sources_digest(out, src) -> str:
    """Version 1's sources rows, hashed without their mtime_ns, once each stamped row's is checked its file's."""
    rows = list(versions.iter_sources(str(out / versions.SOURCES_TABLE)))
    for row in rows:
        if row.stamped:
            assert row.mtime_ns == os.stat(src / row.path).st_mtime_ns, row.path
    kept = [dataclasses.replace(row, mtime_ns=0) for row in rows]
    return hashlib.sha256(json.dumps([dataclasses.astuple(row) for row in kept]).encode()).hexdigest()


def _table_digest(path) -> str:
    """A records table's rows (hashes as hex) and its footer's figures, as sorted JSON, hashed."""
    table = RecordsTable(str(path))
    rows = [{**row, "sha256": row["sha256"].hex()} for group in table.row_groups() for row in group.to_pylist()]
    figures = table.stats("").to_json()
    return hashlib.sha256(json.dumps([rows, figures], sort_keys=True).encode()).hexdigest()


IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.mark.parametrize("runner", [[], IN_MEMORY, [*IN_MEMORY, "--part-size", "1"], ["--part-size", "4"]],
                         ids=["multi-process", "in-memory", "in-memory-one-image-parts", "multi-process-parts-of-4"])
def test_the_converter_writes_exactly_the_pinned_bytes(tmp_path, converter, runner):
    src = tmp_path / "src"
    shutil.copytree(SRC, src)
    out = tmp_path / "out"
    proc = converter("--src", str(src), "--out", str(out), *ARGS, *runner, check=True)
    assert "rejected: 2" in proc.stdout
    assert _digests(out) == PINNED
    tables = {name: _table_digest(out / name) for name in sorted(os.listdir(out))
              if name.endswith(record_schema.RECORDS_TABLE_SUFFIX)}
    assert tables == PINNED_TABLES
    assert _sources_digest(out, src) == PINNED_SOURCES

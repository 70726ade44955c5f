"""``python -m converter tfds-metadata OUT``: TensorFlow Datasets reads our output with its own loader."""

from __future__ import annotations

import shutil

import pytest

import reader
import record_schema
from tests.conftest import read_records

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

tfds = pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed: pip install '.[tfds]'")


def test_tfds_builder_from_directory_reads_every_record_after_one_command(demo_dataset, demo_src, tmp_path, converter):
    out = tmp_path / "ds"
    shutil.copytree(demo_dataset, out)
    proc = converter("tfds-metadata", str(out), check=True)
    assert "tfds.builder_from_directory" in proc.stdout
    builder = tfds.builder_from_directory(str(out))
    info = reader.dataset_info(str(out))
    assert builder.info.features["image"]["class"]["label"].names == list(info.classes)
    for split in info.splits.values():
        assert builder.info.splits[split.name].num_examples == split.num_examples
        got = [(example["image"]["filename"].numpy().decode(), int(example["image"]["class"]["label"]),
                tuple(example["image"]["encoded"].shape))
               for example in builder.as_dataset(split=split.name, shuffle_files=False,
                                                 read_config=tfds.ReadConfig(interleave_cycle_length=1))]
        expected = [(row[record_schema.FILENAME].decode(), row[record_schema.LABEL],
                     (row[record_schema.HEIGHT], row[record_schema.WIDTH], 3))
                    for shard in split.shards for row in read_records(shard.path)]
        assert got == expected
    assert converter("verify", str(out), check=True).returncode == 0  # the extra files are not a problem

    # The metadata belongs to these shards: a reconversion replaces the dataset without them.
    converter("--src", demo_src, "--out", str(out), "--shards", "2", "--overwrite", "--no-progress",
              "--direct_running_mode=in_memory", "--direct_num_workers=1", check=True)
    assert not any((out / name).exists() for name in record_schema.TFDS_METADATA_FILES)


def test_without_a_dataset_it_is_an_error_naming_the_folder(tmp_path, converter):
    proc = converter("tfds-metadata", str(tmp_path / "nothing"))
    assert proc.returncode == 1 and str(tmp_path / "nothing") in proc.stderr

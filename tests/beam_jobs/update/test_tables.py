"""beam_jobs.update.tables counts a record the version no longer reads from its bytes, read as protobuf's wire
format without TensorFlow: the figures must be the report's scan's, number for number, for every kind of record
(objects with boxes, crowd and difficult flags, none, multi-label ids, a grayscale image, a negative id)."""

from __future__ import annotations

import pytest
import tensorflow as tf

import record_schema
from beam_jobs.update import tables
from reader.tools.report_stats import SplitStats


def _example(ints: dict, floats: dict) -> bytes:
    feature = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=value)) for key, value in ints.items()}
    feature.update({key: tf.train.Feature(float_list=tf.train.FloatList(value=value)) for key, value in floats.items()})
    feature[record_schema.IMAGE_ENCODED] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\xff" * 3000]))
    feature[record_schema.IMAGE_FORMAT] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"jpeg"]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


RECORDS = [
    (record_schema.TASK_OBJECTS, {record_schema.WIDTH: [640], record_schema.HEIGHT: [480], record_schema.CHANNELS: [3],
                                  record_schema.OBJECT_LABEL: [1, 7, 1], record_schema.OBJECT_IS_CROWD: [0, 1, 0],
                                  record_schema.OBJECT_DIFFICULT: [1, 0, 0]},
     {record_schema.BBOX_XMIN: [0.0, 0.1, 0.5], record_schema.BBOX_YMIN: [0.0, 0.2, 0.25],
      record_schema.BBOX_XMAX: [0.05, 0.9, 0.75], record_schema.BBOX_YMAX: [0.01, 0.8, 1.0]}),
    (record_schema.TASK_OBJECTS, {record_schema.WIDTH: [33], record_schema.HEIGHT: [7000], record_schema.CHANNELS: [1],
                                  record_schema.OBJECT_LABEL: []}, {}),
    (record_schema.TASK_MULTILABEL, {record_schema.WIDTH: [20], record_schema.HEIGHT: [24], record_schema.CHANNELS: [3],
                                     record_schema.LABEL: [0, 5, 300]}, {}),
    (record_schema.TASK_CLASSIFICATION, {record_schema.WIDTH: [20], record_schema.HEIGHT: [24],
                                         record_schema.CHANNELS: [1], record_schema.LABEL: [-1]}, {}),
]


@pytest.mark.parametrize("task, ints, floats", RECORDS, ids=["objects", "no-objects", "multi-label", "negative-id"])
def test_a_removed_records_figures_are_the_scans(task, ints, floats):
    data = _example(ints, floats)
    scanned, counted = SplitStats("train"), SplitStats("train")
    scanned.add(tf.train.Example.FromString(data).features.feature, task)
    tables._count(counted, tables._features(data), task)
    assert counted.to_json() == scanned.to_json()
    assert tables._features(data)[record_schema.IMAGE_ENCODED] == [3000]  # its length: the bytes not copied


@pytest.mark.e2e  # a process whose imports refuse pandas
def test_a_reused_shards_rows_are_renumbered_without_pandas_which_a_plain_install_lacks():
    """``pip install .`` brings pyarrow, not pandas: an update that masked or moved records crashed composing its
    records table (``DataType.to_pandas_dtype`` imports pandas), after its pipeline had run. Only the test extras
    install pandas, so the suite never saw it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys\n"
            "class Refuse:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'pandas':\n"
            "            raise ImportError('pandas refused: a plain install has none')\n"
            "sys.meta_path.insert(0, Refuse())\n"
            "import numpy as np, pyarrow as pa\n"
            "from beam_jobs.update import tables\n"
            "from record_files import records_table\n"
            "columns = {f.name: pa.nulls(2, f.type) for f in records_table.SCHEMA}\n"
            "columns['shard'] = pa.array([0, 0], pa.uint32())\n"
            "group = pa.table(columns, schema=records_table.SCHEMA)\n"
            "moved = tables._with(group, shard=np.full(2, 7))\n"
            "assert moved.column('shard').to_pylist() == [7, 7] and moved.schema == records_table.SCHEMA\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]

"""The records table's format: rows round-trip, row groups never span shards, joins are deterministic, the footer's
figures are the parts' summed, and a file that is not a table of this version is refused by name."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import record_schema
from record_files import records_table
from record_files.record_stats import ObjectValues, SplitStats


def _row(shard: int, index: int) -> dict:
    return {"shard": shard, "index": index, "offset": index * 1000, "classes": [index % 3] * (index % 4),
            "width": 100 + index, "height": 50 + shard, "image_bytes": 2000 + index,
            "sha256": bytes([shard, index % 256]) * 16, "perceptual_hash": None if index % 5 == 0 else 2 ** 63 + index,
            "path": f"cat/ü{shard}-{index}.jpg"}


def _part(shard: int, count: int) -> tuple[bytes, SplitStats]:
    handle, stats = io.BytesIO(), SplitStats("train")
    writer = records_table.TableWriter(handle, shard)
    for index in range(count):
        row = _row(shard, index)
        writer.add(*(row[name] for name in records_table.COLUMNS[1:]))
        stats.add_image(row["width"], row["height"], row["image_bytes"], b"jpeg", 3, record_schema.TASK_OBJECTS,
                        objects=ObjectValues(row["classes"], [1] * len(row["classes"]), [0] * len(row["classes"]),
                                             [0.1] * len(row["classes"]), [0.2] * len(row["classes"]),
                                             [0.5] * len(row["classes"]), [0.9] * len(row["classes"])))
    written = writer.close("train", stats)
    assert written.num_rows == count and written.num_bytes == len(handle.getvalue())
    return handle.getvalue(), stats


SIZES = (records_table.ROW_GROUP + 3, 0, 7)


@pytest.fixture(scope="module")
def parts():
    return [_part(shard, count) for shard, count in enumerate(SIZES)]


@pytest.fixture(scope="module")
def joined(parts) -> tuple[bytes, records_table.TableFile]:
    out = io.BytesIO()
    written = records_table.join_tables([io.BytesIO(data) for data, _ in parts], out, "train")
    return out.getvalue(), written


@pytest.mark.slow
def test_rows_read_back_in_record_order_and_any_parquet_reader_reads_them(joined):
    data, written = joined
    expected = [_row(shard, index) for shard, count in enumerate(SIZES) for index in range(count)]
    assert written.num_rows == len(expected)
    table = records_table.RecordsTable(io.BytesIO(data))
    assert table.num_rows == len(expected)
    assert [row for group in table.row_groups() for row in group.to_pylist()] == expected
    assert pq.read_table(io.BytesIO(data)).to_pylist() == expected  # plain pyarrow, no code of ours


def test_row_groups_are_at_most_a_row_group_and_never_hold_two_shards(joined):
    table = records_table.RecordsTable(io.BytesIO(joined[0]))
    groups = [group.column("shard").to_pylist() for group in table.row_groups(["shard"])]
    assert [len(group) for group in groups] == [records_table.ROW_GROUP, 3, 7]
    assert all(len(set(group)) == 1 for group in groups)


def test_a_join_of_the_same_parts_writes_the_same_bytes_and_hash(parts, joined):
    again = io.BytesIO()
    written = records_table.join_tables([io.BytesIO(data) for data, _ in parts], again, "train")
    assert again.getvalue() == joined[0]
    import hashlib
    assert written == joined[1] and written.sha256 == hashlib.sha256(joined[0]).hexdigest()


def test_the_footer_holds_the_parts_figures_summed(parts, joined):
    summed = SplitStats("train")
    for _, stats in parts:
        summed.merge(SplitStats.from_json("train", stats.to_json()))
    figures = records_table.RecordsTable(io.BytesIO(joined[0])).stats("train")
    assert figures.to_json() == summed.to_json()
    assert figures.images == sum(SIZES) and figures.objects_per_image[0] == sum(
        len([i for i in range(count) if i % 4 == 0]) for count in SIZES)
    assert figures.crowd_by_class == figures.objects_by_class and sum(figures.box_sizes.values()) == figures.num_objects


def test_class_ids_are_every_records_ids_as_values_and_row_starts(joined):
    values, starts = records_table.RecordsTable(io.BytesIO(joined[0])).class_ids()
    expected = [_row(shard, index)["classes"] for shard, count in enumerate(SIZES) for index in range(count)]
    assert len(starts) == len(expected) + 1 and values.dtype == np.int32
    assert [values[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])] == expected


def test_figures_round_trip_through_json_exactly():
    stats = SplitStats("validation")
    for width, height in ((3, 5000), (640, 480), (20000, 16)):
        stats.add_image(width, height, width * 7, b"jpeg", 1 if width == 3 else 3, record_schema.TASK_MULTILABEL,
                        [width % 5, 2])
    back = SplitStats.from_json("validation", stats.to_json())
    assert back.to_json() == stats.to_json() and back.labels_per_image == stats.labels_per_image


def test_a_file_that_is_not_a_table_of_this_version_is_refused_by_name():
    with pytest.raises(records_table.TableError, match="x.parquet is not a records table"):
        records_table.RecordsTable(io.BytesIO(b"not parquet at all"), name="x.parquet")
    other = io.BytesIO()
    pq.write_table(pa.table({"a": [1]}), other)
    with pytest.raises(records_table.TableError, match="not a version-1 records table"):
        records_table.RecordsTable(io.BytesIO(other.getvalue()), name="y.parquet")

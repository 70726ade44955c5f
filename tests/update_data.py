"""What the --update tests read back: a version's records, and the rule every update keeps for unchanged images.

Shared by tests/converter/test_update_{archives,hub,masks}.py (each source's own updates).
"""

from __future__ import annotations

import os
from typing import Iterator

import tensorflow as tf

import record_schema
from reader.frames import extent_records
from reader.info import dataset_info


def version_features(out: str) -> Iterator[tuple[str, str, str, object]]:
    """``(path, split, shard file relative to OUT, features)`` of each record the latest version reads (a masked
    shard's live records only), each path once (asserted)."""
    info, seen = dataset_info(out), set()
    for split in info.splits.values():
        for shard in split.shards:
            for raw in extent_records(shard.path, shard.index_path, shard.first, shard.num_examples):
                feature = tf.train.Example.FromString(raw).features.feature
                path = feature[record_schema.FILENAME].bytes_list.value[0].decode()
                assert path not in seen, path
                seen.add(path)
                yield path, split.name, os.path.relpath(shard.path, out), feature


def version_records(out: str) -> dict[str, tuple[str, str, str, bytes]]:
    """path -> (split, class name, shard file relative to OUT, image bytes) of the latest version's records."""
    classes = dataset_info(out).classes
    return {path: (split, classes[feature[record_schema.LABEL].int64_list.value[0]], shard,
                   feature[record_schema.IMAGE_ENCODED].bytes_list.value[0])
            for path, split, shard, feature in version_features(out)}


def assert_unchanged_kept(out: str, now: dict, before: dict, changed: set[str]) -> None:
    """Each image of ``before`` (a :func:`version_records` of the previous version) still in ``now`` and not in
    ``changed`` keeps its split and class, and its shard file unless that shard was compacted away (a masked
    shard is reused whole; only a compacted one moves its survivors)."""
    info = dataset_info(out)
    files = {os.path.relpath(shard.path, out) for split in info.splits.values() for shard in split.shards}
    for path, (split, cls, shard, _) in before.items():
        if path in now and path not in changed:
            assert now[path][:2] == (split, cls), path
            assert now[path][2] == shard or shard not in files, path

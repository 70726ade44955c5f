"""The conversion job: image folders to sharded TFRecords, as an Apache Beam pipeline.

Modules in data-flow order: ``options`` (what to do), ``discover`` (list SRC,
labels, splits), ``validate`` and ``encode`` (per image), ``shard`` (order and
shard arithmetic), ``tfrecord`` and ``write`` (records and shard files),
``manifest`` and ``publish`` (commit), ``transforms`` (the Beam graph),
``pipeline`` (``run``: launch, check, publish).
"""

"""What to convert, decided in the launcher before any worker starts.

``listing`` (SRC's files, the one part that walks a file system) -> ``discover`` (splits, classes,
label ids: the :class:`~beam_jobs.planning.discover.InputPlan` every source gives) with ``carve``
(the validation carve and the keyed hash that orders records) -> ``shard`` (shards per split) and
``resume`` (the run's record, and which kept work the same command continues).
"""

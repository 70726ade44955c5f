"""The job's files: how it reads and writes anywhere, what its stages hand each other, how it publishes.

``filesystems`` (Beam's ``FileSystems``, ranged reads, whole-file writes; local, S3, GCS),
``work_records`` (the one format of the per-image work files between stages), ``publish`` (lock OUT,
stage beside it, commit all at once).
"""

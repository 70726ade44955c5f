"""The pipeline's stages, wired in :mod:`beam_jobs.transforms`, each stating its data in and out at its top.

1. ``list_parts``: the listed images cut into part files (in the launcher).
2. ``validate_part``: each part's images read and checked (``validate``, with ``encode`` and
   ``stable_decode`` for the per-image work).
3. ``count``: the parts' counts added up; each key bucket gets its position and shards.
4. ``order_bucket``: a bucket put in its final order and cut at the shard boundaries.
5. ``write``: a shard written, its images read again in order.
6. ``merge_reports``: the rejection report and the search for identical images.

Then ``manifest``: the dataset's table of contents, built from what the stages wrote.
"""

"""The conversion job: image folders to sharded TFRecords, as an Apache Beam pipeline.

In data-flow order: ``options`` (what to do); ``discover`` and ``sources/`` (list SRC: class folders,
label files, ImageNet, WebDataset, archives, Hugging Face datasets; labels, splits, the plan); the
stages, each stating its data in and out at its top (``list_parts``, ``validate_part`` with
``validate`` and ``encode``, ``count``, ``order_bucket``, ``write``, ``merge_reports``), wired in one
place, ``transforms``; ``manifest``, ``publish`` and ``resume`` (the commit, and what a stopped run
keeps); ``pipeline`` (``run``: launch, check, publish) with ``runners``, ``interrupt`` and
``progress``. The on-disk formats both sides share live in ``record_files`` and ``record_schema``.
"""

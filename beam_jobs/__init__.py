"""The conversion job: image folders to sharded TFRecords, as an Apache Beam pipeline.

Its folders, in data-flow order (each module states its data in and out at its top):

* ``options``: what to do (frozen dataclasses); ``stage_records``: the records that pass between stages;
  ``annotations``: an image's objects or several labels, one typed value from source to writer, placed on
  the stored image; ``masks``: instance and class masks as PNGs on the stored image;
  ``formats``: which image formats are read and how; ``faults``: the named points crash tests stop at.
* ``planning/``: list SRC, find its splits and classes, carve validation, count shards, decide what a
  stopped run's kept work resumes.
* ``sources/``: every input the user points at (class folders, label files, ImageNet, WebDataset,
  archives, Hugging Face datasets, COCO, Pascal VOC, YOLO, masks beside images) turned into the same
  plan: a table of sources, the first that claims SRC plans it.
* ``stages/``: the pipeline's stages, stage 1 to 6, and the per-image work they call.
* ``files/``: the job's file I/O (object stores included), the work files between stages, the commit.
* ``runtime/``: the runner and its local workers, stop signals, progress.
* ``transforms``: the one place that wires the stages; ``pipeline``: ``run`` (launch, check, publish).

The on-disk formats the reader shares live outside, in ``record_files`` and ``record_schema``.
"""

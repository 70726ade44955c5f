"""Input sources: each turns what the user points at into the same :class:`beam_jobs.planning.discover.InputPlan`.

* class folders (``SRC/<class>/...`` or ``SRC/<split>/<class>/...``):
  :func:`beam_jobs.planning.discover.plan_inputs` over a listing of SRC;
* a label file (``--annotations``: CSV, TSV or JSON Lines of path, label and
  optionally split): :mod:`beam_jobs.sources.label_file`;
* ImageNet as it ships (class folders for train, a flat ``val/`` labelled by a
  ground-truth file, ``--val-labels``): :mod:`beam_jobs.sources.imagenet`;
* WebDataset samples (img2dataset's shards), each image labelled by its sibling
  member (``--label-member cls``, ``json:FIELD``): :mod:`beam_jobs.sources.webdataset`;
* Hugging Face datasets as they ship (Parquet files whose rows are images,
  labelled by the Hub's ClassLabel ids): :mod:`beam_jobs.sources.hub`.

Wherever a folder is read, an archive (``.tar``, ``.tar.gz``, ``.zip``...) reads
as its extraction, by offset and without extracting
(:mod:`beam_jobs.sources.archives`, over :mod:`beam_jobs.sources.archive_members`).

Everything after the plan (validation, shards, manifest) is the same for all.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from beam_jobs.options import ConvertOptions, LabelMember
from beam_jobs.planning import discover
from beam_jobs.sources import archives, hub
from beam_jobs.stage_records import ImageRef


def plan_inputs(options: ConvertOptions, scratch: Optional[str] = None,
                scanner: Optional[archives.Scanner] = None) -> discover.InputPlan:
    """The plan of ``options.src`` according to the source the options name.

    ``scratch``: a local folder for the per-image lists, so the plan holds
    counters, not images (see :mod:`beam_jobs.planning.discover`). ``scanner``: reads
    the tars' headers on the workers (:mod:`beam_jobs.sources.archive_scan`).

    Raises:
      discover.InputError: the source cannot be planned (a message naming the file, line or folder).
    """
    labels = discover.read_labels_file(options.labels_file) if options.labels_file else None
    # Bytes one archive member may inflate to: an image at --max-pixels, 32 bytes a pixel (a float64 RGBA TIFF).
    limit = 32 * options.encode.max_pixels
    if options.annotations:
        from beam_jobs.sources import label_file

        if not archives.is_archive_file(options.src):  # a folder: the label file lists it, no walk needed
            return label_file.plan(options.src, options.annotations, labels, options.val_fraction, options.seed,
                                   options.annotation_columns, scratch=scratch)
        found = archives.list_tree(options.src, scratch, limit, scanner)
        plan = label_file.plan(options.src, options.annotations, labels, options.val_fraction, options.seed,
                               options.annotation_columns, scratch=scratch, archive=dict(found.listing.entries()),
                               refused=[ImageRef("train", path, 0, source) for path, source in found.listing.refused])
        return dataclasses.replace(plan, inflated=found.inflated, archives=found.identities)
    if hub.is_parquet_file(options.src):
        return hub.plan(options.src, discover.Listing(()), labels, options.val_fraction, options.seed,
                            options.config, options.image_column, options.label_column, scratch=scratch)
    found = archives.list_tree(options.src, scratch, limit, scanner)
    listing = found.listing
    if hub.parquet_files(listing):
        _check_parquet_options(options)
        return hub.plan(options.src, listing, labels, options.val_fraction, options.seed, options.config,
                            options.image_column, options.label_column, scratch=scratch)
    if options.config or options.image_column or options.label_column:
        flag = "--config" if options.config else "--image-column" if options.image_column else "--label-column"
        raise discover.InputError(f"{flag} names a part of a Parquet dataset, but {options.src} holds no .parquet "
                                  "files")
    if options.label_member:
        from beam_jobs.sources import webdataset

        with archives.LauncherReader(options.src, found.inflated) as read_label:
            plan = webdataset.plan(options.src, listing, LabelMember.parse(options.label_member), labels,
                                   read_label, options.val_fraction, options.seed, scratch=scratch)
    elif options.val_labels:
        from beam_jobs.sources import imagenet

        plan = imagenet.plan(options.src, listing, options.val_labels, labels, options.seed, scratch=scratch)
    else:
        plan = discover.plan_inputs(listing, labels, options.val_fraction, options.seed, src=options.src,
                                    scratch=scratch)
    return dataclasses.replace(plan, inflated=found.inflated, archives=found.identities)


def _check_parquet_options(options: ConvertOptions) -> None:
    """Flags that label images another way have no meaning for a Parquet dataset, which labels its rows."""
    for flag, value in (("--annotations", options.annotations), ("--val-labels", options.val_labels),
                        ("--label-member", options.label_member)):
        if value:
            raise discover.InputError(f"{flag}: {options.src} is a Parquet dataset, whose rows carry their labels "
                                      "(--label-column names the column)")

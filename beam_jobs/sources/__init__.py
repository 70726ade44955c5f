"""Input sources: each says whether ``--src`` (with its flags) is its layout, and plans it.

The seam is :data:`SOURCES`, a table tried in order, as WebDataset's ``gopen_schemes`` is: the first
source that claims the request plans it into the one :class:`beam_jobs.planning.discover.InputPlan`
every later stage reads. The stages see items (``ImageRef``: where the bytes are, the label or the
objects), never a source's kind; a source's item locators are read by
:mod:`beam_jobs.sources.archives.member_reads`. A new layout is a module and a row here.

* a Hugging Face Parquet or Arrow file, or a folder of them: :mod:`beam_jobs.sources.hub.hub`;
* a COCO annotation file (``annotations/instances_*.json``, or ``--annotations FILE.json``):
  :mod:`beam_jobs.sources.objects.coco`;
* an Ultralytics YOLO dataset (``data.yaml``, ``images/`` and ``labels/``): :mod:`beam_jobs.sources.objects.yolo`;
* CVAT for images 1.1 (``annotations.xml``, its images anywhere below it): :mod:`beam_jobs.sources.objects.cvat`;
* Pascal VOC (``Annotations/``, ``JPEGImages/``, ``ImageSets/Main/``; or Roboflow's split folders of ``.jpg``
  beside ``.xml``): :mod:`beam_jobs.sources.objects.voc`;
* VOC's class masks without boxes (``JPEGImages/``, ``SegmentationClass/``; CVAT's Segmentation mask 1.1, its
  ``labelmap.txt`` of colours): :mod:`beam_jobs.sources.objects.voc_segmentation`;
* semantic masks beside their images (``images/``, ``masks/``): :mod:`beam_jobs.sources.objects.mask_folders`;
* a label file (``--annotations``: CSV, TSV or JSON Lines): :mod:`beam_jobs.sources.label_file`;
* WebDataset samples labelled by a sibling member (``--label-member``): :mod:`beam_jobs.sources.webdataset`;
* ImageNet as it ships (``--val-labels``): :mod:`beam_jobs.sources.imagenet`;
* class folders (``SRC/<class>/...``, ``SRC/<split>/<class>/...``): the rest,
  :func:`beam_jobs.planning.discover.plan_inputs`.

Wherever a folder is read, an archive (``.tar``, ``.tar.gz``, ``.zip``...) reads as its extraction,
by offset and without extracting (:mod:`beam_jobs.sources.archives.archives`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

from beam_jobs.options import ConvertOptions, LabelMember
from beam_jobs.planning import discover
from beam_jobs.planning.listing import head_of
from beam_jobs.sources import imagenet, stated_license
from beam_jobs.sources.archives import archives
from beam_jobs.sources.hub import hub, hub_files
from beam_jobs.sources.objects import coco, cvat, layout_hints, mask_folders, voc, voc_segmentation, yolo
from beam_jobs.stage_records import ImageRef


@dataclasses.dataclass
class Request:
    """What a source is asked to plan: the options, and SRC's listing, made once when first needed."""

    options: ConvertOptions
    scratch: Optional[str] = None
    scanner: Optional[archives.Scanner] = None
    labels: Optional[list[str]] = None  # --labels, read
    _found: Optional[archives.ArchiveListing] = None

    @property
    def src(self) -> str:
        return self.options.src

    def found(self) -> archives.ArchiveListing:
        """SRC listed, every archive in it read as a folder (listed once, whichever source asks)."""
        if self._found is None:
            # Bytes one archive member may inflate to: an image at --max-pixels, 32 bytes a pixel (float64 RGBA TIFF).
            limit = 32 * self.options.encode.max_pixels
            self._found = archives.list_tree(self.src, self.scratch, limit, self.scanner)
        return self._found

    def with_archives(self, plan: discover.InputPlan) -> discover.InputPlan:
        """``plan`` with the archives the listing inflated and found (their identities make the run's), and the
        images that damaged archives lost: counted against the error budget where they can be, each named."""
        found = self.found()
        lost, warnings = found.losses()
        return dataclasses.replace(plan, inflated=found.inflated, archives=found.identities,
                                   lost_inputs=plan.lost_inputs + lost, warnings=plan.warnings + tuple(warnings))


# The flags that say how a layout labels its images, each meaningful to some sources only: a source's row
# names those it reads, and any other given is refused once, naming it (:func:`_refuse_flags`).
_HUB_FLAGS = frozenset({"--config", "--image-column", "--label-column", "--bbox-format"})


def _given(options: ConvertOptions) -> dict[str, bool]:
    return {"--annotations": bool(options.annotations), "--val-labels": bool(options.val_labels),
            "--label-member": bool(options.label_member), "--config": bool(options.config),
            "--image-column": bool(options.image_column), "--label-column": bool(options.label_column),
            "--bbox-format": bool(options.bbox_format), "--masks": options.masks}


@dataclasses.dataclass(frozen=True)
class Source:
    """One input layout: ``claims(request)`` says whether SRC and its flags are this layout; ``plan`` plans it.

    ``what``: the layout in words, for messages; ``flags``: the layout flags it reads (of :func:`_given`'s).
    """

    name: str
    claims: Callable[[Request], bool]
    plan: Callable[[Request], discover.InputPlan]
    what: str = ""
    flags: frozenset[str] = frozenset()


def _hub_file(request: Request) -> discover.InputPlan:
    return hub.plan(request.src, discover.Listing(()), request.labels, request.options.val_fraction,
                    request.options.seed, request.options.config, request.options.image_column,
                    request.options.label_column, scratch=request.scratch, bbox_format=request.options.bbox_format)


def _hub_folder(request: Request) -> discover.InputPlan:
    options = request.options
    several = layout_hints.several_datasets(options.src, request.found().listing, but=layout_hints.PARQUET)
    if several:  # a Parquet file beside COCO, CVAT or YOLO datasets: its rows alone would be published
        raise discover.InputError(several)
    return hub.plan(request.src, request.found().listing, request.labels, options.val_fraction, options.seed,
                    options.config, options.image_column, options.label_column, scratch=request.scratch,
                    bbox_format=options.bbox_format)


def _label_file(request: Request) -> discover.InputPlan:
    from beam_jobs.sources import label_file, unlisted

    options = request.options
    plan = label_file.plan
    if options.label_separator is not None:  # several labels an image
        plan = functools.partial(label_file.plan_multilabel, separator=options.label_separator)
    if not archives.is_archive_file(options.src):  # a folder: the label file lists it (walked after, to account)
        return unlisted.account(plan(src=options.src, path=options.annotations, labels=request.labels,
                                     val_fraction=options.val_fraction, seed=options.seed,
                                     columns=options.annotation_columns, scratch=request.scratch),
                                options.src, options.annotations, request.scratch)
    found = request.found()
    members = dict(found.listing.entries())
    return request.with_archives(unlisted.account(plan(
        src=options.src, path=options.annotations, labels=request.labels, val_fraction=options.val_fraction,
        seed=options.seed, columns=options.annotation_columns, scratch=request.scratch, archive=members,
        refused=[ImageRef("train", path, 0, source) for path, source in found.listing.refused]),
        options.src, options.annotations, request.scratch, members=members))


def _webdataset(request: Request) -> discover.InputPlan:
    from beam_jobs.sources import webdataset

    found, options = request.found(), request.options
    with archives.LauncherReader(options.src, found.inflated) as read_label:
        plan = webdataset.plan(options.src, found.listing, LabelMember.parse(options.label_member), request.labels,
                               read_label, options.val_fraction, options.seed, scratch=request.scratch)
    return request.with_archives(plan)


def _imagenet(request: Request) -> discover.InputPlan:
    options = request.options
    return request.with_archives(imagenet.plan(options.src, request.found().listing, options.val_labels,
                                               request.labels, options.seed, scratch=request.scratch,
                                               synsets=options.synsets))


def _class_folders(request: Request) -> discover.InputPlan:
    options = request.options
    listing = request.found().listing
    wrong = layout_hints.several_datasets(options.src, listing) or layout_hints.yolo_without_yaml(options.src, listing)
    if wrong:
        raise discover.InputError(wrong)
    try:
        with archives.LauncherReader(options.src, request.found().inflated) as reader:
            return request.with_archives(discover.plan_inputs(request.found().listing, request.labels,
                                                              options.val_fraction, options.seed, src=options.src,
                                                              scratch=request.scratch,
                                                              read_head=head_of(reader.open)))
    except discover.InputError as err:  # no class folders: is SRC an object dataset's inner folder?
        hint = layout_hints.one_level_deep(options.src)
        if hint is None:
            raise
        raise discover.InputError(hint) from err


def _objects(module) -> Callable[[Request], discover.InputPlan]:
    """The plan of an object layout (COCO, YOLO): one call over SRC's listing."""
    def plan(request: Request) -> discover.InputPlan:
        found = request.found()
        if module is voc:  # VOC's roots may lie below SRC: a folder holding VOC beside other datasets is no VOC
            several = layout_hints.several_datasets(request.src, found.listing, but="Pascal VOC")
            if several:
                raise discover.InputError(several)
        with archives.LauncherReader(request.src, found.inflated) as read:
            return request.with_archives(module.plan(request.options, found.listing, read, request.labels,
                                                     request.scratch))
    return plan


# Tried in order; the first that claims the request plans it. Flags that name a layout come before
# the layouts found by looking, and class folders, which claim everything, come last.
_PARQUET = "a Parquet dataset, whose rows carry their labels (--label-column names the column)"
_ANNOTATED = "a dataset whose annotations label its images"
SOURCES: tuple[Source, ...] = (
    Source("hugging-face-file", lambda r: hub_files.is_dataset_file(r.src), _hub_file, _PARQUET, _HUB_FLAGS),
    Source("coco", lambda r: coco.claims(r.options, r.found().listing if not r.options.annotations else None),
           _objects(coco), f"{_ANNOTATED} (COCO)", frozenset({"--annotations", "--masks"})),
    Source("label-file", lambda r: bool(r.options.annotations), _label_file, "a label file's images",
           frozenset({"--annotations"})),
    Source("hugging-face", lambda r: bool(hub_files.parquet_files(r.found().listing)), _hub_folder, _PARQUET,
           _HUB_FLAGS),
    Source("yolo", lambda r: yolo.claims(r.found().listing), _objects(yolo), f"{_ANNOTATED} (YOLO)",
           frozenset({"--masks"})),
    Source("cvat", lambda r: not (r.options.label_member or r.options.val_labels)
           and cvat.claims(r.found().listing), _objects(cvat), f"{_ANNOTATED} (CVAT)"),
    Source("pascal-voc", lambda r: not (r.options.label_member or r.options.val_labels)
           and voc.claims(r.found().listing), _objects(voc), f"{_ANNOTATED} (Pascal VOC)", frozenset({"--masks"})),
    Source("voc-segmentation", lambda r: not (r.options.label_member or r.options.val_labels)
           and voc_segmentation.claims(r.found().listing), _objects(voc_segmentation),
           "VOC-laid-out class masks without boxes (semantic segmentation)", frozenset({"--masks"})),
    Source("mask-folders", lambda r: not (r.options.label_member or r.options.val_labels)
           and mask_folders.claims(r.found().listing), _objects(mask_folders),
           "images beside their class masks (semantic segmentation)", frozenset({"--masks"})),
    Source("webdataset", lambda r: bool(r.options.label_member), _webdataset, "WebDataset samples",
           frozenset({"--label-member"})),
    Source("imagenet", lambda r: bool(r.options.val_labels), _imagenet, "ImageNet", frozenset({"--val-labels"})),
    Source("class-folders", lambda r: True, _class_folders, "class folders"),
)


def plan_inputs(options: ConvertOptions, scratch: Optional[str] = None,
                scanner: Optional[archives.Scanner] = None) -> discover.InputPlan:
    """The plan of ``options.src``, by the first source of :data:`SOURCES` that claims it.

    ``scratch``: a local folder for the per-image lists, so the plan holds
    counters, not images (see :mod:`beam_jobs.planning.discover`). ``scanner``: reads
    the tars' headers on the workers (:mod:`beam_jobs.sources.archives.archive_scan`).

    Raises:
      discover.InputError: the source cannot be planned (a message naming the file, line or folder).
    """
    return planned(*claiming(options, scratch, scanner))


def claiming(options: ConvertOptions, scratch: Optional[str] = None,
             scanner: Optional[archives.Scanner] = None) -> tuple[Source, Request]:
    """The source of :data:`SOURCES` that claims ``options.src`` (its flags checked), and the request it plans:
    what an update asks first, to refuse a source it does not update before that source reads its annotations."""
    labels = discover.read_labels_file(options.labels_file) if options.labels_file else None
    request = Request(options, scratch, scanner, labels)
    source = next(source for source in SOURCES if source.claims(request))
    _refuse_flags(source, options)
    return source, request


def planned(source: Source, request: Request) -> discover.InputPlan:
    """The plan ``source`` makes of ``request`` (:func:`claiming`), as :func:`plan_inputs` returns it."""
    options = request.options
    plan = source.plan(request)
    if plan.skipped_files is not None and plan.skipped_files.annotations:  # each named: it may be a dataset left out
        plan = dataclasses.replace(plan, warnings=plan.warnings + tuple(plan.skipped_files.annotation_warnings(
            options.src)))
    if options.synsets:  # each class's text (ImageNet's LOC_synset_mapping.txt), whatever listed the classes
        plan = dataclasses.replace(plan, class_text=imagenet.read_synsets(options.synsets, plan.classes))
    return _with_stated_license(request, plan)


def _with_stated_license(request: Request, plan: discover.InputPlan) -> discover.InputPlan:
    """``plan`` with the licence SRC's export README states, when the user gives none (a listed SRC only: a
    label file's folder or a Parquet file is not walked for it)."""
    if request._found is None or (request.options.card is not None and request.options.card.license):
        return plan
    warnings: list[str] = []
    with archives.LauncherReader(request.src, request._found.inflated) as read:
        stated = stated_license.find(request._found.listing, read, warnings)
    if stated is not None:
        warnings.append(f"license: {stated.license}, as {discover.display_path(stated.file)} states it, is put in "
                        "croissant.json (noting that file); --license gives another")
    return dataclasses.replace(plan, stated_license=tuple(stated or ()), warnings=plan.warnings + tuple(warnings))


def _refuse_flags(source: Source, options: ConvertOptions) -> None:
    """A layout flag the chosen source does not read has no meaning for SRC: an error naming the first given."""
    refused = [flag for flag, given in _given(options).items() if given and flag not in source.flags]
    if not refused:
        return
    flag = refused[0]
    if flag in _HUB_FLAGS:
        raise discover.InputError(f"{flag} names a part of a Parquet dataset, but {options.src} holds no .parquet "
                                  "files")
    if flag == "--masks":
        raise discover.InputError(f"--masks writes COCO's, YOLO's and Pascal VOC's instance masks and VOC's class masks, but "
                                  f"{options.src} is read as {source.name}, which has none")
    raise discover.InputError(f"{flag}: {options.src} is {source.what}")

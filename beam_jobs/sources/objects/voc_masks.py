"""VOC's segmentation masks (``--masks``): which images have them, and each object's instance mask.

In:  the images a VOC root's lists name, and for each an image's two palette PNGs as VOC2007-2012 ship them beside ``JPEGImages/`` (``SegmentationObject/<id>.png``:
     pixel value k is the k-th ``<object>`` of ``Annotations/<id>.xml``, 0 the background, 255 the void outline;
     ``SegmentationClass/<id>.png``: the class id of each pixel, VOC's 1-20, 0 and 255 alike), and the image's
     objects, each with its 1-based place in the XML and its class id.
Out: each object's mask as a COCO RLE (JSON text in ``Box.mask``, in the PNGs' pixels: what
     :func:`beam_jobs.masks.mask_png` draws into ``image/object/mask`` as it does COCO's crowd RLEs), or why it
     cannot be written (``(name, bad-mask, detail)``, which rejects its image: :func:`beam_jobs.annotations.unwritable`).

The devkit's convention (``VOCdevkit/devkit_doc``, section "Segmentation Ground Truth"), which torchvision's
``VOCSegmentation`` (the class PNG as target) and KerasCV's ``pascal_voc.segmentation`` (both PNGs, palette
colours mapped back to indexes) read alike: reading the PNG's palette indexes (Pillow's mode ``P``) gives the
ids without any colour table. Checked here, since a mask on the wrong object teaches a wrong shape:

* the object's instance has pixels (an object of the XML with none cannot have its mask written);
* every one of them has the object's class in the class PNG (an instance numbered against another order of
  the XML's objects, or a class PNG of other ids, shows here);
* no instance id past the XML's last object (the PNG belongs to another XML);
* both PNGs readable, one band, the same size (the RLE's size is checked against the image's later, by
  :func:`beam_jobs.annotations.place`).

Done while the plan is made (two small PNGs an image: VOC2012's 2,913 segmented images are 5,826 reads), so the
work files carry each mask as a compressed RLE of a few hundred bytes and no stage changes for VOC.
"""

from __future__ import annotations

import json
import posixpath
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

import record_schema
from beam_jobs import annotations, masks
from beam_jobs.planning.discover import display_path
from beam_jobs.planning.listing import SkippedFiles
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan, voc_classes
from beam_jobs.stage_records import ImageRef

OBJECT_FOLDER = "SegmentationObject"
CLASS_FOLDER = "SegmentationClass"
VOID = 255


def mask_path(image: str, folder: str) -> str:
    """``<folder>/<id>.png`` beside ``JPEGImages/<id>.jpg``: one of an image's segmentation PNGs."""
    return posixpath.join(posixpath.dirname(posixpath.dirname(image)), folder,
                          posixpath.splitext(posixpath.basename(image))[0] + ".png")


def held(roots: Sequence[str], located, folder: str) -> list[str]:
    """The PNGs of ``folder`` (``SegmentationObject``, ``SegmentationClass``) in the VOC roots ``roots``."""
    prefixes = tuple(posixpath.join(root, folder) + "/" for root in roots)
    return [path for path in located if path.startswith(prefixes) and path.endswith(".png")]


def instance_roots(roots: Sequence[str], located, masks_asked: bool) -> tuple[set[str], list[str]]:
    """``--masks``: the VOC roots whose objects get instance masks (those holding ``SegmentationObject/`` PNGs),
    decided a root, and a warning naming the roots without (their images keep their class masks, no object
    masks: each root is read as its own layout says, a second root's images not refused for a folder it lacks)."""
    if not masks_asked:
        return set(), []
    found = {root for root in roots if held([root], located, OBJECT_FOLDER)}
    without = [root for root in roots if root not in found]
    if not found or not without:
        return found, []
    return found, [f"{', '.join((root or '.') + '/' for root in without[:3])}{' ...' if len(without) > 3 else ''}: no "
                   f"{OBJECT_FOLDER}/ (another VOC folder has one): its images get their class masks and no object "
                   "masks"]


def labels_problem(labels: Optional[Sequence[str]], where: str) -> Optional[str]:
    """Why ``--masks`` cannot go with this ``--labels`` on VOC, or None. VOC's PNGs hold VOC's class ids (palette
    index k: the OD API's k-th of VOC's 20, cat 8), read as they are: into the records' class masks and against
    each object's class id. When ``--labels`` numbers one of VOC's classes otherwise, both would be wrong (every
    instance mask refused as disagreeing with its XML, the class masks written in VOC's ids under other names),
    so the run is refused; ``--labels`` that keeps VOC's ids (VOC's 20 in order, then one's own) is fine."""
    if labels is None:
        return None
    moved = [(name, line, voc_classes.VOC_CLASSES.index(name) + 1) for line, name in enumerate(labels, start=1)
             if name in voc_classes.VOC_CLASSES and voc_classes.VOC_CLASSES.index(name) + 1 != line]
    if not moved:
        return None
    shown = ", ".join(f"{name!r} {line} (VOC's {voc})" for name, line, voc in moved[:3]) + (" ..." if len(moved) > 3 else "")
    return (f"--masks with --labels: {where}'s {CLASS_FOLDER}/ PNGs hold VOC's class ids (palette index k is VOC's "
            f"k-th class, cat 8), but --labels numbers VOC's classes otherwise ({shown}); the masks would be checked "
            "and written in the wrong ids. Leave --labels out (VOC's 1-20, then the dataset's own names), list VOC's "
            "20 in their order first in --labels, or leave --masks out for the boxes alone")


def list_kind(root: str, located, masks_asked: bool) -> str:
    """The ``ImageSets/`` lists a root is read by: ``Segmentation`` with ``--masks`` where the root has them (the
    images VOC segmented, as torchvision's ``VOCSegmentation`` reads them), else ``Main``."""
    folder = posixpath.join(root, "ImageSets", "Segmentation")
    if masks_asked and any(posixpath.join(folder, f"{name}.txt") in located
                           for name in ("train", "val", "test", "trainval")):
        return "Segmentation"
    return "Main"


def with_masks(listed: Sequence, located, instance_roots: set[str], segmentation_roots: set[str],
               skipped: SkippedFiles) -> tuple[list, list[ImageRef], list[str]]:
    """``--masks``: the listed images whose masks are there (``SegmentationClass/<id>.png``, and
    ``SegmentationObject/<id>.png`` where its root is one of ``instance_roots``); the others refused or skipped,
    and warnings naming them.

    An image a list of ``ImageSets/Segmentation`` names (its root in ``segmentation_roots``) without its mask is
    damage: refused as ``missing-file`` naming the mask, counted against the error budget. An image read by the
    ``Main`` lists (a root without segmentation lists: a VOC-style set of one's own) without masks is skipped and
    counted (``no-mask``): a record without masks among records with them breaks a Mask R-CNN's input (Model
    Garden's parser gathers masks by the boxes' indexes), so it is left out, and converting without ``--masks``
    writes its boxes."""
    kept, refused, bare = [], [], []
    instances = bool(instance_roots)
    for entry in listed:
        needed = [mask_path(entry.image, CLASS_FOLDER)] + (
            [mask_path(entry.image, OBJECT_FOLDER)] if _root_of(entry.image) in instance_roots else [])
        absent = [mask for mask in needed if mask not in located] if entry.image and not entry.problem else []
        if not absent:
            kept.append(entry)
        elif _root_of(entry.image) in segmentation_roots:
            refused.append(ImageRef(entry.split, entry.image, 0, archive_members.refusal(
                "missing-file", f"ImageSets/Segmentation lists it, but its mask {display_path(absent[0])} is not there")))
        else:
            bare.append(entry.image)
            skipped.add(entry.image, "no-mask", f"no mask {display_path(absent[0])} (and no ImageSets/Segmentation "
                        "list names it)")
    warnings = []
    if refused:
        count = len(refused)
        warnings.append(f"{count} image{' has' if count == 1 else 's have'} no mask in {CLASS_FOLDER}/"
                        f"{' or ' + OBJECT_FOLDER + '/' if instances else ''} though ImageSets/Segmentation lists "
                        f"{'it' if count == 1 else 'them'}: rejected as missing-file "
                        f"({_some([ref.relpath for ref in refused])}; each in {record_schema.REJECTED_FILE})")
    if bare:
        count = len(bare)
        warnings.append(f"{count} image{' has' if count == 1 else 's have'} no mask in {CLASS_FOLDER}/"
                        f"{' or ' + OBJECT_FOLDER + '/' if instances else ''} (and no ImageSets/Segmentation list): "
                        f"skipped with --masks ({_some(bare)}; each in {record_schema.SKIPPED_FILE}); convert without "
                        "--masks for their boxes")
    return kept, refused, warnings


def read_pairs(read: Callable[[str, str], bytes], located, images: Sequence[str],
               instance_roots: set[str]) -> Iterator[Optional[tuple]]:
    """Each image's ``(instance PNG, class PNG)`` bytes in order, read as annotation files are; None for "" and
    for an image of a root not in ``instance_roots`` (no ``SegmentationObject/``)."""
    images = [image if image and _root_of(image) in instance_roots else "" for image in images]

    def wanted():
        for image in images:
            for folder in (OBJECT_FOLDER, CLASS_FOLDER):
                yield (mask_path(image, folder), located[mask_path(image, folder)]) if image else None
    reads = annotated_plan.read_in_order(read, wanted())
    for image in images:
        first, second = next(reads), next(reads)
        yield (first, second) if image else None


def _root_of(image: str) -> str:
    return posixpath.dirname(posixpath.dirname(image))


def _some(paths: Sequence[str]) -> str:
    return ", ".join(map(display_path, paths[:3])) + (" ..." if len(paths) > 3 else "")


def with_instances(boxes: Sequence[tuple[int, annotations.Box]], count: int, object_png: bytes, class_png: bytes,
                   object_where: str, class_where: str) -> tuple[list[annotations.Box], list[tuple[str, str, str]]]:
    """``boxes`` (each with its 1-based place among the XML's ``count`` objects) with their masks, and the objects
    whose mask cannot be written, named (see the module's docstring)."""
    try:
        instance_ids = np.asarray(masks.read_class_mask(object_png, None, object_where))
        class_ids = np.asarray(masks.read_class_mask(class_png, None, class_where))
    except masks.MaskError as err:
        return [], [(box.name, annotations.BAD_MASK, str(err)) for _, box in boxes] or \
            [(object_where, annotations.BAD_MASK, str(err))]
    if instance_ids.shape != class_ids.shape:
        detail = (f"{object_where} is {instance_ids.shape[1]}x{instance_ids.shape[0]}, {class_where} "
                  f"{class_ids.shape[1]}x{class_ids.shape[0]}: the two masks of one image differ in size")
        return [], [(box.name, annotations.BAD_MASK, detail) for _, box in boxes] or \
            [(object_where, annotations.BAD_MASK, detail)]
    kept, rejected = [], []
    last = count
    for index, box in boxes:
        problem = _instance_problem(instance_ids == index, class_ids, index, box.label, object_where, class_where)
        if problem:
            rejected.append((box.name, annotations.BAD_MASK, problem))
        else:
            kept.append(box._replace(mask=_rle_json(instance_ids == index)))
    extra = sorted(int(v) for v in np.unique(instance_ids) if 0 < v < VOID and v > last)
    if extra:
        rejected.append((f"{object_where} instance {extra[0]}", annotations.BAD_MASK,
                         f"instance id{'s' if len(extra) > 1 else ''} {', '.join(map(str, extra[:5]))} "
                         f"{'have' if len(extra) > 1 else 'has'} pixels, but its XML has {last} object"
                         f"{'s' if last != 1 else ''} (instance k is the XML's k-th object): the mask is not this "
                         "image's, or the XML lost objects"))
    return kept, rejected


def _instance_problem(instance: np.ndarray, class_ids: np.ndarray, index: int, label: int, object_where: str,
                      class_where: str) -> Optional[str]:
    """Why an object's instance pixels cannot be its mask, or None."""
    pixels = int(instance.sum())
    if not pixels:
        return (f"it has no pixels in {object_where} (instance {index}: the XML's object {index}); its mask cannot be "
                "written")
    under = class_ids[instance]
    wrong = under != label
    if wrong.any():
        values, counts = np.unique(under[wrong], return_counts=True)
        said = int(values[np.argmax(counts)])
        return (f"{int(wrong.sum())} of its {pixels} pixels (instance {index} of {object_where}) are class "
                f"{said if said != VOID else '255 (void)'} in {class_where}, not its class {label}: the masks and the "
                "XML disagree")
    return None


def _rle_json(binary: np.ndarray) -> str:
    """A 0/1 mask as pycocotools' compressed RLE, JSON text: ``{"size": [h, w], "counts": "..."}``."""
    from pycocotools import mask as coco_mask

    rle = coco_mask.encode(np.asfortranarray(binary.astype(np.uint8)))
    return json.dumps({"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")},
                      separators=(",", ":"))

"""What to tell a user whose ``--src`` is one level off: an object dataset's inner folder, or a folder of datasets.

In:  SRC and its listing, when no object layout claimed it and class folders were about to plan it.
Out: an error message naming what is beside SRC (or inside it) and the command that works, or None.

Class folders claim whatever no other source does, so a COCO tree's ``val2017/``, VOC's ``JPEGImages/``,
YOLO's ``images/`` or COCO's ``annotations/`` would be read as images without classes, and a folder holding
``coco8/`` and ``VOC/`` as two classes of junk. Each is recognised by a marker of its layout: the parent's
files for a folder one level too deep (checked by exact names, not by listing the parent: it may hold a
million images), the sub-folders' for a folder one level too high.
"""

from __future__ import annotations

import posixpath
import re
from typing import Optional

from beam_jobs.files.filesystems import FileSystems, is_local, list_names
from beam_jobs.planning.discover import Listing, display_path

# A dataset one level down (path relative to SRC) -> its layout's name.
_INSIDE = (
    (re.compile(r"^(?P<top>[^/]+)/annotations/(?:instances|image_info)_[^/]+\.json$"), "COCO"),
    (re.compile(r"^(?P<top>[^/]+)/[^/]+/_annotations\.coco\.json$"), "Roboflow's COCO export"),
    (re.compile(r"^(?P<top>[^/]+)/[^/]+\.ya?ml$"), "YOLO"),
    (re.compile(r"^(?P<top>[^/]+)/classes\.txt$"), "YOLO"),  # Label Studio's YOLO export
    (re.compile(r"^(?P<top>[^/]+)/annotations\.xml$"), "CVAT for images"),
    (re.compile(r"^(?P<top>[^/]+)/(?:[^/]+/)?(?:VOCdevkit/)?(?:VOC[^/]*/)?Annotations/[^/]+\.xml$"), "Pascal VOC"),
    (re.compile(r"^(?P<top>[^/]+)/result\.json$"), "Label Studio's COCO export"),
)
_MARKER_SUFFIXES = (".json", ".yaml", ".yml", ".xml", "/classes.txt", ".parquet")
PARQUET = "Parquet"


def several_datasets(src: str, listing: Listing, but: str = "") -> Optional[str]:
    """SRC's top folders (and Parquet files) that are datasets, each named with the command that converts it, or
    None; ``but``: a layout whose datasets alone are no mistake (Pascal VOC: VOC2007/ beside VOC2012/ is one
    dataset, which it reads whole; Parquet: a Hub dataset's configs).

    A Parquet file is a dataset (the Hub's source reads one alone): one beside COCO, CVAT or YOLO datasets must
    not make the folder a Parquet dataset whose rows alone are published (issue #57 case 4).
    """
    found: dict[str, str] = {}
    for path in listing.files:
        # Only annotation files can be markers: the suffix test skips ImageNet's 1.28M images in 0.1 s.
        if not path.endswith(_MARKER_SUFFIXES) or path.count("/") > 4:
            continue
        if path.lower().endswith(".parquet"):
            found.setdefault(path.split("/")[0], PARQUET)
            continue
        for pattern, layout in _INSIDE:
            match = pattern.match(path)
            if match and (layout != "YOLO" or _has_labels(listing, match["top"])):
                found[match["top"]] = layout if found.get(match["top"], PARQUET) == PARQUET else found[match["top"]]
    if len(found) < 2 and set(found.values()) <= {PARQUET} or set(found.values()) == {but}:
        return None
    tops = sorted(found)
    named = ", ".join(f"{top}{'/' if top in listing.dirs or '.' not in top else ''} ({found[top]})"
                      for top in tops[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    commands = "; ".join(f"python -m converter --src {display_path(FileSystems.join(src, top))}" for top in tops[:5])
    return f"{display_path(src)} holds datasets, not classes: {named}. Convert each on its own: {commands}"


_YOLO_PARTS = re.compile(r"^(?P<root>(?:[^/]+/){0,2}?)(?P<kind>images|labels)/")


def yolo_without_yaml(src: str, listing: Listing) -> Optional[str]:
    """SRC laid out as YOLO (``images/`` beside ``labels/`` of ``.txt`` files), with no yaml or ``classes.txt``
    naming its classes (Ultralytics' own zips ship without theirs), or None."""
    kinds: dict[str, set[str]] = {}
    for path in listing.files:
        if "images/" not in path and "labels/" not in path:
            continue
        match = _YOLO_PARTS.match(path)
        if match and (match["kind"] == "images" or path.endswith(".txt")):
            kinds.setdefault(match["root"], set()).add(match["kind"])
    roots = sorted(root for root, found in kinds.items() if len(found) == 2)
    if not roots:
        return None
    where = ", ".join(f"{root}images/ and {root}labels/" for root in roots[:3])
    above = yolo_root(posixpath.dirname(src.rstrip("/")), levels=1) if roots == [""] else ""
    if above and _names_classes(above):
        return (f"{display_path(src)} is one split of a YOLO dataset whose yaml is in {display_path(above)}: convert "
                f"the dataset: python -m converter --src {display_path(above)}")
    return (f"{display_path(src)} holds {where} as YOLO writes them, but no yaml naming the classes: put the "
            "dataset's yaml beside them (names:, and train:/val: naming the image folders; Ultralytics' own, e.g. "
            "coco8.yaml, are in its package's cfg/datasets), or a classes.txt with a class name a line")


def _has_labels(listing: Listing, top: str) -> bool:
    return any(path.startswith(f"{top}/") and "/labels/" in path and path.endswith(".txt") for path in listing.files)


def one_level_deep(src: str) -> Optional[str]:
    """SRC as an inner folder of COCO, VOC, YOLO or CVAT, by its name and the files beside it; or None."""
    src = src.rstrip("/")
    parent, name = posixpath.dirname(src), posixpath.basename(src)
    if not parent or parent == src:
        return None
    found = _inner_folder(src, parent, name)
    if found is None:
        return None
    what, root = found
    return f"{display_path(src)} is {what}: convert the dataset it belongs to: python -m converter --src " \
           f"{display_path(root)}"


def _exists(*parts: str) -> bool:
    try:
        return FileSystems.exists(FileSystems.join(*parts))
    except (OSError, ValueError):
        return False


def _inner_folder(src: str, parent: str, name: str) -> Optional[tuple[str, str]]:
    """``(what SRC is, the dataset's root)`` for an inner folder of a known layout, or None."""
    if name == "annotations" or _exists(parent, "annotations", f"instances_{name}.json") or \
            _exists(parent, "annotations", f"image_info_{name}.json"):
        return "COCO's" + (" annotation folder" if name == "annotations" else " image folder"), parent
    if _exists(src, "_annotations.coco.json"):
        return "one split of Roboflow's COCO export (_annotations.coco.json beside its images)", parent
    if name == "JPEGImages" and _exists(parent, "Annotations"):
        return "Pascal VOC's image folder (Annotations/ is beside it)", parent
    if name == "images" and _exists(parent, "annotations.xml"):
        return "CVAT's image folder (annotations.xml is beside it)", parent
    if name == "images" and _exists(parent, "annotations"):
        return "COCO's image folder (annotations/ is beside it)", parent
    other = {"images": "labels", "labels": "images"}.get(name)
    if other and _exists(parent, other):
        return f"YOLO's {name[:-1]} folder ({other}/ is beside it)", yolo_root(parent)
    if posixpath.basename(parent) == "images" and _exists(posixpath.dirname(parent), "labels"):
        return "a split of YOLO's image folder (labels/ is beside images/)", yolo_root(posixpath.dirname(parent))
    return None


def yolo_root(folder: str, levels: int = 2) -> str:
    """The YOLO dataset ``folder`` belongs to: the nearest of it and ``levels`` folders above that holds the
    dataset's yaml or Label Studio's classes.txt (Roboflow's ``train/`` sits below ``data.yaml``); else itself."""
    here = folder
    for _ in range(levels + 1):
        if _names_classes(here):
            return here
        up = posixpath.dirname(here)
        if not up or up == here:
            break
        here = up
    return folder


def _names_classes(folder: str) -> bool:
    """``folder`` holds a yaml (a local folder is listed; elsewhere ``data.yaml`` is asked for) or classes.txt."""
    if is_local(folder):
        try:
            return any(name.endswith((".yaml", ".yml")) or name == "classes.txt" for name in list_names(folder))
        except OSError:
            return False
    return _exists(folder, "data.yaml") or _exists(folder, "classes.txt")

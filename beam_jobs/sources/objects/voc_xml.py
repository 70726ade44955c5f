"""Pascal VOC's annotation XMLs, read: each wanted image's ``size`` and objects, packed until the class ids are known.

In:  ``(split, image or "", XML)`` of each image a VOC root's lists (or a Roboflow folder) want
     (:mod:`beam_jobs.sources.objects.voc`), the XMLs read :data:`annotated_plan.READERS` at a time in order.
Out: a :class:`Listed` an image: its frame (the XML's ``size``) and its objects packed as :data:`PACKED` (the
     name's index among the names met, ``bndbox`` as VOC writes it, difficult, truncated), or what is wrong with
     its XML (missing, not XML, an object without a name or a bndbox of four numbers); a class name holding a
     control character or a line break is refused (:class:`InputError`), naming its XML and object."""

from __future__ import annotations

import collections
import posixpath
import struct
import xml.etree.ElementTree as ElementTree
from typing import Callable, Iterator, NamedTuple, Sequence

from beam_jobs import annotations
from beam_jobs.planning.discover import InputError, display_path
from beam_jobs.sources.objects import annotated_plan

Reader = Callable[[str, str], bytes]


# An object held until the class ids are known: its name's index, its bndbox as VOC writes it, difficult, truncated
# (38 bytes, where a tuple of its fields took hundreds).
PACKED = struct.Struct("<IddddBB")


class Listed(NamedTuple):
    """One image a split list names: its XML read, its objects packed, or what is wrong with it."""

    split: str
    image: str  # "" when its JPEGImages/ has no such image
    xml: str
    frame: tuple[int, int]
    problem: str  # the XML's problem, or ""
    packed: bytes


def expected_image(xml: str) -> str:
    """The image an XML annotates when none is there: ``JPEGImages/<id>.jpg`` beside ``Annotations/``, else
    ``<id>.jpg`` beside the XML (Roboflow's layout)."""
    folder, stem = posixpath.dirname(xml), posixpath.basename(xml)[:-len(".xml")]
    if posixpath.basename(folder) == "Annotations":
        folder = posixpath.join(posixpath.dirname(folder), "JPEGImages")
    return posixpath.join(folder, f"{stem}.jpg")


def read_xmls(wanted: Sequence[tuple[str, str, str]], located: dict, read: Reader, names: dict[str, int],
              counts: collections.Counter) -> Iterator[Listed]:
    """Each wanted image's XML, read :data:`annotated_plan.READERS` at a time in order, parsed, its objects
    packed; ``names`` and ``counts`` gather the class names met."""
    xmls = ((xml, located[xml]) if xml in located else None for _, _, xml in wanted)
    for (split, image, xml), data in zip(wanted, annotated_plan.read_in_order(read, xmls)):
        if data is None:
            missing = image or expected_image(xml)
            yield Listed(split, missing, xml, annotations.STORED, f"{display_path(xml)} is missing", b"")
            continue
        result = parse(data, display_path(xml))
        if isinstance(result, str):
            yield Listed(split, image, xml, annotations.STORED, result, b"")
            continue
        frame, objects = result
        packed = bytearray()
        for index, (name, x0, y0, x1, y1, difficult, truncated) in enumerate(objects, start=1):
            problem = annotations.class_name_problem(name, f"{display_path(xml)} object {index}")
            if problem:
                raise InputError(problem)
            counts[name] += 1
            packed += PACKED.pack(names.setdefault(name, len(names)), x0, y0, x1, y1, difficult, truncated)
        yield Listed(split, image, xml, frame, "", bytes(packed))


def parse(data: bytes, where: str):
    """``((width, height) or STORED, [(name, xmin, ymin, xmax, ymax, difficult, truncated)])``, or what is wrong."""
    try:
        tree = ElementTree.fromstring(data)
    except ElementTree.ParseError as err:
        return f"{where} is not valid XML: {err}"
    frame = annotations.STORED
    size = tree.find("size")
    if size is not None:
        try:
            width, height = int(size.findtext("width", "0")), int(size.findtext("height", "0"))
        except ValueError:
            width = height = 0
        if width > 0 and height > 0:
            frame = (width, height)
    objects = []
    for index, item in enumerate(tree.findall("object"), start=1):
        box = item.find("bndbox")
        try:
            corners = [float(box.findtext(key)) for key in ("xmin", "ymin", "xmax", "ymax")]
        except (AttributeError, TypeError, ValueError):
            return f"{where}: object {index} has no bndbox of four numbers"
        name = (item.findtext("name") or "").strip()
        if not name:
            return f"{where}: object {index} has no name"
        objects.append((name, *corners, _flag(item, "difficult"), _flag(item, "truncated")))
    return frame, objects


def _flag(item, key: str) -> bool:
    return (item.findtext(key) or "0").strip() in ("1", "true", "True")

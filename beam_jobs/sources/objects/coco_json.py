"""One COCO annotation file read in one pass: its categories, images and annotations, in whatever order they come.

In:  a function that opens the JSON as a stream (a file, an object store's reader, an archive member
     inflated as it is read: :meth:`beam_jobs.sources.archives.archives.LauncherReader.open`); it is called once.
Out: a :class:`CocoSet`: the file's categories, its images (path, id, frame) and each image's objects
     packed into bytes, made into :class:`beam_jobs.annotations.Objects` one image at a time.

Why one pass: ``instances_train2017.json`` is 448 MB; a pass per top-level list fetched it three times
from an object store. The JSON's events (``ijson.parse``) are read once; each entry of ``images``,
``annotations`` and ``categories`` is built as it ends, whichever list comes first (COCO's own files put
``categories`` last). So nothing that needs another list is decided while reading: an annotation is
packed with its category id and judged when its image's objects are made, once every category is known;
an annotation that comes before its image's entry waits, packed, under its image id, and one whose
image never comes is an orphan, named in a warning.
"""

from __future__ import annotations

import io
import json
import posixpath
import struct
from typing import BinaryIO, Callable, Iterator, Optional

from beam_jobs import annotations, masks
from beam_jobs.planning.discover import InputError, display_path, scratch_file
from beam_jobs.sources.objects import annotated_plan
from beam_jobs.sources.archives.archive_members import ArchiveError

_LISTS = {"images.item": "images", "annotations.item": "annotations", "categories.item": "categories"}

# annotation id, category id, x0, y0, x1, y1, area (-1: none), flags; its segmentation's place in the blobs
# (or, for a refused annotation, its reason's index in CocoSet.refusals). 69 bytes an object.
_PACKED = struct.Struct("<qqdddddBqI")
_CROWD, _REFUSED, _NO_ID = 1, 2, 4  # flags; _NO_ID: no int "id" (named by its place, no keypoints attach to it)
_NUMBER = (int, float)  # a bbox value (each tested without a generator: 90k annotations at 20,000 images, #57 §6)


def entries(handle: BinaryIO) -> Iterator[tuple[str, object]]:
    """``(list name, entry)`` for each entry of the file's top-level ``images``, ``annotations`` and
    ``categories`` lists, in file order, from one read of ``handle``.

    One pass of ijson's events: while a list's events go by, they are sent to that list's item builder
    (ijson's own, in C with its C backend: as fast as a pass of ``ijson.items`` for one list)."""
    import ijson

    backend = ijson.get_backend(ijson.backend)
    built = {name: ijson.sendable_list() for name in _LISTS.values()}
    builders = {name: backend.items_basecoro(built[name], f"{name}.item") for name in built}
    # The loop runs once an event (about 20 an annotation): its builder's send and its list bound, no lookup.
    send, out, name = None, None, ""
    for event in ijson.parse(handle, use_float=True):
        if send is not None:
            send(event)
            if out:
                for entry in out:
                    yield name, entry
                out.clear()
                continue
        if not event[0] and event[1] == "map_key":  # a top-level key: the next list's events, or none
            name = event[2] if event[2] in builders else ""
            send, out = (builders[name].send, built[name]) if name else (None, None)


class Blobs:
    """The objects' segmentations (``--masks``) as JSON text, kept until their image's objects are made: in a
    scratch file (train2017's are most of its 450 MB), or in memory without one."""

    def __init__(self, scratch: Optional[str]) -> None:
        self._file = open(scratch_file(scratch, "segmentations"), "w+b") if scratch else io.BytesIO()
        self._size = 0

    def add(self, value: object) -> tuple[int, int]:
        data = json.dumps(value, separators=(",", ":")).encode("utf-8")
        self._file.seek(self._size)
        self._file.write(data)
        self._size += len(data)
        return self._size - len(data), len(data)

    def get(self, offset: int, length: int) -> str:
        if not length:
            return ""
        self._file.seek(offset)
        return self._file.read(length).decode("utf-8")

    def close(self) -> None:
        self._file.close()


class CocoSet:
    """One annotation file's categories, images and objects, compact: each image's objects packed into bytes
    (69 an object, where the dictionaries ijson yields take kilobytes), so train2017's 860k fit in ~60 MB."""

    def __init__(self, where: str, folder: str, split: str, blobs: Optional[Blobs], upright: bool = False) -> None:
        self.where, self.folder, self.split, self.blobs = where, folder, split, blobs
        self.upright = upright  # where the image's size cannot tell: the boxes are in the upright image's frame
        self.categories: dict[int, str] = {}
        self.supercategories: dict[int, object] = {}  # each category's supercategory as given (None: none)
        self.relpaths: list[str] = []
        self.source_ids: list[str] = []
        self.frames: list[tuple[int, int]] = []
        self.packed: list[bytearray] = []
        self.refusals: list[tuple[str, str]] = []  # (reason, detail) of the annotations refused while read
        self.used: set[int] = set()  # the category ids of its objects
        self.extras: Optional[object] = None  # its keypoints and captions (coco_extras.Extras), when SRC has them

    def objects(self, index: int) -> annotations.Objects:
        """Image ``index``'s objects; an annotation whose category the file does not list is rejected here,
        once every category is known, before any other fault it has (as COCO's tools judge it)."""
        base, blobs, categories = posixpath.basename(self.where), self.blobs, self.categories
        boxes, rejected = [], []
        for ann, category, x0, y0, x1, y1, area, flags, offset, length in _PACKED.iter_unpack(self.packed[index]):
            name = f"{base} annotation {ann}"
            if flags & _REFUSED:
                reason, detail = self.refusals[offset]
                if category not in categories and reason != annotations.UNKNOWN_CLASS:
                    reason, detail = annotations.UNKNOWN_CLASS, _unknown(category)
                rejected.append((name, reason, detail))
            elif category not in categories:
                rejected.append((name, annotations.UNKNOWN_CLASS, _unknown(category)))
            else:
                boxes.append(annotations.Box(name, category, x0, y0, x1, y1, area, bool(flags & _CROWD),
                                             mask=blobs.get(offset, length) if blobs else ""))
                if self.extras is not None:
                    points, problem = self.extras.points(ann, self.source_ids[index], self.where) \
                        if not flags & _NO_ID else self.extras.unlabelled()
                    if problem:
                        boxes.pop()
                        rejected.append((name, annotations.BAD_ANNOTATION, problem))
                    else:
                        boxes[-1] = boxes[-1]._replace(keypoints=points)
        extras = self.extras
        return annotations.Objects(self.source_ids[index], tuple(boxes), self.frames[index], self.upright,
                                   tuple(rejected), masks=blobs is not None,
                                   captions=extras.captions_of(self.source_ids[index]) if extras else (),
                                   keypoints=extras.count if extras else 0)


def _unknown(category: object) -> str:
    return f"category_id {category} is not in the file's categories"


def read_set(opened: Callable[[], BinaryIO], where: str, folder: str, split: str, warnings: list[str],
             blobs: Optional[Blobs], required: bool = True, upright: bool = False,
             max_pixels: int = masks.DEFAULT_MAX_PIXELS) -> CocoSet:
    """The categories, images and objects of one annotation file, ``opened()`` once (``required``: it must
    list categories, as an instances file does; an ``image_info`` file lists none). ``upright``: the tool that
    wrote it annotates the upright image (CVAT, Label Studio, Roboflow). ``max_pixels``: the largest mask
    (``--max-pixels``) a segmentation may ask for."""
    reading = _Reading(CocoSet(where, folder, split, blobs, upright), max_pixels)
    read_entries(opened, where, {"images": reading.image, "annotations": reading.annotation,
                                 "categories": reading.category})
    return reading.finish(warnings, required)


def read_entries(opened: Callable[[], BinaryIO], where: str, handlers: dict[str, Callable[[dict], None]]) -> None:
    """Each entry of the top-level lists of the JSON ``opened()`` (once) given to its list's handler (a list
    without one is passed over); a damaged file raises :class:`InputError` naming ``where``, the byte offset and
    the text around the fault."""
    import ijson

    tracked: Optional[_Tracked] = None
    try:
        with opened() as handle:
            tracked = _Tracked(handle)
            for name, entry in entries(tracked):
                if not isinstance(entry, dict):
                    raise InputError(f"{where}: an entry of {name!r} is not a JSON object: {str(entry)[:80]}")
                if name in handlers:
                    handlers[name](entry)
    except ijson.JSONError as err:
        raise InputError(f"{where} is not valid JSON: {_json_fault(err, tracked)}") from err
    except (OSError, ArchiveError) as err:  # ArchiveError: a zip's member that does not inflate as it declares
        raise InputError(f"{where} could not be read: {err}") from err


class _Tracked:
    """A stream that counts the bytes read and keeps the last two reads, so a JSON fault can be placed: its
    byte offset and the text around it (yajl's own context line is empty where a file is cut short)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle, self.read_bytes, self.window, self.window_start = handle, 0, b"", 0
        self._last = b""

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.window_start = self.read_bytes - len(self._last)
        self.window, self._last = self._last + data, data
        self.read_bytes += len(data)
        return data


def _json_fault(err: Exception, tracked: Optional[_Tracked]) -> str:
    """What is wrong with the JSON and where: yajl's message in one line, the fault's byte offset and the
    text before it. A file cut short (a partial download, a full disk) ends in the middle of a value."""
    lines = str(err).splitlines()
    message = lines[0].strip().rstrip(".") if lines else type(err).__name__
    if tracked is None:
        return message
    offset = tracked.read_bytes
    if len(lines) >= 3 and lines[1].strip() and "^" in lines[2]:  # yajl's context: a snippet and a caret under it
        snippet = lines[1].strip()
        found = tracked.window.find(snippet.encode("utf-8", "replace"))
        if found >= 0:
            column = lines[2].index("^") - (len(lines[1]) - len(lines[1].lstrip()))
            column -= message.startswith("lexical error")  # yajl's caret is past the character it could not read
            offset = tracked.window_start + found + max(column, 0)
    before = tracked.window[max(0, offset - tracked.window_start - 60):offset - tracked.window_start]
    after = tracked.window[offset - tracked.window_start:offset - tracked.window_start + 20]
    context = before.decode("utf-8", "replace") + " <-- here --> " + after.decode("utf-8", "replace")
    if "premature EOF" in message or offset >= tracked.read_bytes and not after:
        return (f"it ends at byte {offset} in the middle of its data (cut short: a partial download or copy?); "
                f"its last bytes: {before.decode('utf-8', 'replace')!r}")
    return f"{message} at byte {offset}: {context!r}"


class _Reading:
    """The state of one file's read: which image ids are known, and what waits for an image entry."""

    def __init__(self, found: CocoSet, max_pixels: int = masks.DEFAULT_MAX_PIXELS) -> None:
        self.found, self.max_pixels = found, max_pixels
        self.index_of: dict[object, int] = {}
        self.first_of: dict[str, object] = {}  # relpath -> the image id that named it first
        self.refused: dict[object, list] = {}  # image id of a second entry for a file -> [the first's id, its objects]
        self.waiting: dict[object, tuple[bytearray, list]] = {}  # image id not yet listed -> its objects, [(place, id)]
        self.good: set[object] = set()  # category ids of the objects packed without a fault
        self.position = 0  # annotations read so far
        self.named: list[tuple[int, str]] = []  # (refusal index, name) of a category_id given as a class name

    def category(self, item: dict) -> None:
        category, name = item.get("id"), item.get("name")
        if not isinstance(category, int) or not isinstance(name, str) or not name:
            raise InputError(f"{self.found.where}: category {str(item)[:80]} needs an integer id and a name")
        if category in self.found.categories:
            raise InputError(f"{self.found.where}: category id {category} is listed twice")
        self.found.categories[category] = name
        self.found.supercategories[category] = item.get("supercategory")

    def image(self, item: dict) -> None:
        found = self.found
        image_id, name = item.get("id"), item.get("file_name")
        if image_id is None or isinstance(image_id, (list, dict)) or not isinstance(name, str) or not name:
            raise InputError(f"{found.where}: image {str(item)[:80]} needs an id and a file_name")
        if image_id in self.index_of or image_id in self.refused:
            raise InputError(f"{found.where}: image id {image_id} is listed twice")
        objects = self.waiting.pop(image_id, (bytearray(), []))[0]
        name = name.replace("\\", "/")  # Label Studio on Windows writes images\\<name>; ..\\ is still refused
        relpath = posixpath.join(found.folder, name) if found.folder else name
        if relpath in self.first_of:
            self.refused[image_id] = [self.first_of[relpath], len(objects) // _PACKED.size]
            return
        self.first_of[relpath] = image_id
        self.index_of[image_id] = len(found.relpaths)
        width, height = item.get("width"), item.get("height")
        found.relpaths.append(relpath)
        found.frames.append((width, height) if isinstance(width, int) and isinstance(height, int) and width > 0
                            and height > 0 else annotations.STORED)
        found.source_ids.append(str(image_id) if isinstance(image_id, int) else annotated_plan.derived_source_id(relpath))
        found.packed.append(objects)

    def annotation(self, item: dict) -> None:
        """Packs one annotation under its image (or, its image not yet listed, under its image id)."""
        position, self.position = self.position, self.position + 1
        image_id = item.get("image_id")
        image_id = json.dumps(image_id) if isinstance(image_id, (list, dict)) else image_id
        if image_id in self.refused:
            self.refused[image_id][1] += 1
            return
        index = self.index_of.get(image_id)
        if index is None:
            packed, ids = self.waiting.setdefault(image_id, (bytearray(), []))
            ids.append((position, item.get("id")))
        else:
            packed = self.found.packed[index]
        frame = self.found.frames[index] if index is not None else annotations.STORED
        packed += self._packed(item, position, None if frame == annotations.STORED else frame)

    def _packed(self, item: dict, position: int, frame: Optional[tuple[int, int]]) -> bytes:
        """One annotation as :data:`_PACKED`: a box, or a refusal (with its reason kept aside)."""
        found, blobs = self.found, self.found.blobs
        ann = item.get("id")
        no_id = 0 if isinstance(ann, int) and not isinstance(ann, bool) else _NO_ID
        ann = ann if not no_id else position  # the report names it by its place in the file
        category, bbox = item.get("category_id"), item.get("bbox")
        refusal = None
        if not isinstance(category, int):  # no category id can match it
            refusal = (annotations.UNKNOWN_CLASS, _unknown(category))
        elif not (isinstance(bbox, list) and len(bbox) == 4 and isinstance(bbox[0], _NUMBER)
                  and isinstance(bbox[1], _NUMBER) and isinstance(bbox[2], _NUMBER) and isinstance(bbox[3], _NUMBER)):
            refusal = (annotations.BAD_ANNOTATION, f"bbox {str(bbox)[:60]} is not [x, y, width, height]")
        elif blobs is not None and (problem := masks.segmentation_problem(item.get("segmentation"), frame,
                                                                          self.max_pixels)) is not None:
            refusal = (annotations.BAD_MASK, f"--masks: {problem}")
        if refusal is not None:
            if isinstance(category, str):  # a class name where the id goes: its near category, once all are read
                self.named.append((len(found.refusals), category))
            found.refusals.append(refusal)
            return _PACKED.pack(ann, category if isinstance(category, int) else -1, 0, 0, 0, 0, -1, _REFUSED | no_id,
                                len(found.refusals) - 1, 0)
        x0, y0, x1, y1 = annotations.corners("coco", float(bbox[0]), float(bbox[1]), float(bbox[2]), float(bbox[3]))
        area = item.get("area")
        area = float(area) if isinstance(area, (int, float)) and area >= 0 else -1.0
        offset, length = blobs.add(item["segmentation"]) if blobs is not None else (0, 0)
        self.good.add(category)
        return _PACKED.pack(ann, category, x0, y0, x1, y1, area, (_CROWD if item.get("iscrowd", 0) else 0) | no_id,
                            offset, length)

    def finish(self, warnings: list[str], required: bool) -> CocoSet:
        """The set, once the whole file is read; the refused entries and the orphans named in ``warnings``."""
        found, where = self.found, display_path(self.found.where)
        if not found.categories and required:
            raise InputError(f"{found.where} lists no categories; an instances file names its classes in "
                             "\"categories\"")
        found.used = {category for category in self.good if category in found.categories}
        ids = {name: category for category, name in found.categories.items()}
        for index, name in self.named:  # "did you mean 18 ('dog')?", as for CVAT's and VOC's label typos
            near = annotated_plan.near_name(name, ids)
            if near:
                reason, detail = found.refusals[index]
                found.refusals[index] = (reason, f"{detail}: did you mean {ids[near]} ({near!r})?")
        for image_id, (first, count) in list(self.refused.items())[:5]:
            warnings.append(f"{where}: image id {image_id} names the file of image id {first}: refused, "
                            f"with its {count} annotations (one image, one entry)")
        if len(self.refused) > 5:
            warnings.append(f"{where}: {len(self.refused) - 5} more image entries name an earlier entry's file")
        orphans = sorted(pair for _, ids in self.waiting.values() for pair in ids)
        if orphans:
            shown = ", ".join(str(ann) for _, ann in orphans[:5])
            warnings.append(f"{where}: {len(orphans)} annotations name an image id that its \"images\" do not "
                            f"list, and were not written (annotation ids {shown}{' ...' if len(orphans) > 5 else ''})")
        self.waiting.clear()
        return found

"""List SRC: every file and folder under it, relative and ``/``-separated; the one part that touches a file system.

In:  ``--src`` (a local folder, followed through symbolic links, or a prefix in an object store).
Out: a :class:`Listing` (files, folders, what the walk passed over), the input of every source's plan
     (:mod:`beam_jobs.planning.discover` for class folders, :mod:`beam_jobs.sources` for the others).

Given a local ``scratch`` folder, the file paths are streamed into a file
there as they are found (:class:`beam_jobs.files.work_records.Spilled`), so the
launcher's memory does not grow with the number of images; without one
(tests, small inputs) they are held in memory, sorted.

What a source passes over is accounted for here too (:class:`SkippedFiles`): each file skipped without being
converted, with its reason, for ``skipped.jsonl`` beside ``rejected.jsonl``; and :func:`not_an_image` tells a
file no image source can read (neither its name's extension nor its first bytes say image) from an image.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import json
import os
import uuid
from typing import BinaryIO, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from PIL import Image

from beam_jobs import formats, image_headers

from beam_jobs.files import external_sort, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.runtime import interrupt

# Files that operating systems and tools leave in image folders.
SYSTEM_FILES = frozenset({"thumbs.db", "desktop.ini", ".ds_store"})


class InputError(ValueError):
    """SRC (or --labels) does not describe a dataset we can convert."""


@dataclasses.dataclass(frozen=True)
class Listing:
    """What a walk of SRC found: file paths and folder paths, relative to SRC.

    ``files`` is any re-iterable collection (a tuple, or a scratch file's
    :class:`beam_jobs.files.work_records.Spilled`); rules read it in passes. When
    SRC holds archives (:mod:`beam_jobs.sources.archives.archives`), their members are
    files at the paths their extraction would give, and ``located`` holds
    ``(path, source)`` for every file, in the order of ``files`` (the source
    locates a member's bytes; "" for a plain file).
    """

    files: Iterable[str]
    dirs: tuple[str, ...] = ()
    # Reason -> count of entries the walk itself passed over (symlink loops...).
    skipped: Mapping[str, int] = dataclasses.field(default_factory=dict)
    located: Optional[Iterable[tuple[str, str]]] = None
    # (path as shown, refusal locator) of archive entries that have no place in the tree (a member named
    # "../x", a tar cut short): listed only to be rejected, with their reason, by validation.
    refused: tuple[tuple[str, str], ...] = ()
    # Folder -> the archive it is the extraction of (as the user sees it: "crane.tar", "train.tar/n01.tar"),
    # so a message about the folder names the file the user has.
    archive_folders: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def entries(self) -> Iterator[tuple[str, str]]:
        """``(path, source)`` of every file."""
        return iter(self.located) if self.located is not None else ((path, "") for path in self.files)


def scratch_file(scratch: str, name: str) -> str:
    """A new file name in the launcher's scratch folder."""
    return os.path.join(scratch, f"{name}-{uuid.uuid4().hex[:12]}")


def is_hidden(part_or_path: str) -> bool:
    """Whether any part of the path starts with a dot (checked per image: no split)."""
    return part_or_path.startswith(".") or "/." in part_or_path


def skip_reason(path: str, skipped: Optional[collections.Counter]) -> bool:
    """Whether ``path`` is never read (hidden and system files), counted in ``skipped`` when given (and
    listed, when ``skipped`` is a :class:`SkippedFiles`)."""
    name = path.rsplit("/", 1)[-1]
    reason = "system-file" if name.lower() in SYSTEM_FILES else "hidden" if is_hidden(path) else ""
    if reason and isinstance(skipped, SkippedFiles):
        skipped.add(path, reason, _SKIP_DETAILS[reason])
    elif reason and skipped is not None:
        skipped[reason] += 1
    return bool(reason)


_SKIP_DETAILS = {"system-file": "a file the operating system leaves in folders",
                 "hidden": "a hidden file, or in a hidden folder (its name, or a folder's, starts with a dot)"}
NOT_AN_IMAGE = "not-an-image"
# Reasons that stand for an annotation file's name too: its folder (a converted dataset's), its sample (a
# WebDataset sample's .json member: metadata, read for a label or not), or its Parquet dataset (a file of a split or
# config the run does not convert): never a dataset left out without a word.
_KEPT_REASONS = ("converted-dataset", "sample-metadata", "other-split", "other-config")
SORT_RUN = 100_000  # skipped.jsonl lines sorted in memory at once (~15 MB)
ANNOTATIONS_NOT_READ = "annotations-not-read"
# Annotation files by extension (COCO and Label Studio JSON, CVAT and VOC XML, YOLO's yaml, Parquet) -> words.
_ANNOTATION_KINDS = {"json": "a JSON file (COCO, Label Studio)", "xml": "an XML file (CVAT, Pascal VOC)",
                     "yaml": "a YAML file (a YOLO dataset's)", "yml": "a YAML file (a YOLO dataset's)",
                     "parquet": "a Parquet file"}


def annotation_kind(path: str) -> Optional[str]:
    """What kind of annotation file ``path`` is by its name (see :data:`_ANNOTATION_KINDS`), or None."""
    name = path.rpartition("/")[2].lower()
    return _ANNOTATION_KINDS.get(name.rpartition(".")[2]) if "." in name else None


class SkippedFiles(collections.Counter):
    """Reason -> count of the files of SRC skipped without being converted, and each one named.

    A Counter (what every source's plan counts its skips in), whose :meth:`add` also keeps the file's
    ``(path, reason, detail)``: in memory, or, given a local ``scratch`` folder, as ``skipped.jsonl`` lines in
    a file there (a tree of a million hidden files costs the launcher no memory). :meth:`lines` gives them
    back sorted (the same bytes whatever the listing's order). Counts added without a path (``+=``: the
    walk's passed-over entries) are counted, not named.
    """

    EXAMPLES = 3  # the first few files of each reason by name, for the run's summary
    ANNOTATIONS_NAMED = 10  # annotation files no source read, named in a warning each (then how many more)

    def __init__(self, counts: Optional[Mapping[str, int]] = None, scratch: Optional[str] = None) -> None:
        super().__init__(counts or {})
        self._held: list[str] = []
        self._path = scratch_file(scratch, "skipped") if scratch else None
        self._file: Optional[BinaryIO] = None  # opened at the first add, closed when the lines are read
        self.examples: dict[str, list[str]] = {}
        self.annotations: list[str] = []  # the first ANNOTATIONS_NAMED annotation files skipped, in the order added
        self.num_annotations = 0

    def add(self, path: str, reason: str, detail: str = "", warned: bool = False) -> None:
        """Count ``path`` as skipped for ``reason`` and name it (``detail``: why, in words). An annotation
        file (:func:`annotation_kind`) is skipped as ``annotations-not-read`` whatever the caller's reason
        (but a hidden one), and kept for :meth:`annotation_warnings` (unless the caller ``warned`` of it)."""
        kind = annotation_kind(path)
        if kind and reason not in (*_SKIP_DETAILS, *_KEPT_REASONS) and reason != ANNOTATIONS_NOT_READ:
            reason, detail = ANNOTATIONS_NOT_READ, f"{kind} that the layout read does not use"
        if reason == ANNOTATIONS_NOT_READ and not warned:
            self.num_annotations += 1  # named up to a few: a tree with a .json beside each image has N of them
            if len(self.annotations) < self.ANNOTATIONS_NAMED:
                self.annotations.append(display_path(path))
        self[reason] += 1
        shown = display_path(path)
        line = json.dumps({"path": shown, "reason": reason, "detail": detail}, ensure_ascii=False)
        if self._path is not None:
            if self._file is None:
                self._file = open(self._path, "ab")
            self._file.write(line.encode("utf-8") + b"\n")
        else:
            self._held.append(line)
        examples = self.examples.setdefault(reason, [])  # the first few by name, whatever the listing's order
        if len(examples) < self.EXAMPLES or shown < examples[-1]:
            examples.append(shown)
            examples.sort()
            del examples[self.EXAMPLES:]

    def lines(self) -> Iterator[str]:
        """Each named file's ``skipped.jsonl`` line (no newline), sorted: the same bytes whatever order the
        listing came in (a folder's walk, the same tree in a tar). Spilled ones are sorted in runs of
        :data:`SORT_RUN` lines, merged (memory: one run)."""
        if self._path is None:
            yield from sorted(self._held)
            return
        self.close()
        if not os.path.exists(self._path):
            return
        runs: list[BinaryIO] = []
        try:
            with open(self._path, "rb") as handle:
                while chunk := list(itertools.islice(handle, SORT_RUN)):
                    run = open(scratch_file(os.path.dirname(self._path), "skipped-run"), "w+b")
                    runs.append(run)
                    run.writelines(line if line.endswith(b"\n") else line + b"\n" for line in sorted(chunk))
                    run.seek(0)
            for raw in heapq.merge(*runs):
                yield raw.decode("utf-8").rstrip("\n")
        finally:
            for run in runs:
                run.close()
                os.remove(run.name)

    def close(self) -> None:
        """Close the spilled lines' file (a later :meth:`add` opens it again, appending)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def annotation_warnings(self, src: str, shown: int = 10) -> list[str]:
        """A warning naming each annotation file skipped (the first ``shown``, then how many more): an
        annotation file no source read may be a dataset, or a part of one, that this run leaves out."""
        named = self.annotations[:min(shown, self.ANNOTATIONS_NAMED)]
        warnings = [f"{src.rstrip('/')}/{path}: an annotation file that no source read: skipped ({ANNOTATIONS_NOT_READ} in "
                    "skipped.jsonl). If it labels images of SRC, convert it on its own (--annotations FILE, or "
                    "--src its dataset's folder)" for path in named]
        if self.num_annotations > len(named):
            warnings.append(f"{self.num_annotations - len(named)} more annotation files were not read: "
                            f"{ANNOTATIONS_NOT_READ} in skipped.jsonl names each")
        return warnings

    def counts(self) -> dict[str, int]:
        """Reason -> count, sorted by reason (the manifest's ``skipped_by_reason``)."""
        return dict(sorted((reason, count) for reason, count in self.items() if count))


def head_of(open_file: Callable[[str, str], BinaryIO]) -> Callable[[str, str], bytes]:
    """``(path, source) -> its first bytes`` (:data:`HEAD_BYTES`), from a reader's ``open`` (a listed file,
    an archive member)."""
    def head(path: str, source: str) -> bytes:
        with open_file(path, source) as handle:
            return handle.read(HEAD_BYTES)
    return head


def not_an_image(name: str, read_head: Callable[[], bytes]) -> Optional[str]:
    """Why a file is no image any source can read (its detail for ``skipped.jsonl``), or None if it may be one.

    A file is taken for an image when its name has the extension of a format the converter reads (a
    damaged ``x.png`` is then rejected, by name, as a damaged image), or when its first bytes are the magic
    bytes of such a format, or of an image format it refuses with a reason worth reading (HEIC without the
    extra, SVG, EPS: rejected, saying so). Anything else (a ROM beside its sprites, a README, a ``.csv``) is
    skipped, never rejected: it says nothing about the images, so it must not fail a run or weigh in the
    validation carve. ``read_head()`` gives the file's first bytes (at least 64); it is called only for a
    name without an image extension. A file that cannot be read is left to validation (its rejection names
    the error).
    """
    if formats.has_image_extension(name):
        return None
    try:
        head = read_head()
    except (OSError, ValueError):
        return None
    if not head:
        return None  # an empty file: rejected as empty-file (an image that did not get written)
    if image_headers.sniff_format(head) or _pillow_accepts(head):
        return None
    known = formats.unsupported_format(head)
    if known == "PDF":
        return "a PDF document, not an image"
    if known is not None:
        return None  # an image format the converter refuses: validation names it
    extension = name.rpartition(".")[2].lower() if "." in name.lstrip(".") else ""
    return (f"neither its name (.{extension}) nor its first bytes are those of an image format the converter "
            "reads" if extension else "its name has no extension and its first bytes are those of no image "
            "format the converter reads")


HEAD_BYTES = 64  # what not_an_image reads of a file (Pillow's own identification reads 16)


def _pillow_accepts(head: bytes) -> bool:
    """Whether a format the converter reads claims these first bytes (Pillow's check of its magic bytes).
    Formats without magic bytes (TGA, IM) are recognised by their extension only."""
    Image.init()
    for name in formats.allowed():
        accept = Image.OPEN[name][1]
        try:
            if accept is not None and accept(head[:16]):
                return True
        except Exception:  # noqa: BLE001 - a plugin's check that trips on odd bytes has not claimed them
            continue
    return False


def display_path(relpath: str) -> str:
    """``relpath`` as valid text: bytes of a name that is not UTF-8 become ``\\xNN`` escapes.

    On POSIX a file name is bytes; Python lists one that is not UTF-8 with
    surrogate escapes, which no text format (JSON, Beam's string coder, a
    record's UTF-8 ``image/filename``) can hold. Such a file is still read by
    its real name; reports and records name it like this (``caf\\xe9.jpg``).
    """
    try:
        relpath.encode("utf-8")
        return relpath
    except UnicodeEncodeError:
        return relpath.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def list_tree(src: str, scratch: Optional[str] = None) -> Listing:
    """List every file and folder under ``src``, relative and ``/``-separated.

    Local folders are walked following symbolic links; a link back to a folder
    already walked (a loop, or a second route to the same folder) is skipped
    and counted, so a loop cannot hang the listing or duplicate images. Other
    file systems (``gs://``, ``s3://``...) are listed page by page through
    Beam's file system. With a local ``scratch`` folder, file paths are
    streamed to a file there as they are found (held: folders only); without
    one they are held in memory, sorted.

    Raises:
      InputError: ``src`` does not exist or is not a folder.
    """
    skipped: collections.Counter[str] = collections.Counter()
    dirs: list[str] = []
    return listing_of(src, walk(src, dirs, skipped), dirs, skipped, scratch)


def walk(src: str, dirs: list[str], skipped: collections.Counter) -> Iterator[str]:
    """The files under ``src`` as :func:`list_tree` finds them (folders go to ``dirs``, passed-over entries
    are counted in ``skipped``), streamed."""
    if FileSystems.get_scheme(src) in (None, "file"):
        return _walk_local(src, dirs, skipped)
    return _walk_remote(src)


def listing_of(src: str, files: Iterable[str], dirs: Iterable[str], skipped: Mapping[str, int],
               scratch: Optional[str] = None, located: Optional[Iterable[tuple[str, str]]] = None,
               refused: Callable[[], Sequence[tuple[str, str]]] = tuple,
               archive_folders: Optional[Mapping[str, str]] = None,
               container: Optional[Callable[[str, str], str]] = None) -> Listing:
    """The :class:`Listing` of streamed ``files`` (or ``located`` ``(path, source)`` entries): spilled to
    ``scratch`` as they come, or held sorted. ``dirs``, ``skipped`` and ``refused()`` are read once the
    stream has been consumed (a walk fills them as it goes). ``located`` entries (archives read as folders)
    must give each path once (:func:`refuse_clashes`; ``container`` names what gives an entry).

    Raises:
      InputError: two entries give one path (``cat/`` beside ``cat.tar``), naming both.
    """
    if located is None:
        entries: Iterable[tuple[str, str]] = ((path, "") for path in files)
    else:
        entries = located
    if scratch is None:
        held = tuple(sorted(entries))
        listed: Iterable[str] = tuple(path for path, _ in held)
        pairs: Optional[Iterable[tuple[str, str]]] = held if located is not None else None
    else:
        spilled = work_records.spill(scratch_file(scratch, "listing"), work_records.PATH, entries,
                                     lambda entry: work_records.encode_path(*entry), work_records.decode_path)
        listed = spilled
        pairs = work_records.Spilled(spilled.path, work_records.PATH, work_records.decode_entry, len(spilled)) \
            if located is not None else None
    if pairs is not None:
        refuse_clashes(src, pairs, scratch, container or plain_container)
    if not FileSystems.get_scheme(src) in (None, "file") and not len(listed):
        raise InputError(f"--src {src!r} holds no files (or does not exist)")
    return Listing(listed, tuple(sorted(set(dirs))), dict(skipped), pairs, tuple(refused()),
                   dict(archive_folders or {}))


def plain_container(path: str, source: str) -> str:
    """What gives listed ``path`` when it is a plain file of SRC (``source`` ""): its folder."""
    folder = path.rpartition("/")[0]
    return f"the folder {display_path(folder)}/" if folder else f"the file {display_path(path)}"


def refuse_clashes(src: str, entries: Iterable[tuple[str, str]], scratch: Optional[str],
                   container: Callable[[str, str], str]) -> None:
    """Raise :class:`InputError` when two ``(path, source)`` entries give one path, naming what gives each.

    Two containers of SRC can place a file at one path: a folder beside the archive it was extracted from
    (``cat/`` and ``cat.tar``), two archives of one name (``cat.tar`` and ``cat.zip``). Both would become one
    record name, which names a record once (the sources table, the shards' order): caught here, before any
    conversion work, instead of as a crash after it (issue #59's review, finding 4). Hidden and system files
    are never read, so theirs do not count. The entries are sorted by path (on disk in ``scratch``, a run of
    :data:`beam_jobs.files.external_sort.RUN_BYTES` at a time: memory flat) and equal neighbours compared.
    """
    records = (path.encode("utf-8", "surrogateescape") + b"\0" + source.encode("utf-8", "surrogateescape")
               for path, source in entries)
    if scratch is None:
        ordered: Iterable[bytes] = sorted(records)
    else:
        order = external_sort.ExternalSort(scratch, "names")
        for record in records:
            order.add(record)
        ordered = order.sorted()
    last, last_source = b"", b""
    for record in ordered:
        path, _, source = record.partition(b"\0")
        if path == last:
            name = path.decode("utf-8", "surrogateescape")
            if not skip_reason(name, None):
                first, second = sorted(container(name, text.decode("utf-8", "surrogateescape"))
                                       for text in (last_source, source))
                raise InputError(f"{display_path(name)} is given by {first} and by {second} of {src}: two "
                                 "images would have one record name; rename one or move it out of SRC")
        last, last_source = path, source


def _walk_local(src: str, dirs: list[str], skipped: collections.Counter) -> Iterator[str]:
    """Files under a local ``src``, depth first, each folder's entries by name; folders go to ``dirs``."""
    root = src[len("file://"):] if src.startswith("file://") else src
    if not os.path.isdir(root):
        raise InputError(f"--src {src!r} is not a folder" if os.path.exists(root) else f"--src {src!r} does not exist")
    seen = {_identity(root)}
    stack = [("", root)]
    while stack:
        interrupt.raise_if_received()  # a signal whose exception was lost (see interrupt.raise_if_received)
        rel, path = stack.pop()
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except OSError as err:
            raise InputError(f"folder {path!r} under --src could not be listed: {err}") from err
        for entry in entries:
            child = f"{rel}{entry.name}"
            try:
                is_dir = entry.is_dir()  # follows symbolic links
                is_file = not is_dir and entry.is_file()
            except OSError:
                skipped["unreadable-entry"] += 1
                continue
            if is_dir:
                identity = _identity(entry.path)
                if identity in seen:
                    skipped["repeated-folder-link"] += 1
                    continue
                seen.add(identity)
                dirs.append(child)
                stack.append((child + "/", entry.path))
            elif is_file:
                yield child
            else:
                skipped["not-a-regular-file"] += 1  # dangling links, sockets, fifos


def _identity(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _walk_remote(src: str) -> Iterator[str]:
    """Files under ``src`` in an object store, streamed page by page (never the whole listing at once).

    Beam's ``FileSystems.match`` gathers every match into one list; the file
    system's own ``_list`` generator pages through the store's listing.
    """
    base = src.rstrip("/") + "/"
    for meta in FileSystems.get_filesystem(base)._list(base):
        if not meta.path.endswith("/"):
            yield meta.path[len(base):]

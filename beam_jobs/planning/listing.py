"""List SRC: every file and folder under it, relative and ``/``-separated; the one part that touches a file system.

In:  ``--src`` (a local folder, followed through symbolic links, or a prefix in an object store).
Out: a :class:`Listing` (files, folders, what the walk passed over), the input of every source's plan
     (:mod:`beam_jobs.planning.discover` for class folders, :mod:`beam_jobs.sources` for the others).

Given a local ``scratch`` folder, the file paths are streamed into a file
there as they are found (:class:`beam_jobs.files.work_records.Spilled`), so the
launcher's memory does not grow with the number of images; without one
(tests, small inputs) they are held in memory, sorted.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import uuid
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from beam_jobs.files import work_records
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
    """Whether ``path`` is never read (hidden and system files), counted in ``skipped`` when given."""
    name = path.rsplit("/", 1)[-1]
    reason = "system-file" if name.lower() in SYSTEM_FILES else "hidden" if is_hidden(path) else ""
    if reason and skipped is not None:
        skipped[reason] += 1
    return bool(reason)


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
               archive_folders: Optional[Mapping[str, str]] = None) -> Listing:
    """The :class:`Listing` of streamed ``files`` (or ``located`` ``(path, source)`` entries): spilled to
    ``scratch`` as they come, or held sorted. ``dirs``, ``skipped`` and ``refused()`` are read once the
    stream has been consumed (a walk fills them as it goes)."""
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
    if not FileSystems.get_scheme(src) in (None, "file") and not len(listed):
        raise InputError(f"--src {src!r} holds no files (or does not exist)")
    return Listing(listed, tuple(sorted(set(dirs))), dict(skipped), pairs, tuple(refused()),
                   dict(archive_folders or {}))


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

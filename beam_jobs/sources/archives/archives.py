"""Archives as the input: wherever a folder is read, a ``.tar``, ``.tar.gz``, ``.zip``... reads as its extraction.

In:  SRC (a folder, or itself an archive), local or in an object store.
Out: a :class:`beam_jobs.planning.discover.Listing` whose files are the paths the
     extraction would give, each with its locator (where its bytes sit: a
     range of the archive file; see :mod:`beam_jobs.sources.archives.archive_members`),
     so every other source (class folders, ImageNet, label files) plans it as
     it plans a folder, and the conversion writes the bytes of the extraction.

The rule, "an archive is a folder":

* ``shapes.zip`` is the folder ``shapes/`` (its stem); ImageNet's own names read
  as the split folders its layout uses (``ILSVRC2012_img_train.tar`` is
  ``train/``, ``ILSVRC2012_img_val.tar`` is ``val/``). Archives inside archives
  (ImageNet's tar of class tars) read the same way, to :data:`MAX_DEPTH`.
* An archive whose members all sit under one top folder reads as that folder
  (what ``zip -r shapes.zip shapes/`` and Kaggle's ``train.zip`` hold), when
  that folder bears the archive's name or holds folders itself: it is the folder
  a user gets by extracting and pointing at what appeared. An archive holding
  one class folder (``cat.zip`` of ``kitten/*.jpg``) keeps it.
* A later member of a name replaces an earlier one, as ``tar -x`` and
  ``unzip -o`` do (the earlier is rejected as ``duplicate-member``).

Reading: an uncompressed tar and a zip are read in place, by offset, by every
worker at once (an inner tar of an uncompressed tar is a range of the outer
file). A compressed tar (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``) can only be
read front to back: the launcher inflates it once, into the run's work folder
(:mod:`beam_jobs.sources.archives.compressed`; temporary disk: its uncompressed size,
gone when the run ends), and it is then read like a tar; so is an archive
stored deflated inside a zip. The headers of the tars under SRC may be read by
the workers before the listing (:mod:`beam_jobs.sources.archives.archive_scan`): the
listing then reads their member tables instead, and is the same.

Hostile archives cost only themselves: every member the table refuses (unsafe
names, links, devices, bombs, overlaps, a cut) is listed only to be rejected
with its reason; nothing is extracted, and no member path is trusted.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import marshal
import os
import posixpath
import tempfile
from typing import BinaryIO, Callable, Iterable, Iterator, Optional, Protocol

import record_schema
from beam_jobs.files.filesystems import FileSystems, open_for_scanning
from beam_jobs.planning import discover
from beam_jobs.planning.discover import InputError, Listing
from beam_jobs.runtime import interrupt
from beam_jobs.sources.archives import archive_members, compressed, tar_members, zip_members
from beam_jobs.sources.archives.archive_members import ArchiveError, Member, RangeFile, Refused
from beam_jobs.sources.archives.compressed import Inflated

logger = logging.getLogger(__name__)

# Name endings read as archives, longest first, and how each is read.
SUFFIXES = (
    (".tar.gz", "gz"), (".tar.bz2", "bz2"), (".tar.xz", "xz"), (".tgz", "gz"), (".tbz2", "bz2"), (".tbz", "bz2"),
    (".txz", "xz"), (".tar", "tar"), (".zip", "zip"),
)
# ImageNet's archives read as the split folders its layout uses.
SPLIT_ARCHIVES = {"ilsvrc2012_img_train": "train", "ilsvrc2012_img_val": "val", "ilsvrc2012_img_test": "test"}
# Archives inside archives are read to this depth; deeper ones are refused (a zip quine nests forever).
MAX_DEPTH = 8


def archive_kind(name: str) -> Optional[tuple[str, str]]:
    """``(kind, stem)`` when ``name`` reads as an archive (kind: tar, zip, gz, bz2, xz), else None."""
    lower = name.lower()
    for suffix, kind in SUFFIXES:
        if lower.endswith(suffix) and len(name) > len(suffix):
            return kind, name[: -len(suffix)]
    return None


def is_tar(name: str) -> bool:
    """Whether a file of this name reads as an uncompressed tar (whose headers the workers may read)."""
    kind = archive_kind(name)
    return kind is not None and kind[0] == "tar"


def folder_name(stem: str) -> str:
    """The folder an archive of this stem reads as (its stem; ImageNet's split archives as their split)."""
    return SPLIT_ARCHIVES.get(stem.lower(), stem)


def is_archive_file(src: str) -> bool:
    """Whether ``--src`` names an archive file rather than a folder."""
    if archive_kind(posixpath.basename(src.rstrip("/"))) is None:
        return False
    if FileSystems.get_scheme(src) in (None, "file"):
        return os.path.isfile(src[len("file://"):] if src.startswith("file://") else src)
    return FileSystems.exists(src)


@dataclasses.dataclass(frozen=True)
class Damage:
    """An archive inside SRC that lost images: refused whole (an inner archive that is not one, or nested too
    deep: ``size`` bytes of it read as nothing), or ``cut`` short (the members before the cut were read)."""

    archive: str  # as messages name it
    cut: bool
    size: int
    detail: str


@dataclasses.dataclass(frozen=True)
class ArchiveListing:
    """What :func:`list_tree` found: the listing, the archives it inflated, each top-level archive's identity,
    and the archives that lost images, with the members read and their bytes to estimate how many."""

    listing: Listing
    inflated: tuple[Inflated, ...]
    identities: dict[str, str]
    damaged: tuple[Damage, ...] = ()
    members: int = 0
    member_bytes: int = 0

    def losses(self) -> tuple[int, list[str]]:
        """The images lost in archives refused whole, beyond the one rejection each counts, and a warning
        naming each damaged archive.

        An archive refused whole held about its bytes' share of images (its size over the mean stored size
        of the members read), so a lost class archive fails the error budget instead of passing as one bad
        input. What a cut took cannot be told from the file: it is named, not counted.
        """
        mean = self.member_bytes / self.members if self.members else 0.0
        extra, warnings = 0, []
        for damage in self.damaged:
            if damage.cut:
                warnings.append(f"{damage.archive} is cut short ({damage.detail}): its members before the cut are "
                                "converted, and what came after is lost, how much cannot be told from the file (a "
                                "partial download or copy? compare its size with the original's)")
                continue
            count = max(1, round(damage.size / mean)) if mean else 1
            extra += count - 1
            warnings.append(f"{damage.archive} could not be read ({damage.detail}): about {count} images are lost "
                            f"(its {damage.size:,} bytes at the {mean:,.0f} bytes of an image read from the "
                            f"archives); they count against --max-bad-fraction (see {record_schema.REJECTED_FILE})")
        return extra, warnings


@dataclasses.dataclass(frozen=True)
class TarUnit:
    """An uncompressed tar whose headers may be read apart from the listing (by the workers, see
    :mod:`beam_jobs.sources.archives.archive_scan`): ``size`` bytes at ``base`` of the file at ``path``, which
    member locators name ``file``; ``depth``: how many archives hold it."""

    path: str
    file: str
    base: int
    size: int
    depth: int = 0
    in_work: bool = False


class MemberTables(Protocol):
    """Member tables read before the listing: a tar's entries as :func:`tar_members.scan_tar` gives them."""

    def scan(self, unit: TarUnit) -> Optional[Callable[[], Iterator[archive_members.Entry]]]: ...

    def remove(self) -> None: ...


# Given the top-level tars, reads their headers elsewhere (on the workers) and returns the tables, or None.
Scanner = Callable[[list[TarUnit]], Optional[MemberTables]]


def list_tree(src: str, scratch: Optional[str] = None, limit: int = 1 << 62,
              scanner: Optional[Scanner] = None) -> ArchiveListing:
    """List ``src`` (a folder, or an archive) with every archive in it read as a folder.

    ``scratch``: a local folder for the listing and for inflated compressed
    archives (:class:`Inflated`: the launcher places them in the run's work
    folder, which their members' locators name). ``limit``: the most bytes one
    member may inflate to. ``scanner``: reads the top-level tars' headers
    before the listing (on the workers); without it, or when it declines, the
    listing reads them.

    Raises:
      InputError: SRC does not exist; an archive is not one (a ``.zip`` that
        is not a zip, a corrupt central directory), naming it.
    """
    dirs: list[str] = []
    skipped: collections.Counter[str] = collections.Counter()
    lister = _ArchiveLister(src, scratch, dirs, limit)
    try:
        if is_archive_file(src):
            if scanner and is_tar(posixpath.basename(src.rstrip("/"))):
                lister.tables = scanner([TarUnit(src, "", 0, _size(src))])
            entries = lister.archive_as_root(src)
        else:
            paths: Iterable[str] = discover.walk(src, dirs, skipped)
            if scanner:  # walked once to find the tars, then replayed to list them
                paths, tars = _walked(paths, scratch)
                lister.tables = scanner([TarUnit(lister.full(path), path, 0, _size(lister.full(path)))
                                         for path in tars]) if tars else None
            entries = lister.expand(paths)
        listing = discover.listing_of(src, (), dirs, skipped, scratch, located=_counted(entries, lister),
                                      refused=lambda: lister.refused, archive_folders=lister.archive_folders,
                                      container=lister.container)
    finally:
        if lister.tables is not None:
            lister.tables.remove()
    lister.report()
    return ArchiveListing(listing, tuple(lister.inflated), dict(sorted(lister.identities.items())),
                          tuple(lister.damaged.values()), lister.members, lister.member_bytes)


def _walked(paths: Iterable[str], scratch: Optional[str]) -> tuple[Iterator[str], list[str]]:
    """``paths`` read to their end (spooled to ``scratch``, memory flat) and replayable once, and the tars among
    them."""
    spool = tempfile.TemporaryFile(dir=scratch)  # noqa: SIM115 (closed by the replay)
    tars = []
    for path in paths:
        marshal.dump(path, spool)
        if is_tar(posixpath.basename(path)):
            tars.append(path)
    spool.seek(0)

    def replay() -> Iterator[str]:
        with spool:
            while True:
                try:
                    yield marshal.load(spool)
                except EOFError:
                    return

    return replay(), tars


def _size(path: str) -> int:
    if FileSystems.get_scheme(path) in (None, "file"):
        return os.path.getsize(path[len("file://"):] if path.startswith("file://") else path)
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def _counted(entries: Iterator[tuple[str, str]], lister: "_ArchiveLister") -> Iterator[tuple[str, str]]:
    for entry in entries:
        if entry[1]:
            lister.members += 1
        yield entry


class _ArchiveLister:
    """Turns archives into listing entries: ``(path in the extraction, locator)``; refusals go to ``refused``."""

    def __init__(self, src: str, scratch: Optional[str], dirs: list[str], limit: int) -> None:
        self._src, self._dirs, self._limit = src, dirs, limit
        self._scratch = scratch
        self.refused: list[tuple[str, str]] = []
        self.inflated: list[Inflated] = []
        self._inflated_names: dict[str, str] = {}  # an inflated copy's name in the work folder -> its archive
        self.archives, self.members, self.stripped = 0, 0, []
        self.member_bytes = 0  # of the image members listed: the mean estimates what a lost archive held
        self.damaged: dict[str, Damage] = {}  # archive -> how it lost images (the first cause told)
        self.identities: dict[str, str] = {}  # top-level archive -> "size bytes, modified T": what resume checks
        self.archive_folders: dict[str, str] = {}  # extraction folder -> the archive it comes from (for messages)
        self.tables: Optional[MemberTables] = None  # tars whose headers were read before the listing

    # --- where archives are --------------------------------------------------------------------------------

    def expand(self, paths: Iterable[str]) -> Iterator[tuple[str, str]]:
        """The walk's files, each archive among them replaced by its members."""
        for path in paths:
            kind = archive_kind(posixpath.basename(path))
            if kind is None:
                yield path, ""
                continue
            folder = posixpath.join(posixpath.dirname(path), folder_name(kind[1]))
            yield from self._top_archive(self.full(path), path, kind[0], folder)

    def archive_as_root(self, src: str) -> Iterator[tuple[str, str]]:
        """SRC itself is an archive: its members are the tree (``--src shapes.zip`` is the folder ``shapes/``)."""
        name = posixpath.basename(src.rstrip("/"))
        kind = archive_kind(name)
        assert kind is not None
        yield from self._top_archive(src, "", kind[0], "", display=name)

    def container(self, path: str, source: str) -> str:
        """What gives listed ``path`` (``source``: its locator), as the user names it: a folder of SRC, or the
        archive holding it (the top one, for an archive in an archive): for a clash's message."""
        if not source:
            return discover.plain_container(path, source)
        located = archive_members.parse_locator(source)
        file = getattr(located, "file", "")
        name = self._inflated_names.get(file, file) if getattr(located, "in_work", False) else file
        return name or posixpath.basename(self._src.rstrip("/"))

    def full(self, relpath: str) -> str:
        """The path of the file at ``relpath`` under SRC."""
        return FileSystems.join(self._src, *relpath.split("/"))

    def _top_archive(self, path: str, file: str, kind: str, folder: str,
                     display: str = "") -> Iterator[tuple[str, str]]:
        """The members of the archive file at ``path`` (``file`` relative to SRC) as entries under ``folder``."""
        self.archives += 1
        display = display or file
        if folder:
            self._dirs.append(folder)
            self.archive_folders[folder] = display
        try:
            with open_for_scanning(path) as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                self.identities[display] = f"{size} bytes, modified {_modified(path)}"
                yield from self._archive(_Where(handle, 0, size, file, False), kind, folder, display, 0)
        except ArchiveError as err:
            raise InputError(f"{display} under --src is not a readable archive: {err}") from err
        except OSError as err:
            raise InputError(f"archive {display} under --src could not be read: {err}") from err

    # --- one archive --------------------------------------------------------------------------------------

    def _archive(self, where: "_Where", kind: str, folder: str, display: str, depth: int) -> Iterator[tuple[str, str]]:
        interrupt.raise_if_received()  # a signal whose exception was lost (see interrupt.raise_if_received)
        if kind in compressed.DECOMPRESSORS:
            copy, size = self._inflate(where, kind, display)
            with open(copy.local, "rb") as handle:
                yield from self._archive(_Where(handle, 0, size, copy.name, True), "tar", folder, display, depth)
            return
        name = posixpath.basename(folder) or folder_name(archive_kind(posixpath.basename(display))[1])
        if kind == "tar":  # two passes over the headers (memory does not follow the member count), one read
            unit = TarUnit("", where.file, where.base, where.size, depth, where.in_work)
            scan = self.tables.scan(unit) if self.tables else None
            top, entries = archive_members.streamed_folder_members(scan or archive_members.replayable(
                tar_members.scan_tar(RangeFile(where.handle, where.base, where.size), where.size, where.base),
                self._scratch), name)
        else:  # zipfile holds the central directory in memory anyway
            view = RangeFile(where.handle, where.base, where.size)
            members, refused, top = archive_members.folder_members(
                zip_members.scan_zip(view, where.base, self._limit), name)
            entries = iter([*refused, *members])
        if top:
            self.stripped.append((display, top))
        for member in entries:
            if isinstance(member, Refused):
                self._refusal(member, display)
                if kind == "tar" and member.reason == "truncated-archive":  # (a zip's is a member's, counted)
                    self._damaged(Damage(display, True, 0, member.detail))
                continue
            path = posixpath.join(folder, member.path) if folder else member.path
            parent = posixpath.dirname(path)
            if parent and parent != (self._dirs[-1] if self._dirs else None):  # members come folder by folder:
                self._dirs.append(parent)  # one entry per run, not one per member (a million in a big tar)
            inner = archive_kind(posixpath.basename(member.path))
            if inner is None:
                self.member_bytes += member.size
                yield path, archive_members.locator(where.file, member, where.in_work)
            elif depth + 1 >= MAX_DEPTH:
                stored = f"{top}/{member.path}" if top else member.path
                detail = f"an archive nested {MAX_DEPTH} deep (at most {MAX_DEPTH - 1} levels are read)"
                self._refusal(Refused(stored, "nested-too-deep", detail), display)
                self._damaged(Damage(f"{display}/{member.path}", False, member.size, detail))
            else:
                yield from self._inner(where, member, inner[0], posixpath.join(parent, folder_name(inner[1])),
                                       f"{display}/{member.path}", depth + 1)

    def _inner(self, where: "_Where", member: Member, kind: str, folder: str, display: str,
               depth: int) -> Iterator[tuple[str, str]]:
        """An archive inside an archive: a range of the same file when stored, else inflated once."""
        self.archives += 1
        self._dirs.append(folder)
        self.archive_folders[folder] = display
        try:
            if member.method == archive_members.STORED:
                yield from self._archive(_Where(where.handle, member.offset, member.size, where.file, where.in_work),
                                         kind, folder, display, depth)
                return
            inflated = self._new_inflated(display)
            with open(inflated.local, "wb") as out:
                archive_members.copy_member(where.handle, member, out)
            with open(inflated.local, "rb") as handle:
                yield from self._archive(_Where(handle, 0, member.length, inflated.name, True), kind, folder,
                                         display, depth)
        except ArchiveError as err:  # an inner archive that is not one costs only itself
            self.refused.append((display, archive_members.refusal("corrupt-archive", f"not a readable archive: {err}")))
            self._damaged(Damage(display, False, member.size, f"not a readable archive: {err}"))

    def _damaged(self, damage: Damage) -> None:
        self.damaged.setdefault(damage.archive, damage)

    def _refusal(self, entry: Refused, display: str) -> None:
        """A member refused by its archive, named ``ARCHIVE:MEMBER`` with the member's name as the archive stores
        it (what ``tar tf`` and ``unzip -l`` list): it has no place in an extraction, whatever the reason.

        (An image read from an archive and rejected, undecodable say, is named by its path in the extraction,
        as its record would be and as a conversion of the extracted folder names it.)
        """
        locator = archive_members.refusal(entry.reason, f"in {display}: {entry.detail}")
        if not entry.path:
            self.refused.append((display, locator))
            return
        self.refused.append((f"{display}:{entry.path}", locator))

    # --- compressed archives ------------------------------------------------------------------------------

    def _new_inflated(self, display: str) -> Inflated:
        """A new local file for an inflated archive (see :mod:`beam_jobs.sources.archives.compressed`)."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="imgshards-inflated-")
        copy = Inflated.named(display, self._scratch)
        self.inflated.append(copy)
        self._inflated_names[copy.name] = display
        return copy

    def _inflate(self, where: "_Where", kind: str, display: str) -> tuple[Inflated, int]:
        """Inflate a compressed tar once, front to back, into a local file; a cut or a bomb is one refusal."""
        copy = self._new_inflated(display)
        written, problem = compressed.inflate(RangeFile(where.handle, where.base, where.size), kind, copy.local)
        if problem:
            self.refused.append((display, archive_members.refusal(problem[0], f"{display}: {problem[1]}")))
            self._damaged(Damage(display, True, 0, problem[1]))
        logger.info("%s is compressed: read once, front to back, and inflated into the run's work folder "
                    "(%.1f MB of temporary disk)", display, written / 1e6)
        return copy, written

    def report(self) -> None:
        """One line saying what the archives read as (and which read as their one top folder)."""
        if not self.archives:
            return
        logger.info("read %d archive(s) as folders: %d members", self.archives, self.members)
        for display, top in self.stripped[:5]:
            logger.info("%s reads as its one top folder %s/ (every member sits under it), as its extraction "
                        "would be pointed at", display, top)
        if len(self.stripped) > 5:
            logger.info("... and %d more archives read as their one top folder", len(self.stripped) - 5)


@dataclasses.dataclass(frozen=True)
class _Where:
    """Where an archive's bytes are: ``size`` bytes at ``base`` of ``handle``, the file ``file`` (relative to
    SRC, or to the work folder when ``in_work``) that member locators name."""

    handle: BinaryIO
    base: int
    size: int
    file: str
    in_work: bool


def _modified(path: str) -> str:
    """When the file at ``path`` was last modified (a changed archive is a changed input to resume)."""
    if FileSystems.get_scheme(path) in (None, "file"):
        return repr(os.path.getmtime(path[len("file://"):] if path.startswith("file://") else path))
    return repr(FileSystems.match([path])[0].metadata_list[0].last_updated_in_seconds)


class LauncherReader:
    """``reader(path, source) -> bytes`` for the launcher while it plans (a WebDataset sample's label member):
    a listed file, or an archive member, inflated ones from their local copies (not yet in the work folder).

    The archive read last stays open: labels are read in listing order, one
    sample after another of the same shard, so in S3 and GCS consecutive reads
    share :class:`beam_jobs.files.filesystems.ReadAhead`'s window (a request per 16 MiB of
    a shard, not a 16 MiB request per label). Close it, or use it as a context manager.
    """

    def __init__(self, src: str, inflated: Iterable[Inflated]) -> None:
        self._src, self._local = src, {item.name: item.local for item in inflated}
        self._open: Optional[tuple[str, BinaryIO]] = None

    def __call__(self, path: str, source: str) -> bytes:
        if not source:
            with open_for_scanning(FileSystems.join(self._src, *path.split("/"))) as handle:
                return handle.read()
        where, member = self._where(path, source)
        if self._open is None or self._open[0] != where:
            self.close()
            self._open = (where, open_for_scanning(where))
        return archive_members.read_member(self._open[1], member)

    def open(self, path: str, source: str) -> BinaryIO:
        """What ``self(path, source)`` gives, as a stream of its own (a large annotation file, never held whole;
        an archive member inflated as it is read: :func:`beam_jobs.sources.archives.archive_members.open_member`)."""
        if not source:
            return FileSystems.open(FileSystems.join(self._src, *path.split("/")))
        where, member = self._where(path, source)
        return archive_members.open_member(open_for_scanning(where), member, owned=True)

    def _where(self, path: str, source: str) -> tuple[str, Member]:
        """The archive file holding a member, and the member."""
        located = archive_members.parse_locator(source)
        if isinstance(located, Refused):
            raise ValueError(f"{path} was refused: {located.detail}")
        where = self._local[located.file] if located.in_work else (
            FileSystems.join(self._src, *located.file.split("/")) if located.file else self._src)
        return where, located.member

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def __enter__(self) -> "LauncherReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

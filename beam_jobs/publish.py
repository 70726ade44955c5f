"""Publish a dataset safely: lock OUT, stage beside it, commit all at once.

The contract: a run that fails or is killed at any moment leaves OUT as it
was (the previous complete dataset, or nothing) or complete, and shard files
never appear under their final names without their manifest.

On a local (POSIX) file system the whole dataset is built in a hidden sibling
folder ``.<name>.staging-<run>`` and then swapped in with one atomic
``rename`` (or ``renameat2(RENAME_EXCHANGE)`` when replacing a dataset, so there
is no instant without a complete OUT). Object stores have no atomic folder
rename; there the manifest is written last and is the commit marker (readers
refuse a folder without one), as Beam's and TFDS's writers do.

Leftovers of killed runs (staging folders, a displaced old dataset) are
cleaned, or restored, by the next run while it holds the lock. In an object
store, a run killed while moving files has already written its commit record
(the new manifest, inside staging); the next run finishes that publish.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import uuid
from typing import Iterator, Optional

from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs import faults, filesystems
from record_files import idx
from record_files import staging as staging_names
from beam_jobs.filesystems import FileSystems

logger = logging.getLogger(__name__)

# Our files in a published dataset folder; anything else there is not ours.
_DATASET_FILES = {record_schema.MANIFEST_FILE, record_schema.LABELS_FILE, record_schema.REJECTED_FILE,
                  record_schema.DUPLICATES_FILE}


class PublishError(RuntimeError):
    """OUT cannot be written or holds something this run must not replace."""


class DatasetExistsError(PublishError):
    """OUT already holds a dataset and --overwrite was not given."""


class ConcurrentRunError(PublishError):
    """Another conversion holds the lock on OUT."""


def is_local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def _local(path: str) -> str:
    return os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)


def _sibling(out: str, kind: str, run: bool = True) -> str:
    """A new run's ``.<name>.<kind>-<run>`` beside a local OUT (``run=False``: ``.<name>.<kind>``)."""
    return staging_names.sibling(_local(out), kind, uuid.uuid4().hex[:12] if run else "")


def new_staging(out: str) -> str:
    """A fresh, private staging folder for this run (beside OUT when local)."""
    if is_local(out):
        path = _sibling(out, "staging")
        os.makedirs(path)
        return path
    return staging_names.remote_staging(out, uuid.uuid4().hex[:12])


# In a staging folder's work folder: what the run converts and how (see beam_jobs.resume).
RESUME_RECORD = staging_names.RESUME_RECORD


def work_dir(staging: str) -> str:
    """Scratch space inside staging (input list, per-shard results); removed before commit."""
    return FileSystems.join(staging, staging_names.WORK)


@contextlib.contextmanager
def output_lock(out: str) -> Iterator[None]:
    """Hold an exclusive lock on OUT for the whole run.

    Uses ``flock`` on a hidden sibling file, released by the kernel if the
    process dies, so a killed run never leaves a stale lock. The file is
    removed on exit; the inode check makes that race-free. Object stores have
    no locks: there the caller is responsible for not running two jobs at once.

    Raises:
      ConcurrentRunError: another conversion is writing OUT.
      PublishError: the folder that holds OUT cannot be created or written.
    """
    if not is_local(out):
        logger.warning("no lock is taken on %s: object stores have none; run one conversion at a time", out)
        yield
        return
    parent = os.path.dirname(_local(out))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise PublishError(f"--out {out!r}: the folder that holds it, {parent!r}, cannot be created: {err}") from err
    path = _sibling(out, "lock", run=False)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as err:
            raise PublishError(
                f"--out {out!r}: the folder that holds it, {parent!r}, is not writable ({err.strerror}). "
                "The converter writes a lock file and a staging folder beside OUT, then renames the staging "
                "folder to OUT, so that folder must be writable"
            ) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConcurrentRunError(
                f"another conversion is writing {out!r} (it holds {path!r}); wait for it to finish"
            ) from None
        held = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
            break
        os.close(fd)  # the previous holder removed the file as we opened it: retry
    try:
        yield
    finally:
        os.unlink(path)
        os.close(fd)


def recover_and_clean(out: str) -> None:
    """Undo what killed runs left beside OUT; call while holding the lock.

    A run killed between the two renames of the fallback commit leaves OUT
    missing and the old dataset displaced: it is put back. Staging folders of
    dead runs stay when they hold a resume record (the run decides, once it
    has listed SRC, whether to resume one: see :mod:`beam_jobs.resume`);
    others, and dead runs' scratch folders, are deleted.
    """
    if not is_local(out):
        _recover_remote(out)
        return
    target = _local(out)
    parent, name = os.path.split(target)
    old = sorted(entry for entry in os.listdir(parent) if staging_names.is_sibling(entry, name, ("old",)))
    if old and not os.path.exists(target):
        logger.warning("restoring %s from an interrupted run", target)
        os.rename(os.path.join(parent, old[-1]), target)
        old = old[:-1]
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if staging_names.is_sibling(entry, name) and os.path.exists(os.path.join(work_dir(path), RESUME_RECORD)):
            continue
        if staging_names.is_sibling(entry, name, ("staging", "scratch")) or entry in old:
            logger.info("removing %s left by an interrupted run", entry)
            shutil.rmtree(path, ignore_errors=True)


def leftover_stagings(out: str) -> list[str]:
    """Staging folders that dead runs left with a resume record, newest name last (call under the lock)."""
    if is_local(out):
        parent, name = os.path.split(_local(out))
        found = [os.path.join(parent, entry) for entry in sorted(os.listdir(parent))
                 if staging_names.is_sibling(entry, name)]
    else:
        found = [FileSystems.join(out.rstrip("/"), entry) for entry in _listing(out)
                 if staging_names.is_remote_staging(entry)]
    return [path for path in found if FileSystems.exists(FileSystems.join(work_dir(path), RESUME_RECORD))]


def new_scratch(out: str) -> str:
    """A local folder for the launcher's lists while it plans: beside OUT when local, else a temporary one."""
    if is_local(out):
        path = _sibling(out, "scratch")
        os.makedirs(path)
        return path
    import tempfile

    return tempfile.mkdtemp(prefix="imgshards-scratch-")


def check_out(out: str, overwrite: bool) -> None:
    """Refuse to start when the run could not publish into OUT.

    OUT may be missing or empty; it may hold a dataset only with ``overwrite``;
    anything else in it is user data that is never replaced.
    """
    if is_local(out) and not os.path.exists(_local(out)):
        return
    if is_local(out) and not os.path.isdir(_local(out)):
        raise PublishError(f"--out {out!r} is a file, not a folder")
    names = [name for name in _listing(out) if not staging_names.is_remote_staging(name)]
    if not names:
        return
    foreign = sorted(n for n in names if n not in _DATASET_FILES and n not in record_schema.TFDS_METADATA_FILES
                     and record_schema.parse_shard_filename(
        n.removesuffix(idx.SUFFIX)) is None)
    if foreign and record_schema.MANIFEST_FILE in names:
        raise PublishError(
            f"--out {out!r} holds a dataset and also {len(foreign)} files that are not part of it "
            f"({foreign[:5]}); a conversion replaces the whole folder, so move them elsewhere first"
        )
    if foreign:
        raise PublishError(
            f"--out {out!r} is not empty and is not a dataset (it holds {foreign[:3]}); "
            "choose an empty or new folder"
        )
    if not overwrite:
        raise DatasetExistsError(
            f"--out {out!r} already holds a dataset ({record_schema.MANIFEST_FILE}); "
            "pass --overwrite to replace it once the new one is complete"
        )


def _listing(folder: str) -> list[str]:
    if is_local(folder):
        return os.listdir(_local(folder))
    # An object store has no folders: every object under the prefix, named by its first path component.
    base = folder.rstrip("/") + "/"
    return sorted({m.path[len(base):].split("/")[0] for m in FileSystems.match([base + "**"])[0].metadata_list})


def write_text(path: str, text: str) -> None:
    """Write a small file whole or not at all (every stage's completion marker is one of these).

    Locally a temporary name is renamed into place: a kill during the write
    must never leave an empty or half marker that a resumed run would trust
    (the signal matrix once kept a part's empty counts file). In an object
    store an object appears whole when its upload completes.
    """
    data = text.encode("utf-8")
    if not is_local(path):
        _create(path, data)
        return
    temp = path + ".partial"
    _create(temp, data)
    FileSystems.rename([temp], [path])


def _create(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` directly, as its file system needs (S3 refuses an empty multipart upload)."""
    if not data and FileSystems.get_scheme(path) == "s3":
        _put_empty_s3_object(path)
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)


class _LazyFile:
    """A file opened at its first write, so an empty one can be written the way its file system needs."""

    def __init__(self, path: str) -> None:
        self._path, self._handle = path, None

    def write(self, data: bytes) -> None:
        if data:
            if self._handle is None:
                self._handle = FileSystems.create(self._path, compression_type=CompressionTypes.UNCOMPRESSED)
            self._handle.write(data)

    def close(self) -> None:
        if self._handle is None:
            _create(self._path, b"")
        else:
            self._handle.close()


@contextlib.contextmanager
def whole_file(path: str) -> Iterator[_LazyFile]:
    """Write ``path`` so that no reader ever sees half of it: a temporary name, renamed once complete.

    A retried task rewrites the same bytes; a killed or failed one leaves only
    the temporary file. In an object store an object appears whole when its upload
    completes, so it is written in place (a rename there is a copy and a
    delete: three requests instead of one). Empty files work on S3 too (see
    :func:`_put_empty_s3_object`).
    """
    local = is_local(path)
    temp = path + ".partial" if local else path
    handle = _LazyFile(temp)
    try:
        yield handle
    except BaseException:
        if local:  # an unfinished upload is left unfinished: closing it would publish half a file
            handle.close()
        raise
    handle.close()
    if local:
        FileSystems.rename([temp], [path])


def _put_empty_s3_object(path: str) -> None:
    """An empty object (a run with no rejections has an empty ``rejected.jsonl``).

    Beam's S3 writer always completes a multipart upload, and S3 refuses one
    with no parts (MalformedXML), so an empty file is written with one
    PutObject through the process's client for the same --s3_* options.
    """
    from apache_beam.io.aws.s3io import parse_s3_path

    options = FileSystems.get_filesystem(path)._options  # the --s3_* flags the pipeline was given
    bucket, key = parse_s3_path(path)
    filesystems.s3_client(options).put_object(Bucket=bucket, Key=key, Body=b"")


def read_text(path: str) -> str:
    with FileSystems.open(path) as handle:
        return handle.read().decode("utf-8")


def commit(staging: str, out: str, manifest: dict) -> None:
    """Write the manifest into staging and make staging the dataset at OUT."""
    remove_folder(work_dir(staging))
    body = json.dumps(manifest, indent=2, ensure_ascii=False, sort_keys=False) + "\n"
    if is_local(out):
        write_text(os.path.join(staging, record_schema.MANIFEST_FILE), body)
        _swap_in_local(staging, _local(out))
    else:
        _publish_remote(staging, out, body)


def _swap_in_local(staging: str, target: str) -> None:
    if not os.path.exists(target) or (os.path.isdir(target) and not os.listdir(target)):
        os.replace(staging, target)  # atomic; replaces an empty folder
        return
    if not faults.fallback_requested() and _exchange(staging, target):  # staging now holds the old dataset
        shutil.rmtree(staging)
        return
    displaced = _sibling(target, "old")
    os.rename(target, displaced)  # recover_and_clean() restores it if we die right here
    faults.point("displaced")
    os.rename(staging, target)
    shutil.rmtree(displaced)


def _exchange(first: str, second: str) -> bool:
    """Atomically swap two paths with Linux's renameat2; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, f"cannot swap {first!r} and {second!r}: {os.strerror(code)}")


# Inside a remote staging folder: the manifest of a commit in progress. Once it
# exists the dataset is decided, and a run that dies while moving files is
# finished ("rolled forward") by the next run instead of being thrown away.
COMMIT_RECORD = staging_names.COMMIT_RECORD


def _publish_remote(staging: str, out: str, manifest_body: str) -> None:
    """Object-store commit: record the commit, retract the old manifest, move files, manifest last."""
    write_text(FileSystems.join(staging, COMMIT_RECORD), manifest_body)
    _roll_forward(staging, out.rstrip("/"), manifest_body)


def _roll_forward(staging: str, out: str, manifest_body: str) -> None:
    """Make OUT the dataset ``manifest_body`` describes, from files in ``staging``.

    Safe to repeat after a crash at any step: files already moved are no
    longer in staging, and what OUT holds beyond the new dataset is deleted.
    Readers polling OUT see the old manifest, then none, then the new one.
    """
    keep = dataset_files(json.loads(manifest_body))
    manifest = FileSystems.join(out, record_schema.MANIFEST_FILE)
    if FileSystems.exists(manifest):
        FileSystems.delete([manifest])  # from here on readers see "no dataset", never a mix
    faults.point("retracted")
    old = [FileSystems.join(out, name) for name in _listing(out)
           if name not in keep and not staging_names.is_remote_staging(name) and name != record_schema.MANIFEST_FILE]
    _delete(old)
    names = [name for name in _listing(staging) if name != COMMIT_RECORD]
    for index, name in enumerate(names):
        FileSystems.rename([FileSystems.join(staging, name)], [FileSystems.join(out, name)])
        if index == 0:
            faults.point("moving")
    write_text(manifest, manifest_body)
    remove_folder(staging)


def dataset_files(manifest: dict) -> set[str]:
    """The file names a published dataset consists of, manifest included."""
    shards = {shard["file"] for split in manifest["splits"].values() for shard in split["shards"]}
    indexes = {shard["dali_index"] for split in manifest["splits"].values() for shard in split["shards"]
               if shard.get("dali_index")}
    return shards | indexes | _DATASET_FILES


def _recover_remote(out: str) -> None:
    """Finish a commit a killed run left half done; delete staging folders of runs that died before one."""
    out = out.rstrip("/")
    for name in _listing(out):
        if not staging_names.is_remote_staging(name):
            continue
        staging = FileSystems.join(out, name)
        record = FileSystems.join(staging, COMMIT_RECORD)
        if FileSystems.exists(record):
            logger.warning("finishing the publish of %s that an interrupted run started", out)
            _roll_forward(staging, out, read_text(record))
        elif not FileSystems.exists(FileSystems.join(work_dir(staging), RESUME_RECORD)):
            logger.info("removing %s left by an interrupted run", staging)
            remove_folder(staging)


def discard_staging(staging: str) -> None:
    """Remove a failed run's staging folder, unless its commit had begun: the next run finishes that."""
    if not is_local(staging) and FileSystems.exists(FileSystems.join(staging, COMMIT_RECORD)):
        logger.warning("the publish into %s was interrupted; the next run on it finishes it",
                       staging.rsplit("/", 1)[0])
        return
    remove_folder(staging)


def abandon(staging: Optional[str], out: str, scratch: Optional[str] = None) -> None:
    """A run's last resort when it must exit at once (a signal's deadline): staging, scratch and the lock file go.

    The lock itself (an ``flock``) dies with the process; its file would stay beside OUT.
    """
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    if staging:
        discard_staging(staging)
    if is_local(out):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_sibling(out, "lock", run=False))


def remove_folder(path: str) -> None:
    """Delete a folder and everything in it, on disk or in an object store (where it is a prefix)."""
    if is_local(path):
        shutil.rmtree(_local(path), ignore_errors=True)
        return
    if _listing(path):
        FileSystems.delete([path.rstrip("/") + "/"])


def _delete(paths: list[str]) -> None:
    files = [path for path in paths if FileSystems.exists(path)]
    folders = [path for path in paths if path not in files]
    if files:
        FileSystems.delete(files)
    for folder in folders:
        remove_folder(folder)

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

import record_schema
from beam_jobs import faults
from beam_jobs.files.filesystems import (
    FileSystems,
    is_local,
    list_names,
    local_path,
    read_text,
    remove_folder,
    write_text,
)
from record_files import croissant, idx, versions
from record_files import staging as staging_names

logger = logging.getLogger(__name__)

# Our files in a published dataset folder; anything else there is not ours.
_DATASET_FILES = {record_schema.MANIFEST_FILE, record_schema.LABELS_FILE, record_schema.LABEL_MAP_FILE,
                  record_schema.REJECTED_FILE, record_schema.SKIPPED_FILE,
                  record_schema.DUPLICATES_FILE, record_schema.DROPPED_FILE, croissant.CROISSANT_FILE,
                  versions.SOURCES_TABLE}  # version 1's sources table (beam_jobs.pipeline.first_sources)


class PublishError(RuntimeError):
    """OUT cannot be written or holds something this run must not replace."""


class DatasetExistsError(PublishError):
    """OUT already holds a dataset and --overwrite was not given."""


class ConcurrentRunError(PublishError):
    """Another conversion holds the lock on OUT."""


def _sibling(out: str, kind: str, run: bool = True) -> str:
    """A new run's ``.<name>.<kind>-<run>`` beside a local OUT (``run=False``: ``.<name>.<kind>``)."""
    return staging_names.sibling(local_path(out), kind, uuid.uuid4().hex[:12] if run else "")


def new_staging(out: str) -> str:
    """A fresh, private staging folder for this run (beside OUT when local)."""
    if is_local(out):
        path = _sibling(out, "staging")
        os.makedirs(path)
        return path
    return staging_names.remote_staging(out, uuid.uuid4().hex[:12])


def new_version_staging(out: str) -> str:
    """Where ``--update`` composes a version: on the launcher's disk whatever OUT is (beside OUT when local, as a
    conversion's staging; else a temporary folder, uploaded into ``OUT/versions/<N>/`` when it publishes)."""
    if is_local(out):
        return new_staging(out)
    import tempfile

    return tempfile.mkdtemp(prefix="imgshards-version-")


# In a staging folder's work folder: what the run converts and how (see beam_jobs.planning.resume).
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
    parent = os.path.dirname(local_path(out))
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
    has listed SRC, whether to resume one: see :mod:`beam_jobs.planning.resume`);
    others, and dead runs' scratch folders, are deleted.
    """
    if not is_local(out):
        _recover_remote(out)
        return
    target = local_path(out)
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
        parent, name = os.path.split(local_path(out))
        found = [os.path.join(parent, entry) for entry in sorted(os.listdir(parent))
                 if staging_names.is_sibling(entry, name)]
    else:
        found = [FileSystems.join(out.rstrip("/"), entry) for entry in list_names(out)
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
    if is_local(out) and not os.path.exists(local_path(out)):
        return
    if is_local(out) and not os.path.isdir(local_path(out)):
        raise PublishError(f"--out {out!r} is a file, not a folder")
    names = [name for name in list_names(out) if not staging_names.is_remote_staging(name)]
    if not names:
        return
    foreign = sorted(n for n in names if n not in _DATASET_FILES and n not in record_schema.TFDS_METADATA_FILES
                     and n not in record_schema.REPORT_FILES
                     and n not in {record_schema.records_table_filename(split) for split in record_schema.SPLITS}
                     and n != versions.VERSIONS_DIR  # the versions --update wrote (record_files/versions.py)
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


def commit(staging: str, out: str, manifest: dict) -> None:
    """Write the manifest into staging and make staging the dataset at OUT."""
    remove_folder(work_dir(staging))
    body = json.dumps(manifest, indent=2, ensure_ascii=False, sort_keys=False) + "\n"
    if is_local(out):
        write_text(os.path.join(staging, record_schema.MANIFEST_FILE), body)
        _swap_inlocal_path(staging, local_path(out))
    else:
        _publish_remote(staging, out, body)


def _swap_inlocal_path(staging: str, target: str) -> None:
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
    old = [FileSystems.join(out, name) for name in list_names(out)
           if name not in keep and not staging_names.is_remote_staging(name) and name != record_schema.MANIFEST_FILE]
    _delete(old)
    names = [name for name in list_names(staging) if name != COMMIT_RECORD]
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
    tables = {split["records_table"]["file"] for split in manifest["splits"].values() if split.get("records_table")}
    return shards | indexes | tables | _DATASET_FILES


def _recover_remote(out: str) -> None:
    """Finish a commit a killed run left half done; delete staging folders of runs that died before one."""
    out = out.rstrip("/")
    for name in list_names(out):
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


def _delete(paths: list[str]) -> None:
    files = [path for path in paths if FileSystems.exists(path)]
    folders = [path for path in paths if path not in files]
    if files:
        FileSystems.delete(files)
    for folder in folders:
        remove_folder(folder)

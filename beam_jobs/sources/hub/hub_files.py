"""The files of a Hugging Face dataset as the Hub names them: which are Parquet or Arrow, their splits and configs.

In:  SRC's listing (or one file), ``--config``.
Out: :class:`ParquetFile` (path, split, config) for each file read; the Hub revision of a snapshot folder; a
     warning for each file a ``-of-0000N`` set names and lacks; each file's identity (size and time); every
     other file of SRC skipped and named with its reason (:func:`account`).

- ``{split}-00000-of-00004.parquet`` (``push_to_hub``, under ``data/`` or a config folder);
- ``{config}/{split}/0000.parquet`` (the Hub's ``refs/convert/parquet`` branch, whose ``partial-{split}``
  folders hold a split cut at 5 GB and are refused);
- Arrow: ``save_to_disk``'s ``{split}/data-00000-of-00001.arrow`` and the HF cache's ``NAME-{split}.arrow``.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Optional, Sequence

import record_schema
from beam_jobs import formats
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning.discover import InputError, Listing
from beam_jobs.planning.listing import ANNOTATIONS_NOT_READ, NOT_AN_IMAGE, SkippedFiles, skip_reason

EXTENSIONS = (".parquet", ".arrow")  # Parquet (the Hub's files), Arrow (save_to_disk and the HF datasets cache)
SPLITS = record_schema.SPLIT_NAMES
_SHARDED = re.compile(r"^(?P<split>[^/]+?)-\d{5}-of-\d{5}\.parquet$")  # push_to_hub
_NUMBERED = re.compile(r"^\d+\.parquet$")  # refs/convert/parquet: {config}/{split}/0000.parquet


@dataclasses.dataclass(frozen=True)
class ParquetFile:
    """One Parquet file of the dataset: where it is (relative to SRC), its split and config."""

    path: str
    split: str
    config: str


def is_dataset_file(src: str) -> bool:
    """SRC is one file of a dataset, Parquet or Arrow (``--src train-00000-of-00001.parquet``,
    ``data-00000-of-00001.arrow``)."""
    return src.lower().endswith(EXTENSIONS)


def parquet_files(listing: Listing) -> list[str]:
    """The Parquet and Arrow files of a listing, in name order (empty: SRC is no Hugging Face dataset).

    ``cache-*.arrow`` files (what ``Dataset.map`` leaves beside a saved dataset) are not the dataset.
    """
    return sorted(path for path, source in listing.entries() if not source and path.lower().endswith(EXTENSIONS)
                  and not posixpath.basename(path).startswith("cache-"))


def describe(path: str) -> ParquetFile:
    """Split and config of the file at ``path`` (relative to SRC), as the Hub names them.

    Raises:
      InputError: a ``partial-`` split (the Hub's conversion stopped at 5 GB).
    """
    parts = path.split("/")
    name = parts[-1]
    if name.lower().endswith(".arrow"):
        return _describe_arrow(path, parts)
    sharded = _SHARDED.match(name)
    if sharded:
        folder = parts[-2] if len(parts) >= 2 else ""
        return ParquetFile(path, sharded["split"], "" if folder in ("", "data") else folder)
    if _NUMBERED.match(name) and len(parts) >= 2:
        split = parts[-2]
        if split.startswith("partial-"):
            raise InputError(f"{path}: the split {split[len('partial-'):]!r} is truncated (the Hub converts a "
                             f"dataset to Parquet only up to 5 GB, into {split}/); download the dataset's own "
                             "files (its main branch) to convert all of it")
        return ParquetFile(path, split, parts[-3] if len(parts) >= 3 else "")
    stem = posixpath.splitext(name)[0]
    return ParquetFile(path, stem if stem.lower() in SPLITS else "train", "")


_ARROW_SAVED = re.compile(r"^data-\d{5}-of-\d{5}\.arrow$")  # save_to_disk: {split}/data-00000-of-00001.arrow
_ARROW_CACHED = re.compile(r"^.+?-(?P<split>[^-/]+?)(?:-\d{5}-of-\d{5})?\.arrow$")  # cache: NAME-{split}[-k-of-n].arrow


def _describe_arrow(path: str, parts: list[str]) -> ParquetFile:
    name = parts[-1]
    if _ARROW_SAVED.match(name):
        folder = parts[-2] if len(parts) >= 2 else ""
        return ParquetFile(path, folder if folder.lower() in SPLITS else "train", "")
    cached = _ARROW_CACHED.match(name)
    if cached and cached["split"].lower() in SPLITS:
        return ParquetFile(path, cached["split"], "")
    stem = posixpath.splitext(name)[0]
    return ParquetFile(path, stem if stem.lower() in SPLITS else "train", "")


def choose_config(files: Sequence[ParquetFile], config: Optional[str], src: str) -> list[ParquetFile]:
    """The files of one config: the one there is, or ``--config``'s."""
    configs = sorted({f.config for f in files})
    if config is not None:
        chosen = [f for f in files if f.config == config]
        if not chosen:
            raise InputError(f"--config {config!r}: {src} has no such config; its configs are {configs}")
        return chosen
    if len(configs) > 1:
        raise InputError(f"{src} holds several configs {configs}: pick one with --config NAME")
    return list(files)


def revision(src: str) -> str:
    """The Hub revision of a dataset in a snapshot folder (``.../snapshots/<commit sha>/...``), else ""."""
    found = re.search(r"/snapshots/([0-9a-f]{40})(?:/|$)", src.replace("\\", "/"))
    return found.group(1) if found else ""


def missing_from_sets(files: Sequence[ParquetFile], src: str) -> list[str]:
    """A warning for each file that a set's names say exists (``train-00001-of-00003.parquet``) and is missing."""
    sets: dict[tuple[str, str, int], set[int]] = {}
    for file in files:
        folder, _, name = file.path.rpartition("/")
        match = re.match(r"^(?P<split>.+?)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.parquet|\.arrow)$", name)
        if match:
            key = (folder, match["split"], int(match["count"]), match["ext"])
            sets.setdefault(key, set()).add(int(match["index"]))
    warnings = []
    for (folder, split, count, ext), present in sorted(sets.items()):
        for index in sorted(set(range(count)) - present):
            missing = posixpath.join(folder, f"{split}-{index:05d}-of-{count:05d}{ext}")
            warnings.append(f"{missing} is missing from {src}: its set names {count} files and {len(present)} are "
                            f"there, so the {split} split is converted without that file's rows")
    return warnings


def full_path(src: str, path: str) -> str:
    return FileSystems.join(src, *path.split("/")) if path else src


def file_size(src: str, path: str) -> int:
    return FileSystems.match([full_path(src, path)])[0].metadata_list[0].size_in_bytes


def identities(src: str, paths: Sequence[str]) -> dict[str, str]:
    """Each Parquet file's size and modification time: what resume compares, and the manifest names."""
    found = {}
    for path in paths:
        meta = FileSystems.match([full_path(src, path)])[0].metadata_list[0]
        found[path or posixpath.basename(src)] = f"{meta.size_in_bytes} bytes, modified {meta.last_updated_in_seconds!r}"
    return found


# What the datasets library writes beside a dataset's files (save_to_disk's, the Hub's older metadata): not read.
_METADATA = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"})
README = "README.md"  # a Hub snapshot's card: its YAML's ClassLabel names are read (hub_columns)


def account(listing: Listing, read: set[str], other_splits: set[str], other_configs: set[str],
            skipped: SkippedFiles) -> None:
    """Every file of SRC's listing that is neither a dataset file ``read`` nor the snapshot's README: skipped and
    named with its reason (a split the converter does not write, another config's file, the datasets library's
    metadata, ``Dataset.map``'s cache files, a hidden file, anything else)."""
    for path, _ in listing.entries():
        if path in read or path == README or skip_reason(path, skipped):
            continue
        name = posixpath.basename(path)
        if path in other_splits:
            skipped.add(path, "other-split", "a split the converter does not write (it writes train, validation "
                        "and test)")
        elif path in other_configs:
            skipped.add(path, "other-config", "a file of another config than the one converted (--config)")
        elif name.lower() in _METADATA:
            skipped.add(path, ANNOTATIONS_NOT_READ, "the datasets library's metadata of the dataset: not read",
                        warned=True)
        elif name.startswith("cache-") and name.lower().endswith(".arrow"):
            skipped.add(path, "not-in-layout", "a cache file Dataset.map leaves beside a saved dataset")
        elif formats.has_image_extension(name):
            skipped.add(path, "not-in-layout", "an image file beside a Parquet dataset, whose rows hold the images")
        else:
            skipped.add(path, NOT_AN_IMAGE, "neither a Parquet or Arrow file of the dataset nor its README.md")

"""Caches of encoded records: in memory (checked against available memory first) or in files named by the dataset's version.

Data in: a split's records and ``ReadOptions.cache``. Data out: the same
records, read from the cache after the first pass.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from typing import Optional

import tensorflow as tf

from reader.info import DatasetInfo

logger = logging.getLogger(__name__)

# A memory cache must fit in this share of available memory (the rest is training's).
MEMORY_CACHE_FRACTION = 0.8


class CacheTooLargeError(MemoryError):
    """``cache="memory"`` was asked for data that does not fit in memory."""


def cached(records: tf.data.Dataset, cache: Optional[str], pipeline_id: int) -> tf.data.Dataset:
    if cache is None:
        return records
    if cache == "memory":
        return records.cache()
    return records.cache(f"{cache}-{pipeline_id}")


def cache_prefix(cache: str, info: DatasetInfo, split: str, pipelines: int) -> str:
    """File prefix of a file cache of ``split``: ``PATH-<split>-<fingerprint>-of<pipelines>``.

    The dataset's fingerprint in the name means a cache is never served for
    another version of the dataset (a reconversion with ``--overwrite``
    changes it): a new version writes a new cache. Files of other versions are
    named in a warning, for the user to delete. A cache named before the
    version was the content (``DatasetInfo.legacy_fingerprint``) is still
    served for the dataset it was made from.

    Raises:
      ValueError: the cache's folder does not exist or is not writable.
    """
    path = os.path.join(cache, "records") if tf.io.gfile.isdir(cache) else cache
    folder = os.path.dirname(path) or "."
    if not tf.io.gfile.isdir(folder):
        raise ValueError(f"cache={cache!r}: the folder {folder!r} does not exist; create it or pass another path")
    if "://" not in folder:
        try:  # a real write: access() says yes to root on read-only mounts
            handle, probe = tempfile.mkstemp(prefix=".cache-probe-", dir=folder)
            os.close(handle)
            os.unlink(probe)
        except OSError as err:
            raise ValueError(f"cache={cache!r}: the folder {folder!r} is not writable ({err.strerror})") from err
    prefix = f"{path}-{split}-{info.fingerprint}-of{pipelines}"
    legacy = f"{path}-{split}-{info.legacy_fingerprint}-of{pipelines}"
    if legacy != prefix and tf.io.gfile.glob(f"{legacy}-*") and not tf.io.gfile.glob(f"{prefix}-*"):
        prefix = legacy  # a cache named by the manifest-wide version of this same data: still served
    stale = sorted(name for name in tf.io.gfile.glob(f"{path}-{split}-*")
                   if not name.startswith(prefix) and _CACHE_NAME.match(name[len(path):]))
    if stale:
        logger.warning("cache %s: %d files belong to other versions of this dataset (%s...) and are never read "
                       "again; delete them to free their space", path, len(stale), stale[0])
    return prefix


_CACHE_NAME = re.compile(r"^-[a-z]+-[0-9a-f]{12}-of\d+-\d+[._]")


def check_memory_cache(split: str, needed: int) -> None:
    available = available_memory_bytes()
    if available is not None and needed > MEMORY_CACHE_FRACTION * available:
        raise CacheTooLargeError(
            f'cache="memory" needs {needed:,} bytes for split {split!r} but only {available:,} bytes of memory '
            f"are available ({MEMORY_CACHE_FRACTION:.0%} may be used); pass cache=PATH to cache on disk instead"
        )


def available_memory_bytes() -> Optional[int]:
    """Memory the system can give without swapping (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

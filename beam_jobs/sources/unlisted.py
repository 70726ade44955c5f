"""SRC's files that a label file does not list, skipped and named: the walk after a label file's plan.

In:  the plan of a label file (``label_file.plan`` or ``plan_multilabel``: the images it lists), SRC (walked,
     or an archive's members) and a scratch folder.
Out: the same plan with every file under SRC it does not list in its skipped counts and files: an image as
     ``not-in-annotations``, a hidden or system file so, anything else as no image.

The plan itself needs no walk (the label file names its images); this comparison of SRC's files with the
listed paths does, in memory bounded by one hash range of the paths when there is a scratch folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import tempfile
from typing import Iterable, Iterator, Optional

from beam_jobs import formats
from beam_jobs.planning.discover import InputPlan
from beam_jobs.planning.listing import NOT_AN_IMAGE, SkippedFiles, list_tree, skip_reason

RANGES = 64  # the hash ranges the listed paths and SRC's files are cut into, each range's listed paths held alone


def account(plan: InputPlan, src: str, path: str, scratch: Optional[str],
            members: Optional[Iterable[str]] = None) -> InputPlan:
    """``plan`` with every file under SRC that the label file ``path`` does not list skipped and named: an image
    as ``not-in-annotations``, a hidden or system file so, anything else as no image (the label file itself,
    inside SRC, is read). ``members``: SRC's files when it is an archive; else SRC is walked (the plan itself
    needs no walk: the label file names its images). Memory: one of :data:`RANGES` hash ranges of
    the listed paths with a ``scratch`` folder, all of them without."""
    skipped = SkippedFiles(plan.skipped, scratch)
    files = members if members is not None else list_tree(src, scratch).files
    inside = os.path.abspath(path)[len(os.path.abspath(src)) + 1:].replace(os.sep, "/") \
        if "://" not in src + path and os.path.abspath(path).startswith(os.path.abspath(src) + os.sep) else None
    for relpath in unlisted(files, (ref.relpath for ref in plan.refs), scratch):
        if relpath == inside or skip_reason(relpath, skipped):
            continue
        if formats.has_image_extension(relpath):
            skipped.add(relpath, "not-in-annotations", f"an image that --annotations {posixpath.basename(path)} "
                        "does not list")
        else:
            skipped.add(relpath, NOT_AN_IMAGE, f"no image, and not listed in --annotations {posixpath.basename(path)}")
    return dataclasses.replace(plan, skipped=skipped.counts(), skipped_files=skipped)


def unlisted(files: Iterable[str], listed: Iterable[str], scratch: Optional[str]) -> Iterator[str]:
    """The paths of ``files`` that ``listed`` lacks: by a set, or, with ``scratch``, range by range (both cut by
    a hash of the path into :data:`RANGES` files, each range's listed paths held alone)."""
    if scratch is None:
        named = set(listed)
        yield from (relpath for relpath in files if relpath not in named)
        return
    handles = [tempfile.TemporaryFile("w+", dir=scratch, encoding="utf-8", errors="surrogatepass", newline="\n")
               for _ in range(2 * RANGES)]
    try:
        for kind, paths in enumerate((listed, files)):
            for relpath in paths:
                digest = hashlib.blake2b(relpath.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                handles[2 * (digest[0] % RANGES) + kind].write(_line(relpath))
        for index in range(RANGES):
            for handle in handles[2 * index:2 * index + 2]:
                handle.seek(0)
            named = {_path(line) for line in handles[2 * index]}
            yield from (relpath for line in handles[2 * index + 1] if (relpath := _path(line)) not in named)
    finally:
        for handle in handles:
            handle.close()


def _line(relpath: str) -> str:
    """``relpath`` as a line of its own: as it is, or as JSON when it holds a line break or begins with a quote
    (a JSON string does; a plain path never then). JSON for every path was a third of this walk's CPU."""
    return json.dumps(relpath) + "\n" if "\n" in relpath or "\r" in relpath or relpath[:1] == '"' else relpath + "\n"


def _path(line: str) -> str:
    return json.loads(line) if line[:1] == '"' else line[:-1]

"""``python -m converter card OUT``: write (or rewrite) a converted dataset's Croissant card.

In: a published local dataset folder (its latest version's ``manifest.json``, or ``--version N``'s) and the
card's flags: ``--card FILE`` (YAML or JSON: name, description, license, citation, url, version,
date_published, creators, keywords), ``--license``, ``--citation`` (these two win over the file's). Out: the
version's ``croissant.json`` (``OUT/`` for version 1, ``OUT/versions/<N>/`` after), written atomically; with ``--check``, what mlcroissant finds in it. Exit status: 0 written (and valid), 1
``--check`` found errors, 2 a usage error (a bad card file, no dataset at OUT).

The converter writes the same card at every conversion (``--card``...); this command adds a license or a
citation to a dataset converted without one, without converting again. A licence the export's README stated at
conversion (the manifest's ``stated_license``) is kept, noting that file, unless the flags give one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

import record_schema
from record_files import croissant, versions
from record_files.dataset_card import CardError, DatasetCard, card_from_flags, with_stated_license


def add_card_flags(parser: argparse.ArgumentParser) -> None:
    """``--card``, ``--license``, ``--citation``: shared by ``convert`` and ``card``."""
    group = parser.add_argument_group("Croissant card (croissant.json)")
    group.add_argument("--card", metavar="FILE", default=None,
                       help="a YAML or JSON file: name, description, license, citation, url, version, "
                            "date_published, creators, keywords")
    group.add_argument("--license", action="append", default=None, metavar="SPDX_OR_URL",
                       help="the dataset's license (an SPDX id or a URL); repeat for several")
    group.add_argument("--citation", default=None, metavar="TEXT", help="how to cite the dataset (BibTeX)")


def _with_stated(out: str, card: Optional[DatasetCard]) -> Optional[DatasetCard]:
    """``card`` with the licence the source's README stated at conversion (the manifest's ``stated_license``),
    when the card gives none: re-writing the card must not drop what the conversion put in it."""
    try:
        with open(os.path.join(out, record_schema.MANIFEST_FILE), encoding="utf-8") as handle:
            stated = json.load(handle).get("stated_license")
    except (OSError, ValueError, AttributeError):
        return card  # no manifest, or not one: write_croissant names the problem
    if not isinstance(stated, dict) or not stated.get("license"):
        return card
    return with_stated_license(card, str(stated["license"]), str(stated.get("file") or "README"))


def _version_folder(out: str, version: Optional[int]) -> str:
    """The folder of OUT's version ``version`` (None: the latest), where its manifest and card are; ValueError
    naming the version and the versions OUT has when it has no such version. Read with ``open``: no TensorFlow."""
    try:
        with open(os.path.join(out, versions.POINTER_FILE), encoding="utf-8") as handle:
            latest = versions.parse_pointer(handle.read(), os.path.join(out, versions.POINTER_FILE))
    except FileNotFoundError:
        latest = versions.FIRST_VERSION
    if version is None:  # its manifest missing: write_croissant names the problem
        return os.path.join(out, versions.version_dir(latest))
    existing = [number for number in range(versions.FIRST_VERSION, latest + 1)
                if os.path.exists(os.path.join(out, versions.manifest_path(number)))]
    if version not in existing:
        raise ValueError(versions.missing_version(version, existing, out))
    return os.path.join(out, versions.version_dir(version))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m converter card``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m converter card",
        description="Write a converted dataset's Croissant card (MLCommons' JSON-LD metadata) as OUT/croissant.json.")
    parser.add_argument("out", help="the dataset folder (local)")
    parser.add_argument("--version", type=int, default=None, metavar="N",
                        help="the card of the dataset's version N (python -m converter versions lists them; "
                             "default: the latest)")
    add_card_flags(parser)
    parser.add_argument("--check", action="store_true",
                        help="validate the card with mlcroissant (pip install mlcroissant) and print what it finds")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        card = card_from_flags(args.card, args.license, args.citation)
    except (CardError, ValueError, FileNotFoundError) as err:  # the flags at fault: a usage error (2)
        parser.error(str(err))
    try:  # the dataset or its version at fault: 1, as verify, inspect and report say it
        folder = _version_folder(args.out, args.version)
        card = _with_stated(folder, card)
        path = croissant.write_croissant(folder, card, folder_name=os.path.basename(os.path.abspath(args.out)))
    except (CardError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    if not args.check:
        return 0
    try:
        errors, warnings = croissant.croissant_issues(path)
    except ImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    return 1 if errors else 0

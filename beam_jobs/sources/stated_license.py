"""The licence an export's README states (Roboflow's ``README.dataset.txt``: ``License: CC BY 4.0``), offered
for the Croissant card when the user gives none.

In:  SRC's listing and a reader of its files (plain or archive members). Out: a :class:`StatedLicense` (the
     licence, as an SPDX id where it is one of the few Roboflow offers, and the file that states it), or None.

Why offered and not left out: a licence is what a person says of a dataset (``record_files.dataset_card``), and
the export's README is the dataset's author saying it; a card without one leaves every later user to guess.
It is only offered: ``--license`` or a card file's ``license`` wins, the card notes which file stated it, and
the run says so in one line. The README is still no image (skipped as ``not-in-layout`` by the sources).

Read: files named ``README.dataset.txt`` (the dataset's own, with ``License:``) or ``README.roboflow.txt``,
nearest SRC's top first (a folder holding the export sees it one level down); the first ``License:`` line
of each. "Private", "Unknown", "None": no licence. Two READMEs stating different licences: none offered, and
a warning names both (which one covers which images is not for us to guess).
"""

from __future__ import annotations

import logging
import posixpath
import re
from typing import Callable, NamedTuple, Optional

from beam_jobs.planning.discover import Listing, display_path

logger = logging.getLogger(__name__)

README_NAMES = ("README.dataset.txt", "README.roboflow.txt")
_MAX_README_BYTES = 1 << 16  # a README is a few hundred bytes; more is not a README we know
_LICENSE_LINE = re.compile(r"^[ \t]*licen[cs]e[ \t]*:[ \t]*(?P<value>\S[^\r\n]*?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
_NO_LICENSE = {"private", "unknown", "none", "n/a", "na", "-", "other"}
# Creative Commons as Roboflow writes it ("CC BY 4.0", "BY-NC-SA 4.0", "CC0 1.0") -> the SPDX id.
_CREATIVE_COMMONS = re.compile(r"^(?:CC[ -]?)?(?P<terms>BY(?:[ -](?:NC|SA|ND))*)[ -]v?(?P<version>\d\.\d)$",
                               re.IGNORECASE)
_CC0 = re.compile(r"^CC[ -]?0(?:[ -]v?1\.0)?$", re.IGNORECASE)
_ODBL = re.compile(r"^ODbL(?:[ -]v?1\.0)?$", re.IGNORECASE)

Reader = Callable[[str, str], bytes]


class StatedLicense(NamedTuple):
    """A licence an export's README states, and that README's path in SRC."""

    license: str
    file: str


def spdx_of(text: str) -> Optional[str]:
    """The licence ``text`` names, as an SPDX id where it is a Creative Commons one, MIT or ODbL; else the text
    as written; None when it says there is none ("Private", "Unknown")."""
    text = text.strip().strip(".")
    if text.lower() in _NO_LICENSE or not text:
        return None
    if _CC0.match(text):
        return "CC0-1.0"
    match = _CREATIVE_COMMONS.match(text)
    if match:
        terms = re.split(r"[ -]", match["terms"].upper())
        return "CC-" + "-".join(terms) + "-" + match["version"]
    if _ODBL.match(text):
        return "ODbL-1.0"
    if text.upper() == "MIT":
        return "MIT"
    return text


def find(listing: Listing, read: Reader, warnings: list[str]) -> Optional[StatedLicense]:
    """The licence the export's READMEs under SRC state (see the module docstring), or None; a disagreement
    between two of them is appended to ``warnings``."""
    readmes = sorted(((path.count("/"), path, source) for path, source in listing.entries()
                      if path.endswith(README_NAMES) and posixpath.basename(path) in README_NAMES))
    stated: list[StatedLicense] = []
    for _, path, source in readmes:
        try:
            text = read(path, source)[:_MAX_README_BYTES].decode("utf-8", "replace")
        except OSError as err:  # a README that cannot be read only costs the offer
            logger.info("could not read %s for its licence: %s", display_path(path), err)
            continue
        match = _LICENSE_LINE.search(text)
        value = spdx_of(match["value"]) if match else None
        if value is not None:
            stated.append(StatedLicense(value, path))
    if len({item.license for item in stated}) > 1:
        warnings.append("the export's READMEs state different licences ("
                        + ", ".join(f"{display_path(item.file)}: {item.license}" for item in stated[:3])
                        + "): none is put in croissant.json; give the dataset's with --license")
        return None
    return stated[0] if stated else None

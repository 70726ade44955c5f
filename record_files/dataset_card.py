"""A dataset card: what a person says about a dataset (name, license, citation...), read from a small file.

In: a YAML or JSON mapping (``--card FILE``), or the converter's ``--license``/``--citation`` flags.
Out: a frozen :class:`DatasetCard`, which :mod:`record_files.croissant` writes into ``croissant.json``.
Errors (:class:`CardError`, a ValueError, so the CLI reports it as a usage error) name the file and the
field at fault: an unknown key (with the key it probably means), a value of the wrong type.

Imports neither TensorFlow nor Apache Beam (``record_files/``).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
from typing import Any, Optional, Sequence

import yaml


class CardError(ValueError):
    """A card file (or card value) a user wrote is wrong: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Creator:
    """A creator of the dataset: a ``sc:Person`` or a ``sc:Organization``."""

    name: str
    kind: str = "Person"  # or "Organization"
    url: Optional[str] = None
    email: Optional[str] = None

    def to_jsonld(self) -> dict:
        return {"@type": f"sc:{self.kind}", "name": self.name,
                **({"url": self.url} if self.url else {}), **({"email": self.email} if self.email else {})}


@dataclasses.dataclass(frozen=True)
class DatasetCard:
    """What a person says about a dataset; None or empty: not given (a default, or left out of the card).

    ``license``: SPDX ids or license URLs (Croissant recommends a URL, e.g. one of spdx.org/licenses);
    ``citation``: the text of ``citeAs`` (ideally BibTeX); ``date_published``: ISO 8601 text.
    ``license_source``: the file of the source that stated ``license`` (an export's README), when the user did
    not give it: the card says so (:func:`with_stated_license`).
    """

    name: Optional[str] = None
    description: Optional[str] = None
    license: tuple[str, ...] = ()
    citation: Optional[str] = None
    url: Optional[str] = None
    version: Optional[str] = None
    date_published: Optional[str] = None
    creators: tuple[Creator, ...] = ()
    keywords: tuple[str, ...] = ()
    license_source: Optional[str] = None

    def merged(self, other: "DatasetCard") -> "DatasetCard":
        """This card with every field ``other`` gives replacing ours (flags over a card file)."""
        given = {f.name: getattr(other, f.name) for f in dataclasses.fields(other) if getattr(other, f.name)}
        return dataclasses.replace(self, **given)


# The card file's keys (a YAML or JSON mapping) -> what each must hold.
_TEXT_KEYS = ("name", "description", "citation", "url", "version", "date_published")
_LIST_KEYS = ("license", "keywords")
CARD_KEYS = _TEXT_KEYS + _LIST_KEYS + ("creators",)
# Other cards' words for our keys (Croissant's, Hugging Face's, CITATION.cff's), suggested when used.
_MEANT = {"citeas": "citation", "cite_as": "citation", "bibtex": "citation", "homepage": "url", "tags": "keywords",
          "author": "creators", "authors": "creators", "creator": "creators", "title": "name", "date": "date_published",
          "datepublished": "date_published", "date-released": "date_published", "licenses": "license",
          "pretty_name": "name"}
_CREATOR_KEYS = ("name", "type", "url", "email")
_CREATOR_TYPES = {"person": "Person", "organization": "Organization", "organisation": "Organization"}


def load_card(path: str) -> DatasetCard:
    """Read a card file: a YAML (``.yaml``/``.yml``) or JSON mapping of :data:`CARD_KEYS`.

    Errors (:class:`CardError`) name the file and the field at fault: an unknown key (with the key it
    probably means), a value of the wrong type, an unreadable file.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise CardError(f"--card {path}: cannot read it: {err.strerror or err}") from None
    try:
        data = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:  # both say the line and column
        raise CardError(f"--card {path}: not valid {'JSON' if path.lower().endswith('.json') else 'YAML'}: "
                        f"{err}") from None
    return card_from_mapping(data if data is not None else {}, path)


def card_from_flags(card_file: Optional[str] = None, licenses: Sequence[str] = (),
                    citation: Optional[str] = None) -> Optional[DatasetCard]:
    """The card the converter's flags give (``--card FILE``, ``--license``, ``--citation``: the flags win), or
    None when none is given (the default card)."""
    card = load_card(card_file) if card_file else None
    flags = DatasetCard(license=tuple(licenses or ()), citation=citation or None)
    if flags == DatasetCard():
        return card
    return (card or DatasetCard()).merged(flags)


def with_stated_license(card: Optional[DatasetCard], license: str, source: str) -> DatasetCard:
    """``card`` with the licence an export's file (``source``, its README) states, noting that file; a card
    that gives a licence (``--license``, the card file's) keeps its own: what the user says wins."""
    card = card or DatasetCard()
    if card.license:
        return card
    return dataclasses.replace(card, license=(license,), license_source=source)


def card_from_mapping(data: Any, source: str) -> DatasetCard:
    """A :class:`DatasetCard` from a parsed card file's mapping; ``source`` (the file) names errors."""
    if not isinstance(data, dict):
        raise CardError(f"--card {source}: must hold a mapping of {', '.join(CARD_KEYS)}; it holds a "
                        f"{type(data).__name__}")
    for key in data:
        if key not in CARD_KEYS:
            near = ([_MEANT[str(key).lower()]] if str(key).lower() in _MEANT
                    else difflib.get_close_matches(str(key), CARD_KEYS, n=1, cutoff=0.5))
            raise CardError(f"--card {source}: unknown field {key!r}"
                            + (f" (did you mean {near[0]!r}?)" if near else f"; the fields are {', '.join(CARD_KEYS)}"))
    values: dict[str, Any] = {}
    for key in _TEXT_KEYS:
        if key in data and data[key] is not None:
            values[key] = _text(data[key], source, key)
    for key in _LIST_KEYS:
        if key in data and data[key] is not None:
            items = data[key] if isinstance(data[key], list) else [data[key]]
            values[key] = tuple(_text(item, source, key) for item in items)
    if data.get("creators") is not None:
        items = data["creators"] if isinstance(data["creators"], list) else [data["creators"]]
        values["creators"] = tuple(_creator(item, source, index) for index, item in enumerate(items))
    return DatasetCard(**values)


def _text(value: Any, source: str, key: str) -> str:
    if isinstance(value, (datetime.date, datetime.datetime)) and key == "date_published":
        return value.isoformat()  # YAML reads an unquoted 2024-05-01 as a date
    if isinstance(value, bool) or not isinstance(value, str):
        hint = " (quote it, '1.0': a number loses its text)" if isinstance(value, (int, float)) else ""
        raise CardError(f"--card {source}: field {key!r} must be text, not {type(value).__name__} {value!r}{hint}")
    if not value.strip():
        raise CardError(f"--card {source}: field {key!r} is empty")
    return value.strip() if key != "citation" else value


def _creator(item: Any, source: str, index: int) -> Creator:
    where = f"creators[{index}]"
    if isinstance(item, str):
        return Creator(name=_text(item, source, where))
    if not isinstance(item, dict):
        raise CardError(f"--card {source}: field {where!r} must be a name or a mapping of "
                        f"{', '.join(_CREATOR_KEYS)}, not {type(item).__name__}")
    for key in item:
        if key not in _CREATOR_KEYS:
            raise CardError(f"--card {source}: unknown field '{where}.{key}'; a creator has {', '.join(_CREATOR_KEYS)}")
    if "name" not in item:
        raise CardError(f"--card {source}: field '{where}.name' is missing")
    kind = _text(item.get("type", "person"), source, f"{where}.type").lower()
    if kind not in _CREATOR_TYPES:
        raise CardError(f"--card {source}: field '{where}.type' is {kind!r}: person or organization")
    return Creator(name=_text(item["name"], source, f"{where}.name"), kind=_CREATOR_TYPES[kind],
                   url=_text(item["url"], source, f"{where}.url") if item.get("url") is not None else None,
                   email=_text(item["email"], source, f"{where}.email") if item.get("email") is not None else None)

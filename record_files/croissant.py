"""The Croissant card (``croissant.json``): MLCommons' JSON-LD description of a converted dataset.

In: a dataset's manifest (``manifest.json``: splits, shards with their sha256 and sizes, classes, task,
record features) and a :class:`~record_files.dataset_card.DatasetCard` (name, description, license, citation... what a
person says about the data, from a small YAML or JSON file: :mod:`record_files.dataset_card`).
Out: the Croissant 1.1 JSON-LD dict (:func:`build_croissant`, pure) and ``croissant.json`` beside the
manifest (:func:`write_croissant`, written atomically). :func:`croissant_issues` asks ``mlcroissant``
(the test extras) what it thinks of a card.

What the card holds, and why so:

- ``distribution``: each shard a ``cr:FileObject`` with its ``sha256`` and ``contentSize`` (from the
  manifest: nothing is read again), ``encodingFormat`` ``application/x-tfrecord`` (the MIME type Google's
  Dataplex names TFRecord by; Croissant has none of its own), and one ``cr:FileSet`` of every shard, the
  source the record fields read, as the Hugging Face Hub's cards read one Parquet FileSet. The URLs are
  relative to the card's folder: a later version's card (``versions/<N>/``) reaches the shards above it.
- ``recordSet``: ``splits`` (``dataType: cr:Split``, its data inline, each split's standard URL
  ``cr:TrainingSplit``/``cr:ValidationSplit``/``cr:TestSplit``, as the Hub writes them), ``classes``
  (the label map, ``sc:Enumeration``, inline: id and name), and ``records``: one field per
  ``tf.train.Example`` key the records hold (``extract.column`` names the key), the split taken from
  the shard's file name and referencing ``splits``, labels typed ``cr:Label`` and referencing
  ``classes``, objects as one array field of sub-fields (the box ``cr:BoundingBox``), class masks
  ``cr:SegmentationMask``.
- No license, citation, url, creator or date is made up: they come from the card or are left out
  (mlcroissant then warns that license, citeAs and datePublished are missing). The name defaults to the
  dataset folder's, the description to what the records are and what converted them, the version to
  1.0.0. So the same conversion writes the same card, byte for byte, as it writes the same shards (the
  conversion's time is the manifest's ``created``, which is not pinned).
- No card of a version that masks records (``live``: an update deleted some records of a shard it kept):
  a FileObject is a whole file, so mlcroissant would read the deleted records; :func:`refuse_masked` says so,
  naming the files and what reads the version exactly.

Imports neither TensorFlow nor Apache Beam (``record_files/``): the converter writes the card into its
staging folder before it publishes, the CLI's ``card`` command writes it into a published dataset.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tempfile
from typing import Any, Mapping, Optional

import record_schema
from record_files import versions
from record_files.dataset_card import DatasetCard

CROISSANT_FILE = "croissant.json"
CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
TFRECORD_FORMAT = "application/x-tfrecord"
DEFAULT_VERSION = "1.0.0"
# The Croissant 1.1 JSON-LD context, as mlcroissant 1.1 writes it (schema.org over https, as it reads it).
CONTEXT: dict = {
    "@language": "en", "@vocab": "https://schema.org/", "sc": "https://schema.org/",
    "cr": "http://mlcommons.org/croissant/", "rai": "http://mlcommons.org/croissant/RAI/",
    "dct": "http://purl.org/dc/terms/", "arrayShape": "cr:arrayShape", "citeAs": "cr:citeAs",
    "column": "cr:column", "conformsTo": "dct:conformsTo", "containedIn": "cr:containedIn",
    "data": {"@id": "cr:data", "@type": "@json"}, "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "equivalentProperty": "cr:equivalentProperty", "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract", "field": "cr:field", "fileProperty": "cr:fileProperty", "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet", "format": "cr:format", "includes": "cr:includes", "isArray": "cr:isArray",
    "isLiveDataset": "cr:isLiveDataset", "jsonPath": "cr:jsonPath", "key": "cr:key", "md5": "cr:md5",
    "parentField": "cr:parentField", "path": "cr:path", "recordSet": "cr:recordSet", "references": "cr:references",
    "regex": "cr:regex", "repeated": "cr:repeated", "replace": "cr:replace", "samplingRate": "cr:samplingRate",
    "separator": "cr:separator", "source": "cr:source", "subField": "cr:subField", "transform": "cr:transform",
}
# Our split names -> Croissant's standard split URLs.
SPLIT_URLS: dict[str, str] = {"train": "cr:TrainingSplit", "validation": "cr:ValidationSplit", "test": "cr:TestSplit"}
SHARDS_ID = "tfrecord-shards"


class MaskedVersionError(ValueError):
    """A version that masks deleted records in its shard files (``live``, docs/update.md): no card is exact."""


def masked_shards(manifest: Mapping) -> list[str]:
    """The shard files (relative to OUT) of which ``manifest``'s version reads only some records."""
    return [shard["file"] for split in manifest["splits"].values() for shard in split["shards"] if "live" in shard]


def refuse_masked(manifest: Mapping) -> None:
    """Raise :class:`MaskedVersionError` naming the masked shards and what to do, when the version masks any.

    Why refuse, not write: a Croissant ``FileObject`` is a whole file, and Croissant has no way to say "these
    records of it only"; mlcroissant would read a masked file's deleted records back as the version's (deleted
    and changed images, a relabelled image twice). A card that is wrong without a sign is worse than none.
    """
    masked = masked_shards(manifest)
    if not masked:
        return
    shown = ", ".join(masked[:5]) + (f" and {len(masked) - 5} more" if len(masked) > 5 else "")
    version = manifest.get("version") or versions.FIRST_VERSION
    raise MaskedVersionError(
        f"version {version} reads only some records of {len(masked)} shard file{'s' if len(masked) > 1 else ''} "
        f"({shown}: its manifest's 'live' runs mask records an update deleted), and a Croissant FileObject is a "
        "whole file: mlcroissant would read the deleted records too, so no card is written. To read this version "
        f"exactly use reader.build_dataset(OUT, ..., version={version}) or its records tables "
        "(<split>.records.parquet, one row a record it reads); for a card, convert SRC again with --overwrite "
        "(shards holding exactly its records)")


def build_croissant(manifest: Mapping, card: Optional[DatasetCard] = None, folder_name: str = "dataset") -> dict:
    """The Croissant JSON-LD of the dataset ``manifest`` describes (see the module docstring).

    ``folder_name``: the dataset folder's name, the default ``name``. Pure: the same manifest (its
    ``created`` aside) and card give the same card, byte for byte.

    Raises:
      MaskedVersionError: the version masks records of its shard files (:func:`refuse_masked`).
    """
    refuse_masked(manifest)
    card = card or DatasetCard()
    return {
        "@context": CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CONFORMS_TO,
        "name": card.name or folder_name,
        "description": (card.description or default_description(manifest)) + _license_note(card),
        **({"license": list(card.license) if len(card.license) > 1 else card.license[0]} if card.license else {}),
        **({"citeAs": card.citation} if card.citation else {}),
        **({"url": card.url} if card.url else {}),
        **({"creator": [c.to_jsonld() for c in card.creators]} if card.creators else {}),
        **({"keywords": list(card.keywords)} if card.keywords else {}),
        "version": card.version or DEFAULT_VERSION,
        **({"datePublished": card.date_published} if card.date_published else {}),
        "distribution": _distribution(manifest),
        "recordSet": [_splits_record_set(manifest), _classes_record_set(manifest), _records_record_set(manifest)],
    }


def _license_note(card: DatasetCard) -> str:
    """Where a licence the user did not give came from (Croissant has no field for it: the description says it)."""
    if not (card.license and card.license_source):
        return ""
    return f" The license is as the source's {card.license_source} states it."


def default_description(manifest: Mapping) -> str:
    """What a card says when the user says nothing: what the records are and what wrote them."""
    splits = manifest["splits"]
    counts = ", ".join(f"{name} {s['num_examples']} records in {s['num_shards']} "
                       f"shard{'s' if s['num_shards'] != 1 else ''}" for name, s in splits.items())
    named = [c for c in manifest["classes"] if c]
    task = manifest.get("task", record_schema.TASK_CLASSIFICATION)
    return (f"Images as tf.train.Example records in TFRecord shards ({task}, {len(named)} classes): {counts}. "
            f"Converted by {manifest.get('tool', 'imgshards')}; manifest.json lists the shards.")


def _distribution(manifest: Mapping) -> list[dict]:
    """The shards as FileObjects, then the FileSet the record fields read.

    A shard's ``file`` is relative to OUT; the card lies beside its version's manifest (OUT for version 1,
    ``OUT/versions/<N>/`` after), and mlcroissant resolves a ``contentUrl`` against the card's folder: so the
    URL is the file relative to that folder (``../../train-...``). The FileSet: version 1's globs its folder
    (mlcroissant walks a FileSet's folder downward, and version 1's shards are the ``<split>-*`` files at
    OUT's top); a later version's shards lie above its folder, reused, compacted or new, under names that
    differ: its FileSet is contained in its FileObjects, every one of them.
    """
    card_dir = versions.version_dir(manifest.get("version") or versions.FIRST_VERSION)
    files = []
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            url = posixpath.relpath(shard["file"], card_dir) if card_dir else shard["file"]
            files.append({"@type": "cr:FileObject", "@id": shard["file"], "name": shard["file"],
                          "contentUrl": url, "contentSize": f"{shard['num_bytes']} B",
                          "encodingFormat": TFRECORD_FORMAT, "sha256": shard["sha256"]})
    shard_set = {"@type": "cr:FileSet", "@id": SHARDS_ID, "name": SHARDS_ID,
                 "description": "Every shard: tf.train.Example records, one an image.",
                 "encodingFormat": TFRECORD_FORMAT}
    if card_dir:
        shard_set.update(containedIn=[{"@id": f["@id"]} for f in files], includes=["*.tfrecord"])
    else:  # byte for byte the card version 1 has always had
        shard_set["includes"] = [f"{name}-*-of-*.tfrecord" for name in manifest["splits"]] or ["*.tfrecord"]
    return files + [shard_set]


def _splits_record_set(manifest: Mapping) -> dict:
    names = list(manifest["splits"])
    return {
        "@type": "cr:RecordSet", "@id": "splits", "name": "splits", "dataType": "cr:Split",
        "description": "The dataset's splits, each with its standard Croissant split URL and its record count.",
        "key": {"@id": "splits/name"},
        "field": [_field("splits/name", "sc:Text", "The split's name, as in the shards' file names."),
                  _field("splits/url", "sc:Text", "Croissant's URL of the split's meaning."),
                  _field("splits/num_examples", "sc:Integer", "Records in the split.")],
        "data": [{"splits/name": name, "splits/url": SPLIT_URLS.get(name, name),
                  "splits/num_examples": manifest["splits"][name]["num_examples"]} for name in names],
    }


def _classes_record_set(manifest: Mapping) -> dict:
    """The label map, inline: record label id -> name (object datasets skip the ids no class has)."""
    text = manifest.get("class_text") or manifest["classes"]
    return {
        "@type": "cr:RecordSet", "@id": "classes", "name": "classes", "dataType": "sc:Enumeration",
        "description": "The label map: the label id the records hold, and its class name and text.",
        "key": {"@id": "classes/label"},
        "field": [_field("classes/label", "sc:Integer", "The label id in the records."),
                  _field("classes/name", "sc:Text", "The class name (labels.txt's line)."),
                  _field("classes/text", "sc:Text", "The class's text (the synset's words, or its name).")],
        "data": [{"classes/label": index, "classes/name": name, "classes/text": text[index] or name}
                 for index, name in enumerate(manifest["classes"]) if name],
    }


def _field(field_id: str, data_type: Any, description: str, column: Optional[str] = None, **more: Any) -> dict:
    field = {"@type": "cr:Field", "@id": field_id, "name": field_id, "description": description,
             "dataType": data_type}
    if column is not None:
        field["source"] = {"fileSet": {"@id": SHARDS_ID}, "extract": {"column": column}}
    field.update(more)
    return field


# Record keys -> (field name, data type, description); keys not listed get a generic field from their kind.
_IMAGE_FIELDS: dict[str, tuple[str, Any, str]] = {
    record_schema.IMAGE_ENCODED: ("image", "sc:ImageObject", "The image's encoded bytes (JPEG, or PNG/GIF/BMP/WebP "
                                  "as image/format says)."),
    record_schema.IMAGE_FORMAT: ("format", "sc:Text", "The image's format: jpeg, png, ..."),
    record_schema.HEIGHT: ("height", "sc:Integer", "The stored image's height in pixels."),
    record_schema.WIDTH: ("width", "sc:Integer", "The stored image's width in pixels."),
    record_schema.CHANNELS: ("channels", "sc:Integer", "The stored image's channels: 3 RGB, 1 grayscale."),
    record_schema.FILENAME: ("filename", "sc:Text", "The image's path in the source."),
    record_schema.SHA256: ("sha256", "sc:Text", "The sha256 of the stored image bytes, in hex."),
    record_schema.SOURCE_ID: ("source_id", "sc:Text", "The image's id in the source (COCO's image id)."),
    record_schema.LABEL: ("label", ["sc:Integer", "cr:Label"], "The class label id (see the classes record set)."),
    record_schema.LABEL_TEXT: ("label_text", "sc:Text", "The class name of the label."),
    record_schema.SEGMENTATION_ENCODED: ("class_mask", ["cr:SegmentationMask", "sc:ImageObject"],
                                         "A PNG of class label ids, pixel by pixel, the stored image's size."),
    record_schema.SEGMENTATION_FORMAT: ("class_mask_format", "sc:Text", "The class mask's format: png."),
}
_OBJECT_FIELDS: dict[str, tuple[str, Any, str]] = {
    record_schema.OBJECT_LABEL: ("label", ["sc:Integer", "cr:Label"], "The object's class label id (classes)."),
    record_schema.OBJECT_TEXT: ("label_text", "sc:Text", "The object's class name."),
    record_schema.OBJECT_AREA: ("area", "sc:Float", "The object's area in pixels of the stored image."),
    record_schema.OBJECT_IS_CROWD: ("is_crowd", "sc:Integer", "1 for COCO's crowd regions."),
    record_schema.OBJECT_DIFFICULT: ("difficult", "sc:Integer", "1 for VOC's difficult objects."),
    record_schema.OBJECT_TRUNCATED: ("truncated", "sc:Integer", "1 for VOC's truncated objects."),
    record_schema.OBJECT_MASK: ("mask", ["cr:SegmentationMask", "sc:ImageObject"],
                                "A PNG of 0s and 1s, the stored image's size: the object's instance mask."),
}
_BOX_KEYS = (record_schema.BBOX_XMIN, record_schema.BBOX_YMIN, record_schema.BBOX_XMAX, record_schema.BBOX_YMAX)
_KIND_TYPES = {"bytes": "sc:Text", "int64": "sc:Integer", "float": "sc:Float"}


def _records_record_set(manifest: Mapping) -> dict:
    """One record per image: its split, then a field per record key (objects as one array of sub-fields)."""
    features: Mapping[str, str] = manifest.get("features") or record_schema.FEATURES
    fields = [{
        **_field("records/split", "sc:Text", "The record's split, from its shard's file name."),
        "source": {"fileSet": {"@id": SHARDS_ID}, "extract": {"fileProperty": "filename"},
                   "transform": {"regex": r"^(.+)-[0-9]{5,}-of-[0-9]{5,}\.tfrecord$"}},
        "references": {"field": {"@id": "splits/name"}},
    }]
    objects = []
    for key, kind in features.items():
        listed = kind.endswith("_list")
        if key in _BOX_KEYS:
            continue
        if key in _OBJECT_FIELDS or (listed and key.startswith("image/object/")):
            name, data_type, text = _OBJECT_FIELDS.get(key) or _generic(key, kind)
            objects.append(_field(f"records/objects/{name}", data_type, text, column=key,
                                  **_references(data_type)))
            continue
        name, data_type, text = _IMAGE_FIELDS.get(key) or _generic(key, kind)
        fields.append(_field(f"records/{name}", data_type, text, column=key,
                             **({"isArray": True} if listed else {}), **_references(data_type)))
    if all(key in features for key in _BOX_KEYS):
        objects.insert(0, {**_field("records/objects/bbox", "cr:BoundingBox",
                                    "The object's box, normalized to [0, 1] of the stored image: xmin, ymin, "
                                    "xmax, ymax (Keras' rel_xyxy)."),
                           "subField": [_field(f"records/objects/bbox/{key.rsplit('/', 1)[1]}", "sc:Float",
                                               f"The box's {key.rsplit('/', 1)[1]}, in [0, 1].", column=key)
                                        for key in _BOX_KEYS]})
    if objects:
        fields.append({**_field("records/objects", "cr:Label", "The image's objects: the same position in every "
                                "sub-field's list is one object."), "isArray": True, "subField": objects})
    task = manifest.get("task", record_schema.TASK_CLASSIFICATION)
    return {"@type": "cr:RecordSet", "@id": "records", "name": "records",
            "description": f"One record per image ({task}): the tf.train.Example keys each field's "
                           "extract.column names, in every shard.",
            "field": fields}


def _generic(key: str, kind: str) -> tuple[str, Any, str]:
    name = key.removeprefix("image/object/").removeprefix("image/").replace("/", "_")
    return name, _KIND_TYPES.get(kind.removesuffix("_list"), "sc:Text"), f"The record's {key!r} ({kind})."


def _references(data_type: Any) -> dict:
    """Label id fields point at the label map."""
    return {"references": {"field": {"@id": "classes/label"}}} if "cr:Label" in data_type else {}


def croissant_text(jsonld: Mapping) -> str:
    """The card as ``croissant.json`` holds it."""
    return json.dumps(jsonld, indent=2, ensure_ascii=False) + "\n"


def write_croissant(data_dir: str, card: Optional[DatasetCard] = None, manifest: Optional[Mapping] = None,
                    folder_name: Optional[str] = None) -> str:
    """Write ``croissant.json`` beside ``data_dir``'s manifest (temp file + rename: never half a card).

    ``manifest``: the manifest to describe, when it is not yet in ``data_dir`` (a staging folder).
    ``folder_name``: the dataset's folder name, the card's default name (default: ``data_dir``'s; a version's
    folder ``versions/<N>`` is not the dataset's).
    Returns the card's path. A local folder: the converter writes remote stagings with
    :func:`croissant_text` through its own file systems.
    """
    if manifest is None:
        path = os.path.join(data_dir, record_schema.MANIFEST_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                manifest = json.load(handle)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{data_dir} holds no {record_schema.MANIFEST_FILE}: not a converted dataset") from None
    name = folder_name or os.path.basename(os.path.abspath(data_dir))  # `card .`: the folder's name
    text = croissant_text(build_croissant(manifest, card, folder_name=name))
    target = os.path.join(data_dir, CROISSANT_FILE)
    handle, temp = tempfile.mkstemp(prefix=f".{CROISSANT_FILE}.", suffix=".tmp", dir=data_dir)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return target


def croissant_issues(path: str) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` mlcroissant finds in the card at ``path`` (``pip install mlcroissant``).

    Errors: the card is not valid Croissant. Warnings: recommended properties missing (license and
    citeAs when the card gives none).
    """
    try:
        import mlcroissant
    except ImportError:
        raise ImportError("checking a Croissant card needs mlcroissant: pip install mlcroissant") from None
    absl = logging.getLogger("absl")  # mlcroissant also logs the warnings it returns here
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        dataset = mlcroissant.Dataset(jsonld=path)
    except mlcroissant.ValidationError as err:
        return [line for line in str(err).splitlines() if line.strip()], []
    finally:
        absl.setLevel(level)
    issues = dataset.metadata.ctx.issues
    return sorted(str(e) for e in issues.errors), sorted(str(w) for w in issues.warnings)


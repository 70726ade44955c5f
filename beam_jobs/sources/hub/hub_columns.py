"""Which columns of a Hugging Face dataset hold the image and its labels (or objects), as its features say.

In:  a file's Arrow schema (its ``huggingface`` metadata: the Hub's features), the flags that name columns,
     and the class names a snapshot's ``README.md`` gives.
Out: :class:`Columns`: the image column (the Hub's Image feature, ``struct<bytes: binary, path: string>``),
     the label column (a ClassLabel, text, or integers named by ``--labels``) and its names, or a column of
     objects or of several labels (:mod:`beam_jobs.sources.hub.hub_annotations`); or an InputError naming the
     file, its columns and the flag to use.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning.discover import InputError
from beam_jobs.sources.hub import hub_annotations

@dataclasses.dataclass(frozen=True)
class Columns:
    """Which columns hold the image and the label, and the label's names (ClassLabel order)."""

    image: str
    label: str
    names: Optional[tuple[str, ...]]  # None: a plain column (strings, or integers named by --labels)
    integer_labels: bool
    annotation: Optional[hub_annotations.AnnotationColumn] = None  # objects or several labels, not one label
    extra: tuple[str, ...] = ()  # width, height and image_id, where the file has them (an object's frame and id)


def _features(schema) -> dict:
    """The Hub's features of a Parquet schema (its ``huggingface`` metadata), or {}."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}


def _is_image_type(field) -> bool:
    import pyarrow as pa

    kind = field.type
    if not pa.types.is_struct(kind):
        return False
    names = {kind.field(i).name: kind.field(i).type for i in range(kind.num_fields)}
    return set(names) == {"bytes", "path"} and pa.types.is_binary(names["bytes"]) or \
        set(names) == {"bytes", "path"} and pa.types.is_large_binary(names["bytes"])


def find_columns(schema, path: str, image_column: Optional[str], label_column: Optional[str],
                 readme_names: dict[str, tuple[str, ...]]) -> Columns:
    """The image and label columns of a file, as the flags or the Hub's features name them.

    Raises:
      InputError: naming the file, its columns and the flag to use.
    """
    features = _features(schema)
    fields = {field.name: field for field in schema}
    listed = ", ".join(f"{f.name} ({f.type})" for f in schema)
    images = [name for name, field in fields.items()
              if _is_image_type(field) or (features.get(name) or {}).get("_type") == "Image"]
    image = _pick("--image-column", image_column, images, fields, path, listed,
                  "image column (the Hub's Image feature, struct<bytes: binary, path: string>)")
    if image_column is not None and not _is_image_type(fields[image]):
        raise InputError(f"--image-column {image!r}: in {path} it is {fields[image].type}, not the Hub's Image "
                         "feature (struct<bytes: binary, path: string>)")
    class_labels = [name for name, spec in features.items() if (spec or {}).get("_type") == "ClassLabel"]
    class_labels += [name for name in readme_names if name in fields and name not in class_labels]
    annotated = {found.column: found for found in hub_annotations.find(features)}
    if label_column in annotated or (label_column is None and not class_labels and annotated):
        column = annotated[_pick("--label-column", label_column, list(annotated), fields, path, listed,
                                 "column of objects or of several labels")]
        extra = tuple(name for name in ("width", "height", "image_id") if name in fields)
        return Columns(image, column.column, column.names, True, column, extra)
    label = _pick("--label-column", label_column, class_labels, fields, path, listed,
                  "ClassLabel column (none in its huggingface metadata or the dataset's README.md)")
    spec = features.get(label) or {}
    names = tuple(spec["names"]) if spec.get("_type") == "ClassLabel" and spec.get("names") else \
        readme_names.get(label)
    import pyarrow as pa

    kind = fields[label].type
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"--label-column {label!r}: in {path} it is {kind}; a label column holds integers or text")
    return Columns(image, label, names, pa.types.is_integer(kind))


def _pick(flag: str, given: Optional[str], found: Sequence[str], fields: dict, path: str, listed: str,
          what: str) -> str:
    """The column ``flag`` names, or the one column found; an InputError naming the file and the flag otherwise."""
    if given is not None:
        if given not in fields:
            raise InputError(f"{flag} {given!r}: {path} has no such column; its columns are {listed}")
        return given
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"{path} has no {what}; its columns are {listed}. Name one with {flag} NAME")
    raise InputError(f"{path} has several {what.split(' (')[0]}s {list(found)}: pick one with {flag} NAME")


def readme_class_names(src: str) -> dict[str, tuple[str, ...]]:
    """Column -> ClassLabel names from a Hub snapshot's ``README.md`` (its YAML's ``dataset_info``), or {}."""
    path = FileSystems.join(src, "README.md")
    try:
        with FileSystems.open(path) as handle:
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return {}
    if not text.startswith("---"):
        return {}
    import yaml

    try:
        card = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return {}
    infos = card.get("dataset_info") if isinstance(card, dict) else None
    found: dict[str, tuple[str, ...]] = {}
    for info in infos if isinstance(infos, list) else [infos] if isinstance(infos, dict) else []:
        for feature in info.get("features") or []:
            names = ((feature.get("dtype") or {}) if isinstance(feature.get("dtype"), dict) else {}) \
                .get("class_label", {}).get("names")
            if isinstance(names, dict):
                found.setdefault(feature.get("name"), tuple(str(names[k]) for k in sorted(names, key=int)))
    return found

"""What each section of the report says: the page's HTML and report.json's figures, made from one set of findings.

In: :class:`Findings` (the manifest, the pass's :class:`reader.tools.report_stats.SplitStats`, rejections,
duplicates, the tiles and thumbnails drawn). Out: :func:`render` gives the page's text and the JSON
figures; each ``_section`` function gives one :class:`reader.tools.report_html.Section` and its JSON part, so
the page and the JSON cannot disagree.

Sections (ids, in order): ``splits``, ``classes``, ``objects`` (datasets of objects only), ``images``,
``rejections``, ``contact-sheets``, ``duplicates``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from PIL import Image

import record_schema
from reader.tools import report_figures as plots
from reader.tools import report_html as h
from reader.info import DatasetInfo
from reader.tools.report_inputs import Duplicates, Rejections
from reader.tools.report_stats import MAX_OBJECTS_BIN, SplitStats

from reader.tools.report_options import ReportOptions

GROUP_SHOWN = 4  # images of a duplicate group drawn (the JSON lists them all)
GAP = 4


@dataclasses.dataclass(frozen=True)
class Findings:
    """Everything the report shows, gathered by :func:`reader.tools.report.write_report`."""

    info: DatasetInfo
    splits: dict[str, SplitStats]
    rejections: Rejections
    rejected_thumbs: list[tuple[Optional[Image.Image], str]]
    duplicates: Duplicates
    duplicate_thumbs: dict[str, Image.Image]
    sheets: dict[int, list[Image.Image]]
    sheet_classes_left: int
    masks_read: int
    options: ReportOptions
    croissant: Optional[str]
    manifest: str
    scanned: bool = False  # the figures come from reading every record (a dataset without records tables)
    dataset_name: str = ""  # the title's: the folder, with the version of a dataset that grew (--update)

    @property
    def names(self) -> list[str]:
        return list(self.info.manifest.get("class_text") or self.info.classes)

    @property
    def named(self) -> list[int]:
        """Class ids that are classes (an object dataset's id 0 and unused ids are not)."""
        objects = self.info.task == record_schema.TASK_OBJECTS
        return [label for label, name in enumerate(self.info.classes) if name or not objects]

    def name(self, class_id: int) -> str:
        names = self.names
        return names[class_id] if 0 <= class_id < len(names) and names[class_id] else str(class_id)


def render(findings: Findings) -> tuple[str, dict]:
    """The page's HTML and report.json's content."""
    builders = [_splits, _classes] + ([_objects] if findings.info.task == record_schema.TASK_OBJECTS else []) + \
        [_images, _rejections, _contact_sheets, _duplicates]
    sections, figures = [], {"dataset": findings.info.data_dir, "version": findings.info.version,
                             "task": findings.info.task}
    for build in builders:
        section, data = build(findings)
        sections.append(section)
        figures[section.id] = data
    figures["sections"] = [section.id for section in sections]
    figures["figures_from"] = "scan" if findings.scanned else "records tables"
    info = findings.info
    subtitle = (f"{info.task}, {len(findings.named)} classes, "
                f"{sum(s.images for s in findings.splits.values()):,} images; converted "
                f"{info.manifest.get('created', '?')} from {(info.manifest.get('options') or {}).get('src', '?')}"
                + (f"; {_no_tables(info)}, so every record was read for these figures" if findings.scanned else ""))
    return h.page(f"Dataset report: {findings.dataset_name or info.data_dir}", subtitle, sections), figures


def _no_tables(info) -> str:
    """Why the dataset has no records tables: converted before them, or a version an update wrote (none)."""
    return ("written by an update (python -m converter --update writes no records tables)"
            if info.version > 1 else "converted before records tables")  # version 1: the conversion's


def _splits(f: Findings) -> tuple[h.Section, dict]:
    manifest = f.info.manifest.get("splits", {})
    objects = f.info.task == record_schema.TASK_OBJECTS
    rows, data = [], {}
    for name, stats in f.splits.items():
        raw = manifest.get(name, {})
        data[name] = {"images": stats.images, "shards": raw.get("num_shards", len(f.info.splits[name].shards)),
                      "bytes": raw.get("num_bytes", 0), **({"objects": stats.num_objects} if objects else {})}
        rows.append([name, stats.images] + ([stats.num_objects] if objects else [])
                    + [data[name]["shards"], data[name]["bytes"]])
    links = [h.link(f.manifest, "manifest.json")]
    if f.croissant:
        links.append(h.link(f.croissant, "croissant.json (Croissant metadata)"))
    body = (h.table(["split", "images"] + (["objects"] if objects else []) + ["shards", "bytes"], rows)
            + f"<p>Files: {', '.join(links)}</p>"
            + ("" if f.croissant else h.paragraph("No croissant.json beside the manifest.", note=True)))
    return h.Section("splits", "Splits and counts", body), {"splits": data, "croissant": f.croissant}


def _class_counts(f: Findings, counter_of) -> dict[str, list[int]]:
    return {name: [counter_of(stats).get(label, 0) for label in f.named] for name, stats in f.splits.items()}


def _classes(f: Findings) -> tuple[h.Section, dict]:
    task = f.info.task
    names = [f.name(label) for label in f.named]
    parts, data = [], {}
    if task == record_schema.TASK_SEGMENTATION:
        parts.append(h.paragraph("A segmentation dataset's classes are per pixel, in each image's mask: counting "
                                 "them would decode every mask, which the report does not do. The contact sheets "
                                 "below show the masks.", note=True))
    else:
        what = "images holding each class" if task == record_schema.TASK_OBJECTS else "images per class"
        counts = _class_counts(f, lambda stats: stats.images_by_class)
        data["images_by_class"] = counts
        parts.append(h.image(plots.grouped_bars(names, counts, "images", what), f"{what}, per split"))
        missing = {split: [names[i] for i, count in enumerate(values) if not count] for split, values in counts.items()}
        data["missing"] = missing
        if any(missing.values()):
            parts.append(h.heading("Classes missing from a split")
                         + h.table(["split", "classes with no image", "count"],
                                   [[split, ", ".join(gone[:50]) + (" …" if len(gone) > 50 else ""), len(gone)]
                                    for split, gone in missing.items() if gone]))
        else:
            parts.append(h.paragraph("Every class is in every split."))
    if task == record_schema.TASK_MULTILABEL:
        per_image = {name: dict(s.labels_per_image) for name, s in f.splits.items()}
        data["labels_per_image"] = {name: {str(k): v for k, v in sorted(c.items())} for name, c in per_image.items()}
        parts.append(h.image(plots.count_bars(per_image, None, "labels an image", "labels per image"),
                             "labels per image"))
    text = f.info.manifest.get("class_text") or f.info.classes
    with_text = list(text) != list(f.info.classes)
    label_map = [[label, f.info.classes[label]] + ([text[label]] if with_text else []) for label in f.named]
    data["label_map"] = {str(label): f.info.classes[label] for label in f.named}
    parts.append(h.heading("Label map") + h.table(["id", "class"] + (["text"] if with_text else []), label_map))
    return h.Section("classes", "Classes", "".join(parts)), data


def _objects(f: Findings) -> tuple[h.Section, dict]:
    names = [f.name(label) for label in f.named]
    per_image = {name: dict(s.objects_per_image) for name, s in f.splits.items()}
    sizes = {name: dict(s.box_sizes) for name, s in f.splits.items()}
    counts = _class_counts(f, lambda stats: stats.objects_by_class)
    parts = [
        h.image(plots.count_bars(per_image, MAX_OBJECTS_BIN, "objects an image", "objects per image"),
                "objects per image"),
        h.image(plots.box_sizes(sizes), "box sizes"),
        h.image(plots.aspect_ratios({name: s.aspect_counts for name, s in f.splits.items()}), "aspect ratios"),
        h.image(plots.centre_heat_maps({name: s.centres for name, s in f.splits.items()}), "box centres"),
        h.image(plots.grouped_bars(names, counts, "objects", "objects per class"), "objects per class"),
    ]
    rows = []
    for index, label in enumerate(f.named):
        row = [label, names[index]]
        for stats in f.splits.values():
            row += [stats.objects_by_class.get(label, 0), stats.crowd_by_class.get(label, 0),
                    stats.difficult_by_class.get(label, 0)]
        rows.append(row)
    header = ["id", "class"] + [f"{split} {what}" for split in f.splits for what in ("objects", "crowd", "difficult")]
    parts.append(h.heading("Objects, crowd regions and difficult objects per class") + h.table(header, rows))
    data = {name: s.to_json()["objects"] for name, s in f.splits.items() if s.objects_per_image}
    return h.Section("objects", "Objects", "".join(parts)), data


def _images(f: Findings) -> tuple[h.Section, dict]:
    manifest = f.info.manifest.get("splits", {})
    grid = sum((s.sides for s in f.splits.values()), np.zeros_like(next(iter(f.splits.values())).sides)) \
        if f.splits else np.zeros((1, 1), np.int64)
    parts = [h.image(plots.side_heat_map(grid), "stored image sizes")] if grid.any() else []
    rows, data, reasons = [], {}, {}
    for name, stats in f.splits.items():
        raw = manifest.get(name, {})
        by_reason = raw.get("reencoded_by_reason") or {}
        for reason, count in by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + count
        gray = sum(count for channels, count in stats.channels.items() if channels == 1)
        rows.append([name, stats.images, stats.min_side if stats.min_side is not None else "",
                     stats.max_side if stats.max_side is not None else "",
                     ", ".join(f"{fmt} {count:,}" for fmt, count in stats.to_json()["formats"].items()), gray,
                     raw.get("num_small", 0), raw.get("num_reencoded", 0),
                     ", ".join(f"{reason} {count:,}" for reason, count in sorted(by_reason.items())) or "none"])
        data[name] = {**{k: v for k, v in stats.to_json().items() if k not in ("images_by_class", "objects",
                                                                                "labels_per_image")},
                      "num_reencoded": raw.get("num_reencoded", 0), "reencoded_by_reason": by_reason,
                      "num_small": raw.get("num_small", 0)}
    parts.append(h.table(["split", "images", "shortest side", "longest side", "stored as", "grayscale",
                          f"a side < {record_schema.SMALL_SIDE} px", "re-encoded", "re-encoded because"], rows))
    parts.append(h.paragraph("Re-encoded: stored as a new JPEG rather than the source's bytes (a format other "
                             "than JPEG, CMYK, an EXIF rotation, a size over --max-side ...). The source format "
                             "is the reason's name when that was why.", note=True))
    if reasons:
        parts.append(h.image(plots.horizontal_bars(reasons, "images", "re-encoded, by reason"), "re-encoded"))
    return h.Section("images", "Image sizes and formats", "".join(parts)), data


def _rejections(f: Findings) -> tuple[h.Section, dict]:
    r = f.rejections
    data = r.to_json()
    data["skipped_by_reason"] = f.info.manifest.get("skipped_by_reason") or {}
    if not r.present:
        return h.Section("rejections", "Rejections", h.paragraph("No rejected.jsonl beside the manifest.",
                                                                 note=True)), data
    parts = []
    if not r.images_by_reason and not r.objects_by_reason:
        parts.append(h.paragraph("Nothing was rejected."))
    for title, counts in (("images rejected", r.images_by_reason), ("objects rejected (their image was written "
                                                                     "without them)", r.objects_by_reason)):
        if counts:
            parts.append(h.image(plots.horizontal_bars(counts, "count", f"{title}, by reason"), title)
                         + h.table(["reason", title], [[reason, count] for reason, count in counts.items()]))
    if data["skipped_by_reason"]:
        parts.append(h.paragraph("Skipped without reading: " + ", ".join(
            f"{reason} {count:,}" for reason, count in sorted(data["skipped_by_reason"].items()))))
    if r.first:
        parts.append(h.heading(f"The first {len(r.first)} in rejected.jsonl"))
        figures = []
        for entry, (thumb, note) in zip(r.first, f.rejected_thumbs):
            caption = f"{entry.get('path', '?')}: {entry['reason']}" + (
                f", annotation {entry['annotation']}" if entry.get("annotation") else "") + \
                f" ({entry.get('detail', '')})"
            if thumb is None:
                figures.append(f"<figure><figcaption>{h.escape(caption)}<br><i>{h.escape(note)}</i></figcaption>"
                               "</figure>")
            else:
                figures.append(h.picture(thumb, entry.get("path", ""), caption))
        parts.append("<div>" + "".join(figures) + "</div>")
        data["first_thumbnails"] = [note if thumb is None else "drawn" for thumb, note in f.rejected_thumbs]
    return h.Section("rejections", "Rejections", "".join(parts)), data


def _strip(tiles: list[Image.Image]) -> Image.Image:
    """Tiles side by side on white, tops aligned."""
    width = sum(tile.width for tile in tiles) + GAP * (len(tiles) - 1)
    strip = Image.new("RGB", (width, max(tile.height for tile in tiles)), "white")
    x = 0
    for tile in tiles:
        strip.paste(tile, (x, 0))
        x += tile.width + GAP
    return strip


def _contact_sheets(f: Findings) -> tuple[h.Section, dict]:
    parts, data = [], {}
    segmentation = f.info.task == record_schema.TASK_SEGMENTATION
    what = {record_schema.TASK_OBJECTS: "records holding the class, every object boxed and named",
            record_schema.TASK_MULTILABEL: "records carrying the class, each tile captioned with all its classes",
            record_schema.TASK_SEGMENTATION: "records whose mask holds the class, the mask tinted over the image, "
                                             "a color per class"}.get(f.info.task, "its first records")
    parts.append(h.paragraph(f"Per class, {what}, in shard order (train first)."))
    for label, tiles in sorted(f.sheets.items()):
        parts.append(h.heading(f"{label}: {f.name(label)}") + h.picture(_strip(tiles), f.name(label)))
        data[str(label)] = len(tiles)
    shown = f.named[:f.options.max_sheet_classes]
    empty = [f.name(label) for label in shown if label not in f.sheets and not (
        segmentation and f.name(label).strip().lower() in ("background", "_background_"))]
    if empty:
        who = f"No mask of the first {f.masks_read:,} records" if segmentation else "No record"
        parts.append(h.paragraph(f"{who} holds: " + ", ".join(empty), note=True))
    if f.sheet_classes_left:
        parts.append(h.paragraph(f"{f.sheet_classes_left} more classes have no sheet here (the first "
                                 f"{f.options.max_sheet_classes} by id are shown); python -m converter "
                                 "inspect --grid draws a split.", note=True))
    return h.Section("contact-sheets", "Contact sheets", "".join(parts)), {
        "tiles": data, **({"masks_read": f.masks_read} if segmentation else {})}


def _duplicates(f: Findings) -> tuple[h.Section, dict]:
    d = f.duplicates
    data = d.to_json()
    if not d.present:
        return h.Section("duplicates", "Duplicates", h.paragraph("No duplicates.jsonl beside the manifest.",
                                                                 note=True)), data
    if not d.groups:
        return h.Section("duplicates", "Duplicates", h.paragraph("No duplicate images.")), data
    rows = [[kind, counts["within_split"], counts["across_splits"], d.extra_images.get(kind, 0)]
            for kind, counts in d.groups.items()]
    parts = [h.table(["kind", "groups within a split", "groups across splits (leakage)", "extra copies"], rows),
             h.paragraph(f"Groups whose images carry different labels (label noise): {d.across_labels:,}.")]
    for group in sorted(d.shown, key=lambda group: not group["across_splits"]):  # leakage first
        scope = "across splits" if group["across_splits"] else "within a split"
        figures = []
        for image in group["images"][:GROUP_SHOWN]:
            caption = f"{image['split']}{'/' + str(image['label']) if image['label'] else ''}: {image['path']}" + (
                f" (distance {image['distance']})" if group["kind"] != "exact" else "")
            thumb = f.duplicate_thumbs.get(image["path"])
            figures.append(h.picture(thumb, image["path"], caption) if thumb is not None else
                           f"<figure><figcaption>{h.escape(caption)}<br><i>not in the dataset's records"
                           "</i></figcaption></figure>")
        more = len(group["images"]) - GROUP_SHOWN
        parts.append(f'<div class="pair"><b>{h.escape(group["kind"])}, {scope}</b><div>{"".join(figures)}</div>'
                     + (h.paragraph(f"and {more} more", note=True) if more > 0 else "") + "</div>")
    return h.Section("duplicates", "Duplicates and near-duplicates", "".join(parts)), data

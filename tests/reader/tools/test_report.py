"""``reader.tools.report``: the HTML report and report.json of real conversions, one per task, checked by their numbers.

Each dataset is converted in-process from files of known content (sizes, boxes, formats, duplicates,
rejections), so each figure's counts are known exactly. The page itself is checked here for what makes it
self-contained (every image a ``data:`` URI, no script, nothing fetched); tests/reader/tools/test_report_browser.py
opens it in Chromium.
"""

from __future__ import annotations

import html.parser
import io
import json
import os
import pathlib

import numpy as np
import pytest
from PIL import Image

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from reader.tools import report
from reader.tools.report_stats import ASPECT_BINS, CENTRE_GRID
from tests.object_data import class_mask_png, jpeg, picture, write_coco, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _convert(src, out, **options) -> str:
    run(ConvertOptions(src=str(src), out=str(out), shards=1, **options), FAST, show_progress=False)
    return str(out)


class _Page(html.parser.HTMLParser):
    """Every tag's name and attributes, and the section ids, of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def sections(self) -> list[str]:
        return [attrs["id"] for tag, attrs in self.tags if tag == "section"]


def _report(data_dir, dest) -> tuple[dict, _Page, str]:
    paths = report.write_report(str(data_dir), str(dest))
    text = pathlib.Path(paths.html).read_text(encoding="utf-8")
    page = _Page(text)
    figures = json.loads(pathlib.Path(paths.json).read_text(encoding="utf-8"))
    assert page.sections() == figures["sections"]
    images = [attrs for tag, attrs in page.tags if tag == "img"]
    assert images and all(attrs["src"].startswith(("data:image/png;base64,", "data:image/jpeg;base64,"))
                          for attrs in images)
    assert not [tag for tag, _ in page.tags if tag in ("script", "link", "iframe", "object", "embed")]
    for attrs in images:  # every inline image decodes
        import base64

        Image.open(io.BytesIO(base64.b64decode(attrs["src"].split(",", 1)[1]))).verify()
    return figures, page, text


@pytest.fixture(scope="module")
def classified(tmp_path_factory) -> str:
    """Splits with a class missing from validation, a PNG (re-encoded), a file that is no image (rejected), the
    same image in train and validation (an exact cross-split group); near groups written as the converter
    writes them beside."""
    root = tmp_path_factory.mktemp("classified")
    src = root / "src"
    shots = {name: jpeg(picture(160 + 16 * i, 120, [], seed=i)) for i, name in enumerate("abcdef")}
    for rel, data in {"train/cat/a.jpg": shots["a"], "train/cat/b.jpg": shots["b"], "train/dog/c.jpg": shots["c"],
                      "train/owl/d.jpg": shots["d"], "validation/cat/e.jpg": shots["e"],
                      "validation/dog/a_copy.jpg": shots["a"], "train/dog/bad.jpg": b"not an image at all\n"}.items():
        write_file(str(src / rel), data)
    png = io.BytesIO()
    picture(40, 30, [], seed=9).save(png, format="PNG")  # re-encoded, and small (a side under 32)
    write_file(str(src / "train/owl/small.png"), png.getvalue())
    write_file(str(src / "train/cat/tiny.jpg"), jpeg(picture(20, 16, [], seed=10)))  # under --min-side 25
    # No hash: the near groups are the two planted below, so their counts and distances are known.
    out = _convert(src, root / "out", max_bad_fraction=0.5, encode=EncodeOptions(min_side=25, perceptual_hash=False))
    with open(os.path.join(out, "duplicates.jsonl"), "a") as handle:  # the near groups' format (issue #48 §2)
        handle.write(json.dumps({"kind": "near", "images": [
            {"split": "train", "label": "cat", "path": "train/cat/b.jpg", "distance": 0},
            {"split": "validation", "label": "cat", "path": "validation/cat/e.jpg", "distance": 5}]}) + "\n")
        handle.write(json.dumps({"kind": "near", "images": [
            {"split": "train", "label": "cat", "path": "train/cat/a.jpg", "distance": 0},
            {"split": "train", "label": "dog", "path": "train/dog/c.jpg", "distance": 3}]}) + "\n")
    return out


@pytest.fixture(scope="module")
def coco_demo(tmp_path_factory) -> str:
    """The COCO demo of 15 images (12 train, 3 validation), converted."""
    from converter.demo import write_object_demo

    root = tmp_path_factory.mktemp("coco-demo")
    write_object_demo(str(root / "demo"), "coco", images=15, seed=3)
    return _convert(root / "demo", root / "ds")


@pytest.fixture(scope="module")
def segmented(tmp_path_factory) -> str:
    """Three images with one-class masks: road (masks 0 and 2) and car (mask 1)."""
    root = tmp_path_factory.mktemp("segmented")
    src = root / "seg"
    for index in range(3):
        write_file(str(src / f"images/training/{index}.jpg"), jpeg(picture(96, 64, [], seed=index)))
        write_file(str(src / f"annotations/training/{index}.png"), class_mask_png(96, 64, (10, 10, 50, 40), 1 + index % 2))
    write_file(str(root / "labels.txt"), "background\nroad\ncar\n")
    return _convert(src, root / "ds", labels_file=str(root / "labels.txt"))


@pytest.fixture(scope="module")
def multilabel(tmp_path_factory) -> str:
    """Four images tagged as Planet's tags.csv tags them: 0, 1, 2 and 3 labels an image."""
    root = tmp_path_factory.mktemp("multilabel")
    tags = {"a": "haze primary", "b": "clear primary water", "c": "", "d": "clear"}
    for index, name in enumerate(tags):
        write_file(str(root / "planet" / f"{name}.jpg"), jpeg(picture(96, 64, [], seed=index)))
    write_file(str(root / "tags.csv"), "image_name,tags\n" + "".join(f"{k},{v}\n" for k, v in tags.items()))
    return _convert(root / "planet", root / "ds", annotations=str(root / "tags.csv"),
                    annotation_columns=("image_name", "tags"), label_separator=" ")


def test_a_classification_report_counts_classes_formats_rejections_and_duplicates(classified, tmp_path):
    figures, page, text = _report(classified, tmp_path)
    assert figures["sections"] == ["splits", "classes", "images", "rejections", "contact-sheets", "duplicates"]
    assert figures["splits"]["splits"]["train"]["images"] == 5 and figures["splits"]["splits"]["validation"][
        "images"] == 2
    assert figures["classes"]["images_by_class"] == {"train": [2, 1, 2], "validation": [1, 1, 0]}
    assert figures["classes"]["missing"] == {"train": [], "validation": ["owl"]}
    assert figures["classes"]["label_map"] == {"0": "cat", "1": "dog", "2": "owl"}
    images = figures["images"]
    assert images["train"]["reencoded_by_reason"] == {"png": 1} and images["train"]["num_small"] == 1
    assert (images["train"]["min_side"], images["train"]["max_side"]) == (30, 208)
    assert images["train"]["formats"] == {"jpeg": 5}
    assert sum(map(sum, images["train"]["sides"]["width_by_height"]["counts"])) == 5
    rejections = figures["rejections"]
    assert rejections["images_by_reason"] == {"not-an-image": 1, "too-small": 1}
    thumbnails = dict(zip((entry["path"] for entry in rejections["first"]), rejections["first_thumbnails"]))
    assert thumbnails["train/cat/tiny.jpg"] == "drawn"  # read again from SRC
    assert "does not decode as an image" in thumbnails["train/dog/bad.jpg"]
    duplicates = figures["duplicates"]
    assert duplicates["groups"] == {"exact": {"within_split": 0, "across_splits": 1},
                                    "near": {"within_split": 1, "across_splits": 1}}
    assert duplicates["extra_images"] == {"exact": 1, "near": 2} and duplicates["across_labels"] == 2
    assert figures["contact-sheets"]["tiles"] == {"0": 3, "1": 2, "2": 2}
    # Each duplicate drawn from its record: 6 distinct images in 3 groups, each a thumbnail
    assert text.count('<div class="pair">') == 3 and "not in the dataset" not in text
    assert "(distance 5)" in text and figures["splits"]["croissant"].endswith("croissant.json")  # every run writes it


@pytest.mark.slow
def test_the_report_goes_beside_the_manifest_by_default_and_links_the_croissant_card(classified, tmp_path):
    import shutil

    data = shutil.copytree(classified, tmp_path / "copy")
    (data / "croissant.json").write_text("{}")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["options"]["src"] = str(tmp_path / "moved")  # the source is gone since
    (data / "manifest.json").write_text(json.dumps(manifest))
    paths = report.write_report(str(data))
    assert paths == report.ReportPaths(str(data / "report.html"), str(data / "report.json"))
    assert '<a href="croissant.json">' in (data / "report.html").read_text()
    assert all(note.startswith(f"not readable at {tmp_path / 'moved'}/train/") for note in
               json.loads((data / "report.json").read_text())["rejections"]["first_thumbnails"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    report.write_report(str(data), str(elsewhere))
    assert '<a href="../copy/croissant.json">' in (elsewhere / "report.html").read_text()


@pytest.mark.slow
def test_objects_sizes_aspect_ratios_centres_crowds_per_class_from_known_boxes(tmp_path):
    # 192 x 144 images; boxes (x0, y0, x1, y1, class, crowd): 20x20 small, 50x40 medium, 120x100 large
    boxes = {"a.jpg": [(10, 10, 30, 30, 1, 0), (100, 50, 150, 90, 2, 0)],
             "b.jpg": [(40, 20, 160, 120, 1, 0), (0, 0, 20, 20, 2, 1)], "c.jpg": []}
    images, annotations, files = [], [], {}
    for index, (name, objects) in enumerate(boxes.items()):
        images.append({"id": index + 1, "file_name": name, "width": 192, "height": 144})
        files[name] = jpeg(picture(192, 144, [box[:4] for box in objects], seed=index))
        for x0, y0, x1, y1, category, crowd in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": index + 1, "category_id": category,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": crowd})
    write_coco(str(tmp_path / "coco"), "train2017", images, annotations,
               [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}, {"id": 3, "name": "owl"}], files)
    out = _convert(tmp_path / "coco", tmp_path / "ds")
    figures, _, _ = _report(out, tmp_path)
    assert figures["sections"] == ["splits", "classes", "objects", "images", "rejections", "contact-sheets",
                                   "duplicates"]
    objects = figures["objects"]["train"]
    assert objects["total"] == 4 and objects["by_class"] == {"1": 2, "2": 2}
    assert objects["crowd_by_class"] == {"2": 1} and objects["difficult_by_class"] == {}
    assert objects["per_image"] == {"0": 1, "2": 2}
    assert objects["box_sizes"] == {"small": 2, "medium": 1, "large": 1}
    aspect = objects["aspect_ratio"]["counts"]
    assert aspect[int(np.searchsorted(ASPECT_BINS, 1.0, "right"))] == 2  # the two squares
    assert aspect[int(np.searchsorted(ASPECT_BINS, 1.2, "right"))] == 2  # 50 x 40 and 120 x 100: one bin
    assert sum(aspect) == 4
    centres = np.asarray(objects["centres"]["rows_top_down"])
    assert centres.sum() == 4 and centres.shape == (CENTRE_GRID, CENTRE_GRID)
    assert centres[int(20 / 144 * CENTRE_GRID), int(20 / 192 * CENTRE_GRID)] == 1  # a.jpg's small box
    assert figures["classes"]["missing"] == {"train": ["owl"]}
    assert figures["classes"]["images_by_class"] == {"train": [2, 2, 0]}
    assert figures["contact-sheets"]["tiles"] == {"1": 2, "2": 2}


@pytest.mark.slow
def test_the_coco_demo_report_agrees_with_the_manifest(coco_demo, tmp_path):
    figures, _, _ = _report(coco_demo, tmp_path)
    manifest = json.loads(pathlib.Path(coco_demo, "manifest.json").read_text())
    for split, raw in manifest["splits"].items():
        objects = figures["objects"][split]
        assert objects["total"] == raw["num_objects"] == sum(objects["box_sizes"].values())
        assert [objects["by_class"].get(str(i), 0) for i in range(4)] == raw["label_counts"]
        assert sum(objects["aspect_ratio"]["counts"]) == raw["num_objects"]


def test_a_multilabel_report_counts_images_per_class_and_labels_per_image(multilabel, tmp_path):
    figures, _, text = _report(multilabel, tmp_path)
    names = figures["classes"]["label_map"]
    counts = dict(zip(names.values(), figures["classes"]["images_by_class"]["train"]))
    assert counts == {"clear": 2, "haze": 1, "primary": 2, "water": 1}
    assert figures["classes"]["labels_per_image"] == {"train": {"0": 1, "1": 1, "2": 1, "3": 1}}
    assert sum(figures["contact-sheets"]["tiles"].values()) == 6


def test_a_segmentation_report_files_records_under_their_masks_classes_and_says_why_it_counts_none(segmented,
                                                                                                   tmp_path):
    figures, _, text = _report(segmented, tmp_path)
    assert figures["contact-sheets"]["tiles"] == {"1": 2, "2": 1}  # road: masks 0 and 2; car: mask 1
    assert figures["contact-sheets"]["masks_read"] == 3
    assert "classes are per pixel" in text and "images_by_class" not in figures["classes"]
    assert figures["images"]["train"]["formats"] == {"jpeg": 3}


@pytest.mark.slow
def test_class_names_and_paths_are_shown_as_text_never_as_markup(tmp_path):
    write_file(str(tmp_path / "src/<i onclick=x>A&B<i>/x.jpg"), jpeg(picture(64, 48, [], seed=1)))
    write_file(str(tmp_path / "src/plain/y.jpg"), jpeg(picture(64, 48, [], seed=2)))
    out = _convert(tmp_path / "src", tmp_path / "ds")
    _, page, text = _report(out, tmp_path)
    assert "&lt;i onclick=x&gt;A&amp;B&lt;i&gt;" in text
    assert "i" not in [tag for tag, _ in page.tags] and "<i onclick" not in text


def test_a_damaged_duplicates_line_or_a_missing_folder_is_named(classified, tmp_path):
    import shutil

    data = shutil.copytree(classified, tmp_path / "copy")
    bad_line = len((data / "duplicates.jsonl").read_text().splitlines()) + 1
    with open(data / "duplicates.jsonl", "a") as handle:
        handle.write('{"kind": "near", "images": "none"}\n')
    with pytest.raises(ValueError, match=rf"duplicates.jsonl line {bad_line}: not a duplicate group"):
        report.write_report(str(data))
    with pytest.raises(ValueError, match="cannot write the report into .*nowhere: not a folder"):
        report.write_report(str(classified), str(tmp_path / "nowhere"))


def test_the_command_writes_the_report_and_names_what_is_wrong(classified, tmp_path, capsys):
    """``python -m converter report``'s function, in this process (its one parser: the report has no other)."""
    from converter.dataset_commands import report as command

    assert command([classified, "--dest", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path}/report.html", f"wrote {tmp_path}/report.json"]
    assert command([str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        command(["--nope"])
    assert exit_.value.code == 2


def _drawn(page_text: str) -> list[str]:
    """The page's inline images, in order (the tiles, thumbnails and figures drawn)."""
    import re

    return re.findall(r'src="(data:image/[^"]+)"', page_text)


def _same_as_a_scan(data_dir, tmp_path) -> dict:
    """The report from the records tables, checked against the scan of every record: the same figures, the same
    drawings; its figures."""
    (tmp_path / "tables").mkdir(parents=True)
    (tmp_path / "scan").mkdir()
    figures, _, text = _report(data_dir, tmp_path / "tables")
    paths = report.write_report(str(data_dir), str(tmp_path / "scan"), scan=True)
    scanned = json.loads(pathlib.Path(paths.json).read_text(encoding="utf-8"))
    assert figures.pop("figures_from") == "records tables" and scanned.pop("figures_from") == "scan"
    assert figures == scanned
    assert _drawn(text) == _drawn(pathlib.Path(paths.html).read_text(encoding="utf-8"))
    return figures


def test_the_records_tables_give_the_scans_figures_and_drawings_of_a_classification_dataset(classified, tmp_path):
    figures = _same_as_a_scan(classified, tmp_path)
    assert figures["duplicates"]["shown"]  # thumbnails of duplicates found by path in the tables
    assert figures["contact-sheets"]["tiles"]


@pytest.mark.slow
def test_the_records_tables_give_the_scans_figures_and_drawings_of_objects_and_segmentation(coco_demo, segmented,
                                                                                              tmp_path):
    figures = _same_as_a_scan(coco_demo, tmp_path / "coco")
    assert figures["objects"]["train"]["total"] > 0
    figures = _same_as_a_scan(segmented, tmp_path / "segmentation")
    assert figures["contact-sheets"]["tiles"] == {"1": 2, "2": 1} and figures["contact-sheets"]["masks_read"] == 3


def test_a_dataset_converted_before_records_tables_is_scanned_and_the_report_says_so(classified, tmp_path, caplog):
    import shutil

    old = shutil.copytree(classified, tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    for split in manifest["splits"].values():
        (old / split.pop("records_table")["file"]).unlink()
    (old / "manifest.json").write_text(json.dumps(manifest))
    figures, _, text = _report(old, tmp_path)
    assert figures["figures_from"] == "scan"
    assert "converted before records tables, so every record was read" in text
    assert "has no records tables (converted before them): the report reads every record" in caplog.text
    current, _, _ = _report(classified, tmp_path)
    different = {key for key in current if figures.get(key) != current[key]}
    assert different == {"figures_from", "dataset", "splits"}, different  # splits: its links to the manifest
    assert figures["splits"]["splits"] == current["splits"]["splits"]


def test_a_records_table_that_is_not_the_one_its_manifest_lists_is_named(classified, tmp_path):
    import shutil

    data = shutil.copytree(classified, tmp_path / "copy")
    manifest = json.loads((data / "manifest.json").read_text())
    table = manifest["splits"]["train"]["records_table"]["file"]
    shutil.copy(data / manifest["splits"]["validation"]["records_table"]["file"], data / table)
    with pytest.raises(ValueError, match=f"{table} holds 2 rows and split 'train' has 5 records: not the records table"):
        report.write_report(str(data))


@pytest.mark.slow
def test_the_records_tables_give_the_scans_figures_and_drawings_of_a_multilabel_dataset(multilabel, tmp_path):
    figures = _same_as_a_scan(multilabel, tmp_path / "reports")
    assert figures["classes"]["labels_per_image"] == {"train": {"0": 1, "1": 1, "2": 1, "3": 1}}

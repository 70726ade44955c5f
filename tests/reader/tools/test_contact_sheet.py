"""``inspect --grid`` on datasets of objects, class masks and several labels an image, checked by pixels.

Each dataset is converted in-process from pictures of known content (``tests/object_data.py``: gray noise
with solid red rectangles), 192 x 144 pixels, so each tile shows its image at its own size and the test
finds an object in the sheet by its color.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageDraw
from scipy import ndimage

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from reader.tools.contact_sheet import TINT, LabelFonts, class_color
from reader.tools import inspect
from reader.tools.inspect import contact_sheet
from tests.object_data import RED, class_mask_png, jpeg, picture, write_coco, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
GREEN = (0, 255, 0)


def _sheet(data_dir, tmp_path) -> np.ndarray:
    path = contact_sheet(str(data_dir), str(tmp_path / "sheet.png"))
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _regions(sheet: np.ndarray, color) -> list[tuple[int, int, int, int]]:
    """``(y0, x0, y1, x1)`` of every region of at least 20 pixels within 30 of ``color`` in each channel."""
    labelled, _ = ndimage.label((np.abs(sheet - np.asarray(color)) <= 30).all(axis=-1))
    return [(s[0].start, s[1].start, s[0].stop, s[1].stop) for s in ndimage.find_objects(labelled)
            if (labelled[s] > 0).sum() >= 20]


def _tinted(color, by) -> tuple:
    return tuple(c * (1 - TINT) + b * TINT for c, b in zip(color, by))


def _edge(hit: np.ndarray, region, offset: int) -> float:
    """The fraction of ``hit`` on the perimeter of ``region`` grown by ``offset`` pixels (negative: shrunk)."""
    y0, x0, y1, x1 = region[0] - offset, region[1] - offset, region[2] + offset - 1, region[3] + offset - 1
    perimeter = np.concatenate([hit[y0, x0:x1 + 1], hit[y1, x0:x1 + 1], hit[y0:y1 + 1, x0], hit[y0:y1 + 1, x1]])
    return float(perimeter.mean())


def test_objects_are_boxed_on_their_pixels_in_their_class_color_crowds_dashed_masks_tinted(tmp_path):
    boxes = {"a.jpg": [(30, 40, 90, 100, 1)], "b.jpg": [(60, 30, 160, 110, 2), (10, 100, 40, 130, 1)],
             "c.jpg": []}
    crowd = (120, 40, 170, 90)  # a.jpg's, class 1, green
    images, annotations, files = [], [], {}
    for index, (name, objects) in enumerate(boxes.items()):
        pixels = np.asarray(picture(192, 144, [box[:4] for box in objects], seed=index)).copy()
        images.append({"id": index + 1, "file_name": name, "width": 192, "height": 144})
        for x0, y0, x1, y1, category in objects + ([crowd + (1,)] if name == "a.jpg" else []):
            is_crowd = (x0, y0, x1, y1) == crowd
            pixels[y0:y1, x0:x1] = GREEN if is_crowd else RED
            annotations.append({"id": len(annotations) + 1, "image_id": index + 1, "category_id": category,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                                "iscrowd": int(is_crowd), "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]]})
        files[name] = jpeg(Image.fromarray(pixels))
    write_coco(str(tmp_path / "coco"), "train2017", images, annotations,
               [{"id": 1, "name": "even"}, {"id": 2, "name": "odd"}], files)
    run(ConvertOptions(src=str(tmp_path / "coco"), out=str(tmp_path / "ds"), shards=1, masks=True), FAST,
        show_progress=False)
    sheet = _sheet(tmp_path / "ds", tmp_path)
    # inspect's table: named classes only (id 0, the background, is none), objects by class, then the images
    summary = inspect.summarize(str(tmp_path / "ds")).splitlines()
    assert summary[0].endswith(": 2 classes, 3 images, " + summary[0].split(", ")[-1])
    assert [line.split() for line in summary[2:7]] == [["label", "class", "train"], ["1", "even", "3"],
                                                         ["2", "odd", "1"], ["objects", "4"], ["images", "3"]]

    (crowd_region,) = _regions(sheet, _tinted(GREEN, class_color(1)))  # its mask, tinted
    assert crowd_region[2] - crowd_region[0] == 50 and crowd_region[3] - crowd_region[1] == 50  # dashes: gaps
    assert 0.3 < _edge((sheet == class_color(1)).all(axis=-1), crowd_region, 0) < 0.8
    for category, sizes in ((1, [(60, 60), (30, 30)]), (2, [(100, 80)])):
        outline = (sheet == class_color(category)).all(axis=-1)
        objects = _regions(sheet, _tinted(RED, class_color(category)))  # each object's mask, tinted
        # Inside each box's 2-pixel outline, the object: its pixels are the box's size less the outline.
        assert sorted((x1 - x0 + 4, y1 - y0 + 4) for y0, x0, y1, x1 in objects) == sorted(sizes)
        for region in objects:
            assert min(_edge(outline, region, 1), _edge(outline, region, 2)) > 0.95, (category, region)
            assert not outline[region[0]:region[2], region[1]:region[3]].any()
        # Nowhere else (but its name tag above the box and its swatch in a caption).
        labelled, _ = ndimage.label(outline)
        boxes = objects + ([crowd_region] if category == 1 else [])
        for where in ndimage.find_objects(labelled):
            near_a_box = any(where[0].start < y1 + 3 and where[0].stop > y0 - 20 and where[1].start < x1 + 3
                             and where[1].stop > x0 - 3 for y0, x0, y1, x1 in boxes)
            swatch = where[0].stop - where[0].start < 14 and where[1].stop - where[1].start < 14
            assert near_a_box or swatch, (category, where)


@pytest.mark.slow
def test_a_class_mask_is_tinted_per_class_and_void_and_background_are_left_clear(tmp_path):
    src, car, road = tmp_path / "seg", (40, 30, 120, 90), (130, 100, 180, 140)
    ids = np.asarray(Image.open(io.BytesIO(class_mask_png(192, 144, car, 2))))
    ids = ids.copy()
    ids[road[1]:road[3], road[0]:road[2]] = 1
    ids[0:10, :] = 255  # void along the top
    mask = io.BytesIO()
    Image.fromarray(ids, mode="L").save(mask, format="PNG")
    photo = jpeg(picture(192, 144, [car], seed=1))
    write_file(str(src / "images/training/a.jpg"), photo)
    write_file(str(src / "annotations/training/a.png"), mask.getvalue())
    write_file(str(tmp_path / "labels.txt"), "background\nroad\ncar\n")
    run(ConvertOptions(src=str(src), out=str(tmp_path / "ds"), shards=1, labels_file=str(tmp_path / "labels.txt")),
        FAST, show_progress=False)
    sheet = _sheet(tmp_path / "ds", tmp_path)

    (found,) = _regions(sheet, _tinted(RED, class_color(2)))
    assert (found[2] - found[0], found[3] - found[1]) == (car[3] - car[1], car[2] - car[0])  # the car, all of it
    top, left = found[0] - car[1], found[1] - car[0]  # where the image is in the sheet
    image = sheet[top:top + 144, left:left + 192]
    original = np.asarray(Image.open(io.BytesIO(photo))).astype(int)
    untouched = np.ones((144, 192), bool)
    untouched[car[1]:car[3], car[0]:car[2]] = untouched[road[1]:road[3], road[0]:road[2]] = False
    assert np.abs(image[untouched] - original[untouched]).mean() < 6  # background and void: the image as it is
    tinted = original[road[1]:road[3], road[0]:road[2]] * (1 - TINT) + np.asarray(class_color(1)) * TINT
    assert np.abs(image[road[1]:road[3], road[0]:road[2]] - tinted).mean() < 6


@pytest.mark.slow
def test_each_tile_of_a_multilabel_dataset_names_its_classes(tmp_path):
    tags = {"a": "haze primary", "b": "clear primary water", "c": ""}
    for index, name in enumerate(tags):
        write_file(str(tmp_path / "planet" / f"{name}.jpg"), jpeg(picture(192, 144, [], seed=index)))
    write_file(str(tmp_path / "tags.csv"), "image_name,tags\n" + "".join(f"{k},{v}\n" for k, v in tags.items()))
    run(ConvertOptions(src=str(tmp_path / "planet"), out=str(tmp_path / "ds"), shards=1,
                       annotations=str(tmp_path / "tags.csv"), annotation_columns=("image_name", "tags"),
                       label_separator=" "), FAST, show_progress=False)
    sheet = _sheet(tmp_path / "ds", tmp_path)

    for caption in ("haze", "clear", "no class", "b.jpg"):  # each the first word of its line
        assert _found(sheet, caption), caption
    assert not _found(sheet, "cloudy")


def _found(sheet: np.ndarray, text: str) -> bool:
    """``text`` as the sheet's captions draw it (black on white, from a whole pixel) is somewhere in ``sheet``."""
    fonts = LabelFonts()
    stamp = Image.new("RGB", (int(fonts.width(text)) + 1, fonts.line_height), "white")
    fonts.draw(ImageDraw.Draw(stamp), (0, 0), text)
    template = np.asarray(stamp.convert("L")).astype(int)
    gray = sheet.mean(axis=-1)
    windows = np.lib.stride_tricks.sliding_window_view(gray, template.shape)
    (y0, y1), (x0, x1) = np.unravel_index(np.argsort(template, axis=None)[:2], template.shape)  # its darkest two
    candidates = (windows[..., y0, x0] == template[y0, x0]) & (windows[..., y1, x1] == template[y1, x1])
    return any(np.array_equal(windows[y, x], template) for y, x in zip(*np.nonzero(candidates)))

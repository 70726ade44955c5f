"""A YOLO label line that does not parse is named for what it looks like: a polygon with an odd number of
coordinates (Ultralytics' segmentation lines, one cut short) is said to be one, not "not 'class cx cy w h'"."""

from __future__ import annotations

from beam_jobs import annotations, sources
from beam_jobs.options import ConvertOptions
from tests.object_data import jpeg, picture, write_file


def test_an_odd_length_polygon_line_is_named_as_a_polygon(tmp_path):
    root = tmp_path / "ds"
    write_file(str(root / "data.yaml"), "train: images/train\nnames: [leaf, spot]\n")
    write_file(str(root / "images/train/a.jpg"), jpeg(picture(32, 32, [], seed=1)))
    write_file(str(root / "labels/train/a.txt"),
               "0 0.1 0.1 0.9 0.1 0.9 0.9 0.1 0.9\n"  # a polygon: converted (its extent)
               "1 0.2 0.2 0.6 0.2 0.6 0.6 0.2\n"  # seven coordinates: its last point has no y
               "1 0.5 0.5 wide\n")
    plan = sources.plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
    (ref,) = list(plan.refs)
    objects = annotations.decode(ref.annotation)
    assert len(objects.boxes) == 1
    details = {name: detail for name, _, detail in objects.rejected}
    assert details["labels/train/a.txt line 2"] == (
        "'1 0.2 0.2 0.6 0.2 0.6 0.6 0.2' is a polygon ('class x1 y1 x2 y2 ...') with 7 coordinates, an odd "
        "number: its last point has no y")
    assert details["labels/train/a.txt line 3"] == (
        "'1 0.5 0.5 wide' is neither 'class cx cy w h' nor a polygon 'class x1 y1 x2 y2 x3 y3 ...'")

"""Stage 2 over one part of object images (beam_jobs.stages.validate_part), on real JPEGs and work files.

Each image's annotation is decoded once in the stage (#57 §6: a decode of a few boxes costs ~0.1 ms, and the part
decoded it again for each count it took); the counts come from the objects validation placed.
"""

from __future__ import annotations

import json
import os

from beam_jobs import annotations
from beam_jobs.files import work_layout
from beam_jobs.options import EncodeOptions
from beam_jobs.stage_records import ImageRef
from beam_jobs.stages import list_parts, validate_part
from tests.object_data import jpeg, picture, write_file

GOOD = annotations.Box("a.json annotation 1", 1, 4, 4, 20, 20)
FLAT = annotations.Box("a.json annotation 2", 1, 5, 5, 5, 15)  # zero width: drops out, counted as rejected


def test_a_part_decodes_each_annotation_once_and_counts_the_placed_and_the_dropped_objects(tmp_path, monkeypatch):
    src = tmp_path / "src"
    refs = []
    for name, boxes in (("a.jpg", (GOOD, FLAT)), ("b.jpg", (GOOD,))):
        write_file(str(src / name), jpeg(picture(40, 30, [(4, 4, 20, 20)])))
        objects = annotations.Objects(name[0], boxes, (40, 30), False)
        refs.append(ImageRef("train", name, 0, "", annotations.encode(objects)))
    layout = work_layout.plan_layout(str(tmp_path / "work"), {"train": len(refs)}, len(refs))
    for folder in layout.folders():
        os.makedirs(folder)
    list_parts.write_parts(layout, refs, len(refs))
    decoded = []
    decode = annotations.decode
    monkeypatch.setattr(annotations, "decode", lambda data: decoded.append(data) or decode(data))

    counts = validate_part.validate_part(str(src), layout, 0, 0, EncodeOptions())

    assert len(decoded) == len(refs)
    assert counts.objects == {"train": 2} and counts.rejected_objects == {"train": {annotations.BOX_EMPTY: 1}}
    assert counts.accepted_per_split() == {"train": 2} and not counts.assumed_frames
    with open(layout.rejected(0), encoding="utf-8") as handle:
        [line] = handle.read().splitlines()
    assert json.loads(line)["annotation"] == "a.json annotation 2" and json.loads(line)["path"] == "a.jpg"

"""A COCO annotation whose category_id is a class name (hand-written or converted JSON) is rejected with the category
it may have meant, as CVAT's and VOC's label typos are (issue #57 §3)."""

from __future__ import annotations

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions
from beam_jobs.sources import plan_inputs
from tests.object_data import jpeg, picture, write_coco


def test_a_coco_category_id_given_as_a_name_is_rejected_with_the_near_category_and_its_id(tmp_path):
    anns = [{"id": 5, "image_id": 1, "category_id": "Dog", "bbox": [1, 1, 5, 5]},
            {"id": 6, "image_id": 1, "category_id": "zebra", "bbox": [1, 1, 5, 5]},
            {"id": 7, "image_id": 1, "category_id": 18, "bbox": [1, 1, 5, 5]}]
    write_coco(str(tmp_path), "train2017", [{"id": 1, "file_name": "a.jpg", "width": 16, "height": 16}], anns,
               [{"id": 18, "name": "dog"}], {"a.jpg": jpeg(picture(16, 16, []))})
    [ref] = plan_inputs(ConvertOptions(src=str(tmp_path))).refs
    objects = annotations.decode(ref.annotation)
    assert [box.label for box in objects.boxes] == [18]
    assert objects.rejected == (
        ("instances_train2017.json annotation 5", "unknown-class",
         "category_id Dog is not in the file's categories: did you mean 18 ('dog')?"),
        ("instances_train2017.json annotation 6", "unknown-class", "category_id zebra is not in the file's categories"))

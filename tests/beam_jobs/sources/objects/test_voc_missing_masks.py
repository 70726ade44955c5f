"""VOC with --masks: an image ImageSets/Segmentation lists whose SegmentationClass/ mask is absent is named, in its
rejection and a warning, not only counted (issue #57 §5)."""

from __future__ import annotations

from beam_jobs.options import ConvertOptions
from beam_jobs.sources import plan_inputs
from beam_jobs.sources.archives import archive_members
from tests.object_data import jpeg, picture, voc_palette_png, voc_xml, write_file


def test_a_listed_image_without_its_mask_is_refused_as_missing_file_naming_the_mask_and_warned(tmp_path):
    root = tmp_path / "VOC2012"
    for image_id in ("a", "b", "c"):
        write_file(str(root / f"JPEGImages/{image_id}.jpg"), jpeg(picture(40, 24, [], seed=len(image_id))))
        write_file(str(root / f"Annotations/{image_id}.xml"), voc_xml(40, 24, [("dog", (5, 5, 20, 20), 0)]))
    write_file(str(root / "SegmentationClass/a.png"), voc_palette_png(40, 24, [((5, 5, 20, 20), 12)]))
    write_file(str(root / "ImageSets/Segmentation/train.txt"), "a\nb\n")
    write_file(str(root / "ImageSets/Segmentation/val.txt"), "c\n")
    plan = plan_inputs(ConvertOptions(src=str(root), masks=True))
    refused = {ref.relpath: archive_members.parse_locator(ref.source) for ref in plan.refs
               if ref.source.startswith(archive_members.REFUSED)}
    assert sorted(refused) == ["JPEGImages/b.jpg", "JPEGImages/c.jpg"]
    assert {r.reason for r in refused.values()} == {"missing-file"}
    assert "its mask SegmentationClass/b.png is not there" in refused["JPEGImages/b.jpg"].detail
    [warning] = [w for w in plan.warnings if "no mask" in w]
    assert warning.startswith("2 images have no mask in SegmentationClass/ though ImageSets/Segmentation lists them: "
                              "rejected as missing-file (JPEGImages/b.jpg, JPEGImages/c.jpg; each in rejected.jsonl)")
    kept = [ref for ref in plan.refs if not ref.source.startswith(archive_members.REFUSED)]
    assert [ref.relpath for ref in kept] == ["JPEGImages/a.jpg"]

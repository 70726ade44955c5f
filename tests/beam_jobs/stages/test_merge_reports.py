"""Reports merged from per-part files: sorted as a whole, duplicates found across parts and ranges."""

from __future__ import annotations

import json
import random

from beam_jobs.files import work_records
from beam_jobs.stages import merge_reports
from beam_jobs.files.work_layout import WorkLayout


def test_sorted_files_merge_into_one_sorted_file_in_rounds_past_the_fan_in(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_reports, "MAX_FAN_IN", 3)
    rng = random.Random(0)
    lines = [f'{{"path": "{rng.random():.12f}"}}\n' for _ in range(300)]
    paths = []
    for index in range(10):
        path = tmp_path / f"part-{index}.jsonl"
        path.write_text("".join(sorted(lines[index::10])))
        paths.append(str(path))
    (tmp_path / "empty.jsonl").write_text("")
    out = tmp_path / "merged.jsonl"
    merge_reports.merge_sorted_lines(paths + [str(tmp_path / "empty.jsonl")], str(out), str(tmp_path))
    assert out.read_text() == "".join(sorted(lines))


def _content(relpath: str, sha: bytes, split: str = "train", label: int = 0) -> bytes:
    from beam_jobs.stage_records import Accepted, ImageRef

    return work_records.encode_content(Accepted(ImageRef(split, relpath, label), sha + b"\0" * 16, "", 1, 1))


def test_identical_images_in_different_parts_are_grouped_whatever_the_ranges(tmp_path):
    same, other = bytes(range(16)), bytes([200] * 16)
    parts = [
        [_content("b/1.jpg", same, "train", 1), _content("x.jpg", b"\x01" * 16)],
        [_content("a/1.jpg", same, "validation", 0), _content("y.jpg", other)],
        [_content("c/1.jpg", same, "train", 0), _content("z.jpg", other, "train", 0)],
    ]
    for ranges in (1, 3, 50):
        layout = WorkLayout(str(tmp_path / f"w{ranges}"), num_parts=3, buckets={"train": 1}, hash_ranges=ranges)
        for folder in layout.folders():
            (tmp_path / folder).mkdir(parents=True)
        for index, records in enumerate(parts):
            work_records.write_file(layout.content(index), work_records.CONTENT, sorted(records), ranges)
        summaries = [merge_reports.find_duplicates(layout, r, ["cat", "dog"]) for r in range(ranges)]
        total = merge_reports.SumDuplicates().merge_accumulators(summaries)
        assert (total.num_groups, total.num_duplicate_images, total.num_cross_label, total.num_cross_split) == (2, 3, 1, 1)
        out = tmp_path / f"dups{ranges}.jsonl"
        merge_reports.join_duplicates(layout, str(out))
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [line["kind"] for line in lines] == ["exact", "exact"]
        groups = [line["images"] for line in lines]
        assert groups[0] == [{"split": "train", "label": "cat", "path": "c/1.jpg"},
                             {"split": "train", "label": "dog", "path": "b/1.jpg"},
                             {"split": "validation", "label": "cat", "path": "a/1.jpg"}]
        assert [g["path"] for g in groups[1]] == ["y.jpg", "z.jpg"]
        manifest = total.to_manifest(["cat", "dog"], "duplicates.jsonl")
        assert manifest["cross_label"] == manifest["cross_split"] == [groups[0]]


def test_the_manifest_lists_the_first_groups_only_and_counts_them_all():
    groups = [((("train", 0, f"a{i:03d}.jpg"), ("train", 1, f"b{i:03d}.jpg")),) for i in range(100)]
    summaries = [merge_reports.DuplicateSummary(1, 1, 1, 0, g, ()) for g in reversed(groups)]
    total = merge_reports.SumDuplicates().merge_accumulators(summaries)
    assert total.num_cross_label == 100
    assert list(total.cross_label) == [g[0] for g in groups[:merge_reports.MAX_LISTED_DUPLICATES]]

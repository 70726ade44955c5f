"""Several labels an image from a label file (Planet's tags): ids of the sorted names, records with label lists."""

from __future__ import annotations

import json

import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from reader.tools.verify import verify
from tests.object_data import jpeg, object_records, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def planet(tmp_path_factory):
    """Planet Amazon's layout: train-jpg/<id>.jpg and train_v2.csv of image_name,tags (space-separated)."""
    root = tmp_path_factory.mktemp("planet")
    for i in range(6):
        write_file(str(root / "train-jpg" / f"train_{i}.jpg"), jpeg(picture(32, 32, [], seed=i)))
    write_file(str(root / "train_v2.csv"), "image_name,tags\ntrain_0,haze primary\ntrain_1,clear primary water\n"
               "train_2,clear\ntrain_3,primary primary cloudy\ntrain_4,\ntrain_5,water haze\n")
    return root


def test_tags_become_label_lists_of_the_sorted_names(planet, tmp_path):
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(planet / "train-jpg"), out=str(out), shards=1, annotations=str(planet / "train_v2.csv"),
                       annotation_columns=("image_name", "tags"), label_separator=" "), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "multilabel" and manifest["features"]["image/class/label"] == "int64_list"
    assert manifest["classes"] == ["clear", "cloudy", "haze", "primary", "water"]
    assert manifest["splits"]["train"]["label_counts"] == [2, 1, 2, 3, 2]  # images per label
    records = object_records(out)
    assert records["train_1.jpg"]["image/class/label"] == [0, 3, 4]
    assert records["train_1.jpg"]["image/class/text"] == [b"clear", b"primary", b"water"]
    assert records["train_3.jpg"]["image/class/label"] == [1, 3]  # a name listed twice counts once
    assert records["train_4.jpg"].get("image/class/label", []) == []  # an empty cell: an image of no class
    assert verify(str(out)).ok


def test_a_separator_without_a_label_file_is_a_usage_error(planet):
    with pytest.raises(ValueError, match="--label-separator splits the label cells of an --annotations file"):
        ConvertOptions(src=str(planet), label_separator=" ")

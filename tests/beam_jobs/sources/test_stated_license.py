"""A licence an export's README states (Roboflow's README.dataset.txt: "License: CC BY 4.0") is offered for the
Croissant card when the user gives none: the card takes it and names the file, the run says so in one line, and
a licence the user gives wins (issue #57 §5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.sources import plan_inputs, stated_license
from record_files.dataset_card import DatasetCard
from tests.conftest import REPO
from tests.object_data import jpeg, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
ROBOFLOW_YOLO = Path(f"{REPO}/tests/data/exports/roboflow_yolo")  # README.dataset.txt: "License: CC BY 4.0"


@pytest.mark.parametrize("text, spdx", [("CC BY 4.0", "CC-BY-4.0"), ("BY-NC-SA 4.0", "CC-BY-NC-SA-4.0"),
                                        ("CC0 1.0", "CC0-1.0"), ("MIT", "MIT"), ("ODbL v1.0", "ODbL-1.0"),
                                        ("Public Domain", "Public Domain"), ("Private", None), ("Unknown", None)])
def test_roboflows_licence_names_read_as_spdx_ids_and_private_as_none(text, spdx):
    assert stated_license.spdx_of(text) == spdx


def _classes_export(src: Path, readmes: dict[str, str]) -> None:
    """Roboflow's classification export: split folders of class folders, its READMEs at the top."""
    write_file(str(src / "train/cat/a.jpg"), jpeg(picture(16, 16, [], seed=1)))
    write_file(str(src / "train/dog/b.jpg"), jpeg(picture(16, 16, [], seed=2)))
    for path, text in readmes.items():
        write_file(str(src / path), text)


def _roboflow_yolo(root: Path) -> Path:
    """The real export's files, and an image beside each label file (the export ships none)."""
    shutil.copytree(ROBOFLOW_YOLO, root)
    for label in root.rglob("labels/*.txt"):
        write_file(str(label.parent.parent / "images" / f"{label.stem}.jpg"), jpeg(picture(16, 16, [])))
    return root


def test_the_real_roboflow_yolo_exports_readme_licence_is_offered_and_said_in_one_line(tmp_path):
    root = _roboflow_yolo(tmp_path / "roboflow_yolo")
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "ds")))
    assert plan.stated_license == ("CC-BY-4.0", "README.dataset.txt")
    assert plan.warnings == ("license: CC-BY-4.0, as README.dataset.txt states it, is put in croissant.json "
                             "(noting that file); --license gives another",)


def test_a_licence_the_user_gives_wins_and_nothing_is_said(tmp_path):
    root = _roboflow_yolo(tmp_path / "export")
    plan = plan_inputs(ConvertOptions(src=str(root), card=DatasetCard(license=("MIT",))))
    assert plan.stated_license == () and plan.warnings == ()


def test_readmes_stating_different_licences_offer_none_and_name_both(tmp_path):
    _classes_export(tmp_path / "src", {"README.dataset.txt": "License: CC BY 4.0\n",
                                       "train/README.dataset.txt": "License: MIT\n"})
    plan = plan_inputs(ConvertOptions(src=str(tmp_path / "src")))
    assert plan.stated_license == ()
    assert ("the export's READMEs state different licences (README.dataset.txt: CC-BY-4.0, "
            "train/README.dataset.txt: MIT): none is put in croissant.json; give the dataset's with --license"
            ) in plan.warnings


@pytest.mark.slow
def test_the_card_takes_the_readmes_licence_and_notes_the_file_and_the_readme_stays_skipped(tmp_path):
    src, out = tmp_path / "src", tmp_path / "ds"
    _classes_export(src, {"README.dataset.txt": "# pets\nProvided by a Roboflow user\nLicense: CC BY 4.0\n",
                          "README.roboflow.txt": "\npets - v1\n"})
    run(ConvertOptions(src=str(src), out=str(out), shards=1), FAST, show_progress=False)
    card = json.loads((out / "croissant.json").read_text())
    assert card["license"] == "CC-BY-4.0"
    assert card["description"].endswith(" The license is as the source's README.dataset.txt states it.")
    skipped = {json.loads(line)["path"] for line in (out / "skipped.jsonl").read_text().splitlines()}
    assert {"README.dataset.txt", "README.roboflow.txt"} <= skipped  # still no image
    # A licence the user gives wins, and the description says nothing of the README.
    run(ConvertOptions(src=str(src), out=str(out), shards=1, overwrite=True, card=DatasetCard(license=("MIT",))),
        FAST, show_progress=False)
    card = json.loads((out / "croissant.json").read_text())
    assert card["license"] == "MIT" and "README" not in card["description"]


def test_the_licence_is_read_from_an_export_zip_as_roboflow_downloads_it(tmp_path):
    import zipfile

    _classes_export(tmp_path / "src", {"README.dataset.txt": "License: BY-NC-SA 4.0\n"})
    archive = tmp_path / "pets.v1i.folder.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted((tmp_path / "src").rglob("*")):
            if path.is_file():
                handle.write(path, path.relative_to(tmp_path / "src").as_posix())
    plan = plan_inputs(ConvertOptions(src=str(archive), out=str(tmp_path / "ds")))
    assert plan.stated_license == ("CC-BY-NC-SA-4.0", "README.dataset.txt")

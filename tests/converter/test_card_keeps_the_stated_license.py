"""``python -m converter card OUT`` keeps the licence the export's README stated at conversion (Roboflow's
README.dataset.txt: "License: CC BY 4.0"): re-writing the card to add a citation must not drop it; a licence
the flags give still wins (issue #57 §5). In-process: ``converter.card.main`` is what the command runs."""

from __future__ import annotations

import json
from pathlib import Path

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from converter import card
from tests.object_data import jpeg, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _card(out: Path) -> dict:
    return json.loads((out / "croissant.json").read_text())


def test_rewriting_the_card_keeps_the_readmes_licence_and_its_note_unless_a_licence_is_given(tmp_path):
    src, out = tmp_path / "flowers", tmp_path / "ds"
    write_file(str(src / "train/rose/a.jpg"), jpeg(picture(16, 16, [], seed=1)))
    write_file(str(src / "train/tulip/b.jpg"), jpeg(picture(16, 16, [], seed=2)))
    write_file(str(src / "README.dataset.txt"), "# flowers > 2024\nhttps://universe.roboflow.com/x/flowers\n\n"
               "Provided by a Roboflow user\nLicense: CC BY 4.0\n")
    run(ConvertOptions(src=str(src), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stated_license"] == {"license": "CC-BY-4.0", "file": "README.dataset.txt"}
    converted = _card(out)
    assert converted["license"] == "CC-BY-4.0" and "README.dataset.txt states it" in converted["description"]

    assert card.main([str(out), "--citation", "@misc{flowers}"]) == 0
    rewritten = _card(out)
    assert rewritten["license"] == "CC-BY-4.0" and rewritten["citeAs"] == "@misc{flowers}"
    assert rewritten["description"] == converted["description"]
    assert card.main([str(out)]) == 0 and _card(out) == converted  # the same card as the conversion wrote

    assert card.main([str(out), "--license", "MIT"]) == 0
    assert _card(out)["license"] == "MIT" and "states it" not in _card(out)["description"]

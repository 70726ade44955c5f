"""Every file under SRC accounted for: files no image source can read are skipped and named, never rejected.

The tree is shaped as the sprite folders of a Game Boy Advance decompilation are (pokeemerald's
``graphics/``: each sprite a ``.png`` beside the build's own binaries, ``.4bpp`` tiles, ``.gbapal``
palettes, ``.lz`` compressed copies, and a ROM header in ``.gba``), generated here, small and seeded.
"""

from __future__ import annotations

import io
import json
import random

from PIL import Image

import record_schema
from beam_jobs import sources
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning import listing
from beam_jobs.planning.carve import carve_key, unstratified

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _sprite(seed: int) -> bytes:
    rng = random.Random(seed)
    img = Image.new("P", (32, 32))
    img.putpalette([rng.randrange(256) for _ in range(48)])
    img.putdata([rng.randrange(16) for _ in range(32 * 32)])
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def _binaries(rng: random.Random) -> dict[str, bytes]:
    """What the build leaves beside a sprite: raw 4-bit tiles, a 16-colour palette, an LZ77 copy."""
    return {"front.4bpp": bytes(rng.randrange(256) for _ in range(512)),
            "normal.gbapal": bytes(rng.randrange(256) for _ in range(32)),
            "front.4bpp.lz": b"\x10\x00\x02\x00" + bytes(rng.randrange(256) for _ in range(120))}


def _sprite_tree(root, sprites_per_class: dict[str, int]) -> int:
    """Class folders of PNG sprites with the build's binaries beside them; returns the binaries written."""
    rng, written = random.Random(7), 0
    for name, count in sprites_per_class.items():
        folder = root / name
        folder.mkdir(parents=True)
        for index in range(count):
            (folder / f"front{index}.png").write_bytes(_sprite(hash((name, index)) & 0xFFFF))
        for file_name, data in _binaries(rng).items():
            (folder / file_name).write_bytes(data)
            written += 1
    (root / "rom").mkdir()  # a folder of binaries only: no class
    (root / "rom" / "pokeemerald.gba").write_bytes(b"\x2e\x00\x00\xea" + bytes(rng.randrange(256) for _ in range(188)))
    (root / "rom" / "README.md").write_bytes(b"# Build\n\nmake -j4\n")
    return written + 2


def test_files_no_image_source_reads_are_skipped_named_and_left_out_of_the_carve(tmp_path):
    counts = {"bulbasaur": 5, "charmander": 6, "squirtle": 10, "pikachu": 1}
    binaries = _sprite_tree(tmp_path / "src", counts)
    plan = sources.plan_inputs(ConvertOptions(src=str(tmp_path / "src"), out=str(tmp_path / "out"), val_fraction=0.2))
    assert plan.classes == ("bulbasaur", "charmander", "pikachu", "squirtle")  # rom/ is no class
    assert plan.skipped == {"not-an-image": binaries}
    skipped = [json.loads(line) for line in plan.skipped_files.lines()]
    assert {line["path"] for line in skipped} >= {"rom/pokeemerald.gba", "rom/README.md", "squirtle/front.4bpp"}
    assert {line["reason"] for line in skipped} == {"not-an-image"}
    # The carve counts images only, per class: every class of two or more images has validation images.
    validation = {plan.classes[ref.label] for ref in plan.refs if ref.split == "validation"}
    assert validation == {"bulbasaur", "charmander", "squirtle"}
    assert plan.split_counts == {"train": 22 - 4, "validation": 1 + 1 + 2}
    assert any("rom holds no images" in warning for warning in plan.warnings)
    assert any("pikachu" in warning and "single image" in warning for warning in plan.warnings)


def test_a_damaged_file_with_an_image_name_and_an_image_without_one_are_inputs_still(tmp_path):
    """The extension or the magic bytes make an input: x.png of junk is rejected by name, a PNG named
    ``sprite`` (no extension) is converted."""
    assert listing.not_an_image("x.png", lambda: b"junk") is None
    assert listing.not_an_image("sprite", lambda: _sprite(1)[:64]) is None
    assert listing.not_an_image("photo.data", lambda: b"\xff\xd8\xff\xe0" + bytes(60)) is None
    assert listing.not_an_image("icon.svg", lambda: b"<svg xmlns='http://www.w3.org/2000/svg'/>") is None
    assert "first bytes" in listing.not_an_image("front.4bpp", lambda: bytes(range(64)))
    assert listing.not_an_image("paper.pdf", lambda: b"%PDF-1.7\n") == "a PDF document, not an image"


def test_val_fraction_on_sprite_folders_with_binaries_publishes_a_stratified_carve(tmp_path, caplog):
    counts = {"bulbasaur": 5, "charmander": 6, "squirtle": 10, "ditto": 2}
    binaries = _sprite_tree(tmp_path / "src", counts)
    # ditto's validation image is damaged: rejected after the carve, so ditto has none (a warning names it).
    carved = min(("ditto/front0.png", "ditto/front1.png"), key=lambda path: carve_key(0, path))
    (tmp_path / "src" / carved).write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    out = tmp_path / "out"
    with caplog.at_level("WARNING"):
        summary = run(ConvertOptions(src=str(tmp_path / "src"), out=str(out), shards=1, val_fraction=0.2,
                                     max_bad_fraction=0.1), FAST, show_progress=False)
    said = "\n".join(record.getMessage() for record in caplog.records)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert manifest["num_rejected"] == 1 and manifest["num_skipped"] == binaries
    assert manifest["skipped_by_reason"] == {"not-an-image": binaries}
    # Every file under SRC: written, rejected or skipped (class folders read no annotation file).
    assert manifest["num_listed"] + manifest["num_skipped"] == sum(1 for p in (tmp_path / "src").rglob("*")
                                                                   if p.is_file())
    assert manifest["splits"]["validation"]["label_counts"] == [1, 1, 0, 2]
    assert manifest["splits"]["train"]["label_counts"] == [4, 5, 1, 8]
    assert "--val-fraction: 1 classes have no validation image: each image carved out for validation was " \
           "rejected (rejected.jsonl): ditto" in said
    lines = (out / record_schema.SKIPPED_FILE).read_text().splitlines()
    assert len(lines) == binaries == manifest["num_skipped_listed"]
    text = summary.format()
    assert f"skipped:    {binaries} files not converted (each named in skipped.jsonl)" in text
    assert "not-an-image 14: bulbasaur/front.4bpp, bulbasaur/front.4bpp.lz, bulbasaur/normal.gbapal ..." in text


def test_a_carve_that_rejections_left_unstratified_is_a_warning_naming_the_classes():
    classes = ("", "cat", "dog", "owl", "emu")
    train, validation = [0, 8, 3, 1, 2], [0, 2, 0, 0, 3]
    carved = {"cat": 2, "dog": 1, "emu": 3}  # owl: a single image, left in train
    assert unstratified(classes, train, validation, carved) == [
        "--val-fraction: 1 classes have no validation image: each image carved out for validation was rejected "
        "(rejected.jsonl): dog",
        "--val-fraction: 1 classes have more validation images than training images (a fraction over 0.5, or "
        "training images rejected): emu"]
    assert unstratified(classes, [0, 8, 3, 1, 2], [0, 2, 1, 0, 1], carved) == []


def test_the_skipped_list_is_sorted_whatever_the_listing_order_spilled_or_held(tmp_path, monkeypatch):
    """A folder's walk and the same tree in a tar list files in different orders: skipped.jsonl's bytes
    must not differ. Spilled to scratch, the lines are sorted in runs and merged."""
    monkeypatch.setattr(listing, "SORT_RUN", 3)
    paths = [f"c{index % 4}/file{index:02d}.bin" for index in range(10)][::-1]
    held, spilled = listing.SkippedFiles(), listing.SkippedFiles(scratch=str(tmp_path))
    for path in paths:
        held.add(path, listing.NOT_AN_IMAGE, "")
        spilled.add(path, listing.NOT_AN_IMAGE, "")
    expected = [json.dumps({"path": path, "reason": "not-an-image", "detail": ""}) for path in sorted(paths)]
    assert list(held.lines()) == list(spilled.lines()) == expected
    assert held.examples == {"not-an-image": sorted(paths)[:3]}
    assert sorted(p.name for p in tmp_path.iterdir())[0].startswith("skipped-")  # the runs are gone
    assert len(list(tmp_path.iterdir())) == 1

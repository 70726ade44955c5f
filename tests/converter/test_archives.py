"""Converting an archive gives exactly what converting its extraction gives: the property every test pins.

The images are the shared sample kinds (JPEG, PNG, CMYK, a corrupt JPEG, a
truncated file...), so the comparison covers re-encoding and rejections too.
Runs are in-process on the in-memory runner where only the bytes matter, and
``python -m converter`` where the user's view matters (ImageNet as it ships,
hostile archives, a killed run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import tarfile
import zipfile

import pytest

from beam_jobs import faults
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from record_files import versions
from record_files.croissant import CROISSANT_FILE
from tests.archive_data import imagenet_archives, tar_folder, tar_of_tars, zip_folder
from tests.conftest import run_converter, write_imagenet_tree
from tests.in_process import cli_in_forked_process

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
FAST = [*IN_MEMORY, "--no-progress"]
# Differ between any two runs (when, and the paths the user typed), never between their outputs' contents.
RUN_FIELDS = ("created",)
OPTION_FIELDS = ("src", "out", "archive_scan")


def dataset_contents(out) -> dict[str, object]:
    """Every file of a published dataset by name, the manifest without what only names the run."""
    contents: dict[str, object] = {}
    for name in sorted(os.listdir(out)):
        data = pathlib.Path(out, name).read_bytes()
        if name == "manifest.json":
            manifest = json.loads(data)
            for field in RUN_FIELDS:
                manifest.pop(field)
            manifest.pop("source_archives", None)  # names the archives an archive run read, and only that
            for field in OPTION_FIELDS:
                manifest["options"].pop(field)
            contents[name] = manifest
        elif name == versions.SOURCES_TABLE:  # version 1's (#59): each file's stamp is its own, not its bytes'
            contents[name] = [dataclasses.replace(row, size=0, mtime_ns=0)
                              for row in versions.iter_sources(os.path.join(out, name))]
        elif name == CROISSANT_FILE:
            card = json.loads(data)
            card.pop("name")  # the card's default name is OUT's folder name, which each run compared has its own
            contents[name] = card
        else:
            contents[name] = hashlib.sha256(data).hexdigest()
    return contents


def _convert(src, out, **options) -> dict[str, object]:
    run(ConvertOptions(src=str(src), out=str(out), shards=2, seed=3, max_bad_fraction=0.5, **options), IN_MEMORY,
        show_progress=False)
    return dataset_contents(out)


@pytest.fixture(scope="module")
def pets(tmp_path_factory, sample_images) -> pathlib.Path:
    """``pets/{cat,dog,emu}/``: every sample kind, the broken ones among them (rejected with their reasons)."""
    folder = tmp_path_factory.mktemp("archive-src") / "pets"
    for index, (kind, data) in enumerate(sorted(sample_images.items())):
        name = ("cat", "dog", "emu")[index % 3]
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / f"{kind}.img").write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def extracted(pets, tmp_path_factory) -> dict[str, object]:
    """What converting the folder itself gives: every archive of it must give the same."""
    contents = _convert(pets, tmp_path_factory.mktemp("extracted-out") / "out")
    manifest = contents["manifest.json"]
    assert manifest["num_rejected"] > 0 and manifest["splits"]["train"]["num_examples"] > 10
    return contents


ARCHIVES = {
    "pets.tar": lambda pets, out: tar_folder(pets, out),
    "pets.tar.gz": lambda pets, out: tar_folder(pets, out, "w:gz"),
    "pets.tar.xz": lambda pets, out: tar_folder(pets, out, "w:xz"),
    "pets-dot.tar": lambda pets, out: _tar_dot(pets, out),  # tar -cf pets-dot.tar -C pets .
    "pets.zip": lambda pets, out: zip_folder(pets, out, top="pets"),  # zip -r pets.zip pets/
    "pets-stored.zip": lambda pets, out: zip_folder(pets, out, method=zipfile.ZIP_STORED),
    "classes.tar": lambda pets, out: tar_of_tars(pets, out),  # ImageNet's shape: a tar of class tars
    "classes-gz.tar": lambda pets, out: tar_of_tars(pets, out, "w:gz"),
}


def _tar_dot(folder, out) -> str:
    """What ``tar -cf OUT -C FOLDER .`` writes: a "./" folder entry, then members named "./cat/...". """
    with tarfile.open(out, "w") as archive:
        archive.add(folder, arcname=".")
    return str(out)


@pytest.mark.parametrize("name,scan", [(name, "auto") for name in sorted(ARCHIVES)] + [("classes.tar", "workers")])
def test_an_archive_converts_to_the_bytes_of_its_extraction(tmp_path, pets, extracted, name, scan):
    """Whoever reads the tars' headers: the launcher (auto, for tars this small) or the workers."""
    archive = ARCHIVES[name](pets, tmp_path / name)
    assert _convert(archive, tmp_path / "out", archive_scan=scan) == extracted
    assert sorted(os.listdir(tmp_path)) == sorted([name, "out"])  # nothing left beside OUT (inflated archives included)


@pytest.mark.slow
def test_a_folder_mixing_class_folders_and_class_archives_converts_as_its_extraction(tmp_path, pets, extracted):
    src = tmp_path / "src"
    shutil.copytree(pets / "cat", src / "cat")
    zip_folder(pets / "dog", src / "dog.zip", top="dog")
    tar_folder(pets / "emu", src / "emu.tgz", "w:gz")
    assert _convert(src, tmp_path / "out") == extracted


@pytest.mark.e2e
def test_imagenet_as_it_ships_converts_as_its_extraction(tmp_path, sample_images):
    """``ILSVRC2012_img_train.tar`` (a tar of class tars) and ``ILSVRC2012_img_val.tar`` beside each other, with
    ``--val-labels`` and ``--synsets``: the records of the extracted CLS-LOC tree; and the train tar alone."""
    tree = tmp_path / "CLS-LOC"
    write_imagenet_tree(tree, tmp_path, sample_images)
    shipped = imagenet_archives(tree, tmp_path / "imagenet")
    flags = ["--val-labels", str(tmp_path / "LOC_val_solution.csv"), "--synsets",
             str(tmp_path / "LOC_synset_mapping.txt"), "--shards", "2", *FAST]
    run_converter("--src", str(tree), "--out", str(tmp_path / "from-tree"), *flags, check=True)
    proc = run_converter("--src", shipped, "--out", str(tmp_path / "from-tars"), "-v", *flags, check=True)
    assert dataset_contents(tmp_path / "from-tree") == dataset_contents(tmp_path / "from-tars")
    assert "read 5 archive(s) as folders" in proc.stderr  # the two tars and the three class tars
    manifest = json.loads((tmp_path / "from-tars" / "manifest.json").read_text())
    assert sorted(manifest["source_archives"]) == ["ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"]
    summary = run_converter("inspect", str(tmp_path / "from-tars"), check=True).stdout
    assert "converted from 2 archives (records name images by their path in the extraction): " \
           "ILSVRC2012_img_train.tar (" in summary
    assert re.search(r"ILSVRC2012_img_train.tar \(\d+ bytes, modified 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", summary)
    verified = run_converter("verify", str(tmp_path / "from-tars"))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    train_tar = os.path.join(shipped, "ILSVRC2012_img_train.tar")
    run_converter("--src", train_tar, "--out", str(tmp_path / "train-only"), "--shards", "1", *FAST, check=True)
    run_converter("--src", str(tree / "train"), "--out", str(tmp_path / "train-tree"), "--shards", "1", *FAST,
                  check=True)
    assert dataset_contents(tmp_path / "train-only") == dataset_contents(tmp_path / "train-tree")


def _hostile_zip(path, sample_images) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("cat/good.jpg", sample_images["jpeg_rgb"])
        archive.writestr("dog/good.png", sample_images["png_rgb"])
        archive.writestr("../escape.jpg", sample_images["jpeg_rgb"])
        archive.writestr("cat/bomb.bmp", bytes(64 << 20))  # 64 MiB of zeros, deflated to ~64 kB
        link = zipfile.ZipInfo("dog/link.jpg")
        link.external_attr = 0o120777 << 16
        archive.writestr(link, "/etc/passwd")


@pytest.mark.e2e
def test_a_hostile_archive_costs_only_its_bad_members_each_rejected_with_its_reason(tmp_path, sample_images):
    src = tmp_path / "src"
    src.mkdir()
    _hostile_zip(src / "pets.zip", sample_images)
    out = tmp_path / "out"
    proc = run_converter("--src", str(src / "pets.zip"), "--out", str(out), "--max-bad-fraction", "0.9", *FAST)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] == 2
    assert manifest["rejected_by_reason"] == {"link": 1, "suspicious-compression": 1, "unsafe-path": 1}
    rejected = {row["path"]: row for row in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    # Each refused member as ARCHIVE:MEMBER, its name as the archive stores it (what `unzip -l` lists).
    assert set(rejected) == {"pets.zip:cat/bomb.bmp", "pets.zip:dog/link.jpg", "pets.zip:../escape.jpg"}
    assert "pets.zip" in rejected["pets.zip:cat/bomb.bmp"]["detail"]
    assert not (tmp_path / "escape.jpg").exists() and sorted(os.listdir(tmp_path)) == ["out", "src"]


@pytest.mark.e2e
def test_a_zip_that_is_not_one_is_an_error_naming_it(tmp_path):
    (tmp_path / "train.zip").write_bytes(b"<html>404 Not Found</html>")
    proc = run_converter("--src", str(tmp_path / "train.zip"), "--out", str(tmp_path / "out"), *FAST)
    assert proc.returncode == 1
    assert "train.zip" in proc.stderr and "not a readable archive" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_killed_archive_conversion_resumes_to_the_same_bytes(tmp_path, pets, extracted):
    """Killed once a shard is written: the compressed archive's inflated copy is kept with the work, and the same
    command resumes from it to the bytes of the extraction."""
    archive = tar_folder(pets, tmp_path / "pets.tar.gz", "w:gz")
    out = tmp_path / "out"
    args = ["--src", archive, "--out", str(out), "--shards", "2", "--seed", "3", "--max-bad-fraction", "0.5",
            "--part-size", "4", *FAST]
    killed = cli_in_forked_process(args, env={faults.ENV: "kill@shard-written"})  # Beam imported once: in_process.py
    assert killed.returncode == -9
    rerun = run_converter(*args, check=True)
    assert re.search(r"resuming the interrupted run .* (\d+) of \1 parts validated", rerun.stderr), rerun.stderr
    assert dataset_contents(out) == {**extracted, "manifest.json": {**extracted["manifest.json"], "options": {
        **extracted["manifest.json"]["options"], "part_size": 4}}}
    assert sorted(os.listdir(tmp_path)) == ["out", "pets.tar.gz"]

    # A changed archive is a changed input: the kept work is not resumed, and the run says which archive.
    cli_in_forked_process([*args, "--overwrite"], env={faults.ENV: "kill@shard-written"})
    os.utime(archive, (1_800_000_000, 1_800_000_000))
    rerun = run_converter(*args, "--overwrite", check=True)
    assert "not resuming the interrupted run" in rerun.stderr
    assert "an archive of --src changed: pets.tar.gz" in rerun.stderr, rerun.stderr


@pytest.mark.e2e
def test_a_truncated_class_tar_converts_its_whole_members_and_the_cut_is_one_rejection(tmp_path, pets):
    src = tmp_path / "src"
    src.mkdir()
    tar_folder(pets / "cat", tmp_path / "cat.tar")
    data = (tmp_path / "cat.tar").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        last = archive.getmembers()[-1]
    (src / "cat.tar").write_bytes(data[: last.offset_data + 10])
    tar_folder(pets / "dog", src / "dog.tar")
    out = tmp_path / "out"
    proc = run_converter("--src", str(src), "--out", str(out), "--max-bad-fraction", "0.9", *FAST, check=True)
    rows = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    cuts = [row for row in rows if row["reason"] == "truncated-archive"]
    assert len(cuts) == 1 and cuts[0]["path"] == f"cat.tar:{last.name}", rows
    assert f"byte {len(data[: last.offset_data + 10])}" in cuts[0]["detail"]
    # What came after a cut cannot be counted: the archive is named in a warning, never lost without a word.
    assert re.search(r"^warning: cat\.tar is cut short \(.*\): its members before the cut are converted, and what "
                     r"came after is lost", proc.stderr, flags=re.M), proc.stderr


@pytest.mark.e2e
def test_an_archive_refused_whole_counts_as_the_images_it_held_and_fails_the_budget(tmp_path, demo_src):
    """A tar of class zips, one cut in half (its central directory gone), counted as one bad input. As a class
    archive it is an error naming it (its class would vanish); inside a class folder, its images' share of the
    bytes counts against --max-bad-fraction, and a warning names it."""
    inner = tmp_path / "inner"
    inner.mkdir()
    for name in ("circle", "square", "triangle"):
        zip_folder(pathlib.Path(demo_src) / name, inner / f"{name}.zip")
    whole = (inner / "triangle.zip").read_bytes()
    (inner / "triangle.zip").write_bytes(whole[: len(whole) // 2])
    src = tmp_path / "src"
    src.mkdir()
    with tarfile.open(src / "shapes.tar", "w") as archive:
        for name in ("circle", "square", "triangle"):
            archive.add(inner / f"{name}.zip", arcname=f"{name}.zip")
    out = tmp_path / "out"
    proc = run_converter("--src", str(src / "shapes.tar"), "--out", str(out), *FAST)
    assert proc.returncode == 1 and not out.exists(), proc.stderr
    assert re.search(r"error: class archive \S+shapes\.tar/triangle\.zip could not be read \(not a readable archive: "
                     r".*\), so class 'triangle' would have no images", proc.stderr), proc.stderr
    # The same archives as the images of one class folder (a class of class archives: one label, "shapes").
    (src / "shapes").mkdir()
    (src / "shapes.tar").rename(src / "shapes" / "shapes.tar")
    (src / "other").mkdir()
    shutil.copytree(pathlib.Path(demo_src) / "circle", src / "other", dirs_exist_ok=True)
    proc = run_converter("--src", str(src), "--out", str(out), *FAST)
    assert proc.returncode == 1 and not out.exists(), proc.stderr
    warning = re.search(r"^warning: shapes/shapes\.tar/triangle\.zip could not be read \(not a readable archive: .*\): "
                        r"about (\d+) images are lost", proc.stderr, flags=re.M)
    assert warning, proc.stderr
    per_class = len(os.listdir(pathlib.Path(demo_src) / "triangle"))
    assert per_class / 4 <= int(warning.group(1)) <= per_class  # its bytes' share: half a class archive
    assert re.search(r"error: \d+ of \d+ files \(.*\) were rejected \(corrupt-archive 1; and about \d+ more inputs "
                     r"in files refused whole", proc.stderr), proc.stderr


@pytest.mark.slow
def test_webdataset_shards_convert_by_their_label_members_as_their_extraction_does(tmp_path, demo_src):
    """img2dataset's shards: ``--label-member cls`` (class ids as text, sorted numerically) and
    ``--label-member json:label`` (class names); the folder of shards gives the bytes of its extraction."""
    from tests.archive_data import webdataset_shards
    from tests.conftest import read_records

    expected = webdataset_shards(demo_src, tmp_path / "shards", shards=3, seed=4)
    extraction = tmp_path / "extracted"
    for shard in sorted(os.listdir(tmp_path / "shards")):
        with tarfile.open(tmp_path / "shards" / shard) as archive:
            archive.extractall(extraction / shard.removesuffix(".tar"), filter="data")
    by_cls = _convert(tmp_path / "shards", tmp_path / "cls", label_member="cls")
    assert by_cls == _convert(extraction, tmp_path / "cls-extracted", label_member="cls")
    assert by_cls["manifest.json"]["classes"] == ["0", "1", "2"]
    assert by_cls["manifest.json"]["skipped_by_reason"] == {"sample-metadata": 3 * len(expected)}
    _convert(tmp_path / "shards", tmp_path / "json", label_member="json:label")
    manifest = json.loads((tmp_path / "json" / "manifest.json").read_text())
    records = [row for shard in manifest["splits"]["train"]["shards"]
               for row in read_records(str(tmp_path / "json" / shard["file"]))]
    got = {row["image/filename"].decode(): manifest["classes"][row["image/class/label"]] for row in records}
    assert got == expected


@pytest.mark.e2e
def test_webdataset_samples_without_a_label_or_an_image_are_rejected_with_a_reason(tmp_path, sample_images):
    src = tmp_path / "shard.tar"
    with tarfile.open(src, "w") as archive:
        for name, data in (("a.jpg", sample_images["jpeg_rgb"]), ("a.cls", b"7"), ("b.jpg", sample_images["jpeg_rgb"]),
                           ("b.txt", b"no label"), ("c.cls", b"3"), ("d.png", sample_images["png_rgb"]),
                           ("d.cls", b"two\nlines")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    proc = run_converter("--src", str(src), "--out", str(out), "--label-member", "cls", "--max-bad-fraction", "0.9",
                         *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = {row["path"]: row["reason"] for row in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    assert rows == {"b.jpg": "missing-label", "c.cls": "missing-image", "d.png": "missing-label"}
    assert json.loads((out / "manifest.json").read_text())["classes"] == ["7"]
    bad = run_converter("--src", str(src), "--out", str(tmp_path / "bad"), "--label-member", "json", *FAST)
    assert bad.returncode != 0 and "--label-member" in bad.stderr


@pytest.mark.e2e
def test_a_kaggle_zip_with_a_csv_of_ids_converts_as_its_extraction_and_a_miss_says_what_the_root_holds(
        tmp_path, pets):
    """Kaggle's dog-breed shape: ``train.zip`` holding ``train/<id>.jpg``, ``labels.csv`` of ``id,breed``:
    the zip reads as the folder ``train/`` its extraction gives, and ids resolve inside it."""
    extracted = tmp_path / "train"
    extracted.mkdir()
    rows = ["id,breed"]
    for index, path in enumerate(sorted(p for p in pets.rglob("*") if p.is_file())):
        name = f"{index:04x}"
        (extracted / f"{name}.jpg").write_bytes(path.read_bytes())
        rows.append(f"{name},{path.parent.name}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    zip_folder(extracted, tmp_path / "train.zip", top="train")
    options = {"annotations": str(tmp_path / "labels.csv"), "annotation_columns": ("id", "breed")}
    assert _convert(tmp_path / "train.zip", tmp_path / "from-zip", **options) == \
        _convert(extracted, tmp_path / "from-folder", **options)

    (tmp_path / "prefixed.csv").write_text("path,label\nfoo/0000.jpg,cat\n" + "".join(
        f"{row.split(',')[0]}.jpg,{row.split(',')[1]}\n" for row in rows[1:]))
    proc = run_converter("--src", str(tmp_path / "train.zip"), "--out", str(tmp_path / "miss"), "--annotations",
                         str(tmp_path / "prefixed.csv"), "--max-bad-fraction", "0.9", *FAST, check=True)
    rejected = [json.loads(line) for line in (tmp_path / "miss" / "rejected.jsonl").read_text().splitlines()]
    missing = [row for row in rejected if row["reason"] == "missing-file"]
    assert missing == [{"path": "foo/0000.jpg", "reason": "missing-file", "detail":
                        "listed, but train.zip has no member foo/0000.jpg (its root holds "
                        + ", ".join(sorted(f"{row.split(',')[0]}.jpg" for row in rows[1:])[:5])
                        + f" and {len(rows) - 6} more)"}], proc.stderr

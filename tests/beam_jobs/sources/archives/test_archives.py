"""Archives read as folders: the listing of an archive is the listing of its extraction, byte for byte.

Each test packs a generated folder with ``tarfile``/``zipfile`` (tests/archive_data.py),
lists the archive, reads every member through its locator as the workers do,
and compares with the folder. Hostile archives: every refusal has its reason,
the rest reads.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_jobs.planning import discover
from beam_jobs.sources.archives import archive_members, archives, compressed
from beam_jobs.stages.validate import read_source
from tests.archive_data import hostile_tar, nested_tar, tar_folder, tar_of_tars, write_tree, zip_folder


def _read_listing(src, tmp_path) -> tuple[dict[str, bytes], discover.Listing]:
    """What the workers read: every listed file's bytes through its locator (inflated archives placed first)."""
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    scratch.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    found = archives.list_tree(str(src), str(scratch))
    listing, inflated = found.listing, found.inflated
    compressed.place_inflated(inflated, str(work))
    read = {path: read_source(str(src), path, source, str(work)) for path, source in listing.entries()
            if not source.startswith(archive_members.REFUSED)}
    return read, listing


def _refused(listing) -> dict[str, str]:
    """Path -> reason of every refused entry, placed or not."""
    out = {path: archive_members.parse_locator(source).reason for path, source in listing.entries()
           if source.startswith(archive_members.REFUSED)}
    out.update({path: archive_members.parse_locator(source).reason for path, source in listing.refused})
    return out


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "tar.bz2", "tar.xz", "zip-stored", "zip-deflated",
                                  "zip-under-its-name", "tar-under-its-name"])
def test_every_kind_of_archive_reads_as_the_files_of_its_extraction(tmp_path, kind):
    files = write_tree(tmp_path / "shapes")
    if kind.startswith("zip"):
        archive = tmp_path / "shapes.zip"
        zip_folder(tmp_path / "shapes", archive, top="shapes" if kind.endswith("name") else "",
                   method=zipfile.ZIP_STORED if kind == "zip-stored" else zipfile.ZIP_DEFLATED)
    else:
        mode = {"tar": "w", "tar.gz": "w:gz", "tar.bz2": "w:bz2", "tar.xz": "w:xz", "tar-under-its-name": "w"}[kind]
        archive = tmp_path / f"shapes.{'tar' if kind.endswith('name') else kind}"
        tar_folder(tmp_path / "shapes", archive, mode, top="shapes" if kind.endswith("name") else "")
    read, listing = _read_listing(archive, tmp_path)
    assert read == files
    assert {"cat", "dog"} <= set(listing.dirs)
    plan = discover.plan_inputs(listing)
    assert plan.classes == ("cat", "dog") and len(plan.refs) == len(files)


def test_a_folder_mixing_class_folders_and_archives_reads_as_one_tree(tmp_path):
    src = tmp_path / "src"
    files = write_tree(src, classes=("cat",), seed=1)
    for name, seed in (("dog", 2), ("emu", 3), ("fox", 4)):
        more = write_tree(tmp_path / "packed", classes=(name,), seed=seed)
        files.update(more)
    tar_folder(tmp_path / "packed" / "dog", src / "dog.tar")
    zip_folder(tmp_path / "packed" / "emu", src / "emu.zip", top="emu")  # zip -r emu.zip emu/
    tar_folder(tmp_path / "packed" / "fox", src / "fox.tgz", "w:gz")
    read, listing = _read_listing(src, tmp_path)
    assert read == files
    assert discover.plan_inputs(listing).classes == ("cat", "dog", "emu", "fox")


def test_an_empty_class_archive_is_refused_naming_the_archive(tmp_path):
    src = tmp_path / "src"
    write_tree(src, classes=("cat",), seed=1)
    with tarfile.open(src / "crane.tar", "w"):
        pass  # a tar with no members, beside a good class
    _, listing = _read_listing(src, tmp_path)
    with pytest.raises(discover.InputError, match=r"class archive .*/src/crane.tar holds no images"):
        discover.plan_inputs(listing, src=str(src))


def test_imagenets_tar_of_class_tars_and_val_tar_read_as_its_train_and_val_folders(tmp_path):
    train = write_tree(tmp_path / "tree" / "train", classes=("n01440764", "n01443537"), seed=5)
    val = write_tree(tmp_path / "tree" / "val", classes=("flat",), seed=6)
    src = tmp_path / "imagenet"
    src.mkdir()
    tar_of_tars(tmp_path / "tree" / "train", src / "ILSVRC2012_img_train.tar")
    tar_folder(tmp_path / "tree" / "val" / "flat", src / "ILSVRC2012_img_val.tar")
    read, _ = _read_listing(src, tmp_path)
    expected = {f"train/{k}": v for k, v in train.items()}
    expected.update({f"val/{k.split('/')[1]}": v for k, v in val.items()})
    assert read == expected
    # --src the train tar alone: the class tars are the classes.
    alone, listing = _read_listing(src / "ILSVRC2012_img_train.tar", tmp_path / "alone")
    assert alone == train and discover.plan_inputs(listing).classes == ("n01440764", "n01443537")


@pytest.mark.parametrize("inner", ["w", "w:gz"])
def test_archives_nested_stored_or_compressed_read_as_nested_folders(tmp_path, inner):
    files = write_tree(tmp_path / "classes", seed=7)
    outer = tmp_path / "outer"
    outer.mkdir()
    tar_of_tars(tmp_path / "classes", outer / "inner.tar", inner)
    zip_folder(outer, tmp_path / "all.zip")  # a zip of a tar of class tars
    read, _ = _read_listing(tmp_path / "all.zip", tmp_path)
    assert read == {f"inner/{k}": v for k, v in files.items()}


def test_one_top_folder_is_the_archives_folder_when_it_bears_its_name_or_holds_folders(tmp_path):
    data = {"a.jpg": b"1", "b.jpg": b"2"}

    def listed(name, members) -> list[str]:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            for member in members:
                archive.writestr(member, data[member.rsplit("/", 1)[-1]])
        return sorted(archives.list_tree(str(path)).listing.files)

    assert listed("train.zip", ["train/a.jpg", "train/b.jpg"]) == ["a.jpg", "b.jpg"]  # Kaggle's train.zip
    assert listed("shapes.zip", ["data/cat/a.jpg", "data/dog/b.jpg"]) == ["cat/a.jpg", "dog/b.jpg"]
    assert listed("cat.zip", ["kitten/a.jpg", "kitten/b.jpg"]) == ["kitten/a.jpg", "kitten/b.jpg"]  # one class


def test_hostile_members_are_each_refused_with_a_reason_and_the_rest_reads(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    hostile_tar(tmp_path / "full.tar")
    whole = (tmp_path / "full.tar").read_bytes()
    (src / "pets.tar").write_bytes(whole[: whole.index(b"cut" * 10) + 100])  # cut inside the last member
    read, listing = _read_listing(src, tmp_path)
    assert read == {"pets/cat/ok.jpg": b"fine", "pets/cat/twice.jpg": b"second"}  # the later one wins, as tar -x
    assert _refused(listing) == {
        "pets.tar:../../escape.jpg": "unsafe-path", "pets.tar:/etc/passwd": "unsafe-path",
        "pets.tar:cat/link.jpg": "link", "pets.tar:cat/fifo.jpg": "special-file",
        "pets.tar:cat/twice.jpg": "duplicate-member",
        "pets.tar:dog/last.jpg": "truncated-archive"}


def test_a_compressed_tar_cut_short_keeps_its_whole_members_and_is_one_refusal(tmp_path):
    files = write_tree(tmp_path / "shapes", per_class=20, seed=8)
    tar_folder(tmp_path / "shapes", tmp_path / "full.tar.gz", "w:gz")
    whole = (tmp_path / "full.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[: len(whole) * 2 // 3])
    read, listing = _read_listing(tmp_path / "cut.tar.gz", tmp_path)
    assert read and all(files[path] == data for path, data in read.items())
    assert len(read) < len(files)
    reasons = [archive_members.parse_locator(source) for _, source in listing.refused]
    assert [r.reason for r in reasons] == ["truncated-archive", "truncated-archive"]  # the stream, then the tar
    assert "cut.tar.gz" in reasons[0].detail


def test_a_compressed_bomb_is_inflated_no_further_than_its_bound(tmp_path):
    with tarfile.open(tmp_path / "bomb.tar.gz", "w:gz") as archive:
        ok = tarfile.TarInfo("cat/ok.jpg")
        ok.size = 4
        archive.addfile(ok, io.BytesIO(b"fine"))
        info = tarfile.TarInfo("cat/zeros.bmp")
        info.size = 256 << 20
        archive.addfile(info, io.BytesIO(bytes(info.size)))
    size = os.path.getsize(tmp_path / "bomb.tar.gz")
    assert size < 1 << 20
    read, listing = _read_listing(tmp_path / "bomb.tar.gz", tmp_path)
    assert read == {"cat/ok.jpg": b"fine"}
    assert "suspicious-compression" in _refused(listing).values()
    inflated = list((tmp_path / "work" / compressed.INFLATED_FOLDER).iterdir())
    assert sum(p.stat().st_size for p in inflated) <= max(compressed.MAX_INFLATE_RATIO * size, 1 << 20)


def test_a_file_that_only_looks_like_an_archive_is_an_error_naming_it(tmp_path):
    src = tmp_path / "src"
    write_tree(src)
    (src / "extra.zip").write_bytes(b"not a zip at all" * 10)
    with pytest.raises(discover.InputError, match="extra.zip"):
        archives.list_tree(str(src))


def test_archives_nested_past_the_depth_limit_are_refused_not_followed(tmp_path):
    (tmp_path / "deep.tar").write_bytes(nested_tar(archives.MAX_DEPTH + 1))
    read, listing = _read_listing(tmp_path / "deep.tar", tmp_path)
    assert read == {}
    assert list(_refused(listing).values()) == ["nested-too-deep"]


def _nested_sample() -> bytes:
    """A zip holding a class tar and a class tar.gz: every reader and the inflate path in a few KB."""
    rng = random.Random(9)
    parts = {}
    for name, mode in (("cat.tar", "w"), ("dog.tar.gz", "w:gz")):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode=mode, format=tarfile.GNU_FORMAT) as archive:
            for i in range(3):
                body = rng.randbytes(200)
                info = tarfile.TarInfo(f"{i}.jpg")
                info.size = len(body)
                archive.addfile(info, io.BytesIO(body))
        parts[name] = out.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, body in parts.items():
            archive.writestr(name, body)
    return out.getvalue()


NESTED = _nested_sample()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, len(NESTED) - 1), st.integers(1, 255)), max_size=4),
       cut=st.integers(0, len(NESTED)))
def test_mutated_nested_archives_list_and_read_or_fail_with_an_error_naming_the_archive(tmp_path_factory, flips, cut):
    data = bytearray(NESTED)
    for at, xor in flips:
        data[at] ^= xor
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "sample.zip").write_bytes(bytes(data[:cut] if cut < len(data) else data))
    try:
        found = archives.list_tree(str(tmp / "sample.zip"), str(tmp))
        listing, inflated = found.listing, found.inflated
    except discover.InputError as err:
        assert "sample.zip" in str(err)
        return
    compressed.place_inflated(inflated, str(tmp / "work"))
    for path, source in listing.entries():
        if source.startswith(archive_members.REFUSED):
            continue
        try:
            read_source(str(tmp / "sample.zip"), path, source, str(tmp / "work"))
        except archive_members.ArchiveError:
            pass  # rejected by validation as corrupt-member


def test_a_refused_member_under_the_archives_top_folder_is_named_as_the_archive_stores_it(tmp_path):
    """``zip -r shapes.zip shapes/``: members read as ``cat/...``, but a refusal names ``shapes/...`` as stored,
    an unsafe name under the top folder too (it must not be cut into another, shorter name)."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "shapes.zip", "w") as archive:
        archive.writestr("shapes/cat/a.jpg", b"a")
        archive.writestr("shapes/dog/b.jpg", b"b")
        archive.writestr("shapes/../../up.jpg", b"x")
        link = zipfile.ZipInfo("shapes/dog/link.jpg")
        link.external_attr = 0o120777 << 16
        archive.writestr(link, "/etc/passwd")
    listing = archives.list_tree(str(tmp_path / "shapes.zip")).listing
    assert sorted(listing.files) == ["cat/a.jpg", "dog/b.jpg"]
    assert _refused(listing) == {"shapes.zip:shapes/../../up.jpg": "unsafe-path",
                                 "shapes.zip:shapes/dog/link.jpg": "link"}

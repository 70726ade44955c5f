"""Tar headers read by the workers list SRC as the launcher lists it: entry for entry, refusal for refusal.

Each test lists a tree twice, once reading every tar's headers in the
launcher and once through member tables written by a real Beam pipeline
(the in-process runner), and compares everything the listing holds. The
second time, the top-level tars are zeroed once their tables are written: the
listing comes from the tables, not from a second read of the headers.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import zipfile

import apache_beam as beam
import pytest

from beam_jobs.runtime import runners
from beam_jobs.sources.archives import archive_scan, archives
from tests.archive_data import (
    hostile_tar,
    nested_tar,
    tar_folder,
    tar_of_tars,
    webdataset_shards,
    write_tree,
    zip_folder,
)


def _scanner(folder, mode="workers"):
    """Reads the tars' headers in a Beam pipeline, then zeroes the tars (same size and time): the listing
    that follows must come from the tables alone (the lister may read no header of theirs)."""
    def run(build) -> None:
        # The converter's own runner choice, in memory: a bare beam.Pipeline() lets the DirectRunner try Prism,
        # which leaves a beam-temp folder in /tmp each time.
        choice = runners.choose_runner(["--direct_running_mode=in_memory", "--direct_num_workers=1"])
        with beam.Pipeline(runner=choice.runner, options=choice.options) as pipeline:
            build(pipeline)

    def scan(units):
        tables = archive_scan.scan_on_workers(units, str(folder), run, mode)
        for unit in units:
            stat = os.stat(unit.path)
            with open(unit.path, "r+b") as handle:
                handle.write(bytes(stat.st_size))
            os.utime(unit.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        return tables

    return scan


def _everything(found: archives.ArchiveListing) -> dict:
    listing = found.listing
    return {"entries": list(listing.entries()), "refused": list(listing.refused), "dirs": listing.dirs,
            "skipped": listing.skipped, "identities": found.identities,
            "inflated": [item.name for item in found.inflated]}


def _listed_both_ways(src, tmp_path, caplog) -> tuple[dict, int]:
    """The listing with the launcher reading the headers, the same by the workers, and how many tables they wrote."""
    (tmp_path / "launcher").mkdir(parents=True)
    (tmp_path / "workers").mkdir()
    by_launcher = _everything(archives.list_tree(str(src), str(tmp_path / "launcher")))
    tables = tmp_path / "tables"
    copy = tmp_path / "copy" / os.path.basename(src)  # the scanner zeroes the tars: list a copy
    if os.path.isdir(src):
        shutil.copytree(src, copy)
    else:
        copy.parent.mkdir()
        shutil.copy2(src, copy)
    with caplog.at_level(logging.INFO, logger="beam_jobs"):
        by_workers = _everything(archives.list_tree(str(copy), str(tmp_path / "workers"), scanner=_scanner(tables)))
    assert by_workers == by_launcher
    assert not tables.exists()  # read into the listing, then deleted
    written = [record.getMessage() for record in caplog.records if "member tables" in record.getMessage()]
    assert len(written) == 1, written
    return by_workers, int(written[0].split(" into ")[1].split()[0])


def test_imagenets_tar_of_class_tars_is_listed_from_tables_the_workers_wrote(tmp_path, caplog):
    write_tree(tmp_path / "tree" / "train", classes=("n01440764", "n01443537", "n01484850"), seed=5)
    write_tree(tmp_path / "tree" / "val", classes=("flat",), seed=6)
    tar_of_tars(tmp_path / "tree" / "train", tmp_path / "train.tar")
    shipped = tmp_path / "imagenet"
    shipped.mkdir()
    (shipped / "ILSVRC2012_img_train.tar").write_bytes((tmp_path / "train.tar").read_bytes())
    tar_folder(tmp_path / "tree" / "val" / "flat", shipped / "ILSVRC2012_img_val.tar")
    listed, tables = _listed_both_ways(shipped, tmp_path / "folder", caplog)
    assert len(listed["entries"]) == 12 and tables == 5  # two top-level tars, three class tars
    caplog.clear()
    listed, tables = _listed_both_ways(shipped / "ILSVRC2012_img_train.tar", tmp_path / "alone", caplog)
    assert len(listed["entries"]) == 9 and tables == 4


def test_a_folder_of_shards_tars_in_zips_and_compressed_tars_lists_the_same(tmp_path, caplog):
    """WebDataset shards and a plain class folder; a tar inside a zip and the class tars of a .tar.gz, whose
    headers the launcher reads (the zip's directory and the inflated copy are its own)."""
    write_tree(tmp_path / "classes", classes=("cat", "dog", "emu"), seed=7)
    src = tmp_path / "src"
    webdataset_shards(tmp_path / "classes", src / "shards", shards=3)
    write_tree(src / "plain", classes=("fox",), seed=8)
    tar_of_tars(tmp_path / "classes", tmp_path / "classes.tar")
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / "classes.tar").write_bytes((tmp_path / "classes.tar").read_bytes())
    zip_folder(outer, src / "zipped.zip", method=zipfile.ZIP_STORED)
    tar_folder(outer, src / "compressed.tar.gz", "w:gz")
    listed, tables = _listed_both_ways(src, tmp_path, caplog)
    assert tables == 3  # the three shards; nothing inside the zip or the .tar.gz
    assert len(listed["inflated"]) == 1


def test_hostile_cut_corrupt_duplicated_and_too_deep_tars_are_refused_alike(tmp_path, caplog):
    src = tmp_path / "src"
    src.mkdir()
    hostile_tar(tmp_path / "full.tar")
    whole = (tmp_path / "full.tar").read_bytes()
    (src / "pets.tar").write_bytes(whole[: whole.index(b"cut" * 10) + 100])  # cut inside the last member
    (src / "empty.tar").write_bytes(b"")
    (src / "noise.tar").write_bytes(b"not a tar" * 300)
    (src / "deep.tar").write_bytes(nested_tar(archives.MAX_DEPTH + 1))  # one level past what is read
    with tarfile.open(src / "twice.tar", "w", format=tarfile.GNU_FORMAT) as archive:
        for body in (b"\0" * 10, whole, b"junk" * 200):  # a class tar twice (the later wins), then a corrupt one
            info = tarfile.TarInfo("cat.tar" if len(body) != 800 else "dog.tar")
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    listed, tables = _listed_both_ways(src, tmp_path, caplog)
    reasons = {archives.archive_members.parse_locator(source).reason for _, source in
               listed["refused"] + [entry for entry in listed["entries"] if entry[1].startswith("!")]}
    assert reasons == {"truncated-archive", "unsafe-path", "link", "special-file", "duplicate-member",
                       "nested-too-deep"}
    assert tables >= 5 + archives.MAX_DEPTH - 1


def test_auto_leaves_small_tars_to_the_launcher_and_no_pipeline_runs(tmp_path):
    write_tree(tmp_path / "shapes")
    tar_folder(tmp_path / "shapes", tmp_path / "shapes.tar")
    ran = []
    found = archives.list_tree(str(tmp_path / "shapes.tar"), str(tmp_path), scanner=lambda units: ran.append(
        archive_scan.scan_on_workers(units, str(tmp_path / "tables"), lambda build: pytest.fail("a pipeline ran"))))
    assert ran == [None] and len(found.listing.files) == 6
    assert not (tmp_path / "tables").exists()


@pytest.mark.parametrize("mode", ["auto", "launcher"])
def test_only_workers_mode_or_4_gib_of_tars_send_the_headers_to_the_workers(tmp_path, mode):
    unit = archives.TarUnit(str(tmp_path / "big.tar"), "big.tar", 0, archive_scan.AUTO_BYTES - 1)
    assert archive_scan.scan_on_workers([unit], str(tmp_path), lambda build: pytest.fail("ran"), mode) is None

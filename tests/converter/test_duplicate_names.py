"""Two items of SRC that give one record name (issue #59's review, finding 4): a folder beside the archive it was
extracted from (``cat/`` and ``cat.tar``), two archives of one name (``cat.tar`` and ``cat.zip``) holding one member
path. One record name must name one image (the sources table, the shards' order): the listing refuses the clash as
an input error naming both, before any conversion work, in a conversion and in an update (which ran the whole
pipeline and then crashed with "sources rows out of order" before). The CLI prints an InputError as ``error:`` and
exits 1 (converter/cli.py).
"""

from __future__ import annotations

import io
import os
import tarfile
import zipfile

import pytest
from PIL import Image

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.files import version_store
from beam_jobs.options import ConvertOptions
from beam_jobs.planning import listing
from beam_jobs.planning.discover import InputError
from tests.converter.test_update import FAST


def _jpeg(seed: int) -> bytes:
    data = io.BytesIO()
    Image.new("RGB", (24, 20), (seed * 50 % 256, 9, seed * 90 % 256)).save(data, "JPEG")
    return data.getvalue()


def _tar(path: str, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _folder(path: str, members: dict[str, bytes]) -> None:
    os.makedirs(path, exist_ok=True)
    for name, data in members.items():
        with open(os.path.join(path, name), "wb") as out:
            out.write(data)


def _two_classes(src: str) -> None:
    _folder(os.path.join(src, "dog"), {f"{i}.jpg": _jpeg(10 + i) for i in range(3)})
    _tar(os.path.join(src, "cat.tar"), {f"{i}.jpg": _jpeg(i) for i in range(3)})


def test_a_folder_beside_its_archive_is_refused_naming_both_before_any_conversion_work(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _two_classes(src)
    _folder(os.path.join(src, "cat"), {"0.jpg": _jpeg(0)})  # its extraction, in part
    with pytest.raises(InputError, match=r"cat/0\.jpg is given by cat\.tar and by the folder cat/") as caught:
        conversion.run(ConvertOptions(src=src, out=out, shards=1), FAST, show_progress=False)
    assert "rename one or move it out" in str(caught.value)
    assert not version_store.existing(out) and not any(
        name.endswith(".tfrecord") for _, _, names in os.walk(tmp_path) for name in names)


def test_an_update_refuses_a_second_archive_of_one_name_and_keeps_the_version(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _two_classes(src)
    options = ConvertOptions(src=src, out=out, shards=1)
    conversion.run(options, FAST, show_progress=False)
    with zipfile.ZipFile(os.path.join(src, "cat.zip"), "w") as archive:  # one member path the tar has
        archive.writestr("0.jpg", _jpeg(7))
        archive.writestr("5.jpg", _jpeg(8))
    with pytest.raises(InputError, match=r"cat/0\.jpg is given by cat\.tar and by cat\.zip"):
        update.run(options, FAST)
    assert version_store.latest_number(out) == 1


@pytest.mark.parametrize("spilled", [False, True])
def test_the_check_sorts_on_disk_and_passes_hidden_files(tmp_path, spilled):
    """Held (no scratch) and spilled (sorted on disk) the same; a hidden or system file is never read: no clash."""
    scratch = str(tmp_path) if spilled else None
    container = lambda path, source: source or listing.plain_container(path, source)  # noqa: E731
    entries = [("cat/1.jpg", ""), ("cat/.DS_Store", ""), ("cat/0.jpg", ""), ("cat/.DS_Store", "a:0:0:1:1:0:cat.tar")]
    listing.refuse_clashes("src", entries, scratch, container)
    with pytest.raises(InputError, match=r"cat/1\.jpg is given by a:0:0:1:1:0:cat\.tar and by the folder cat/"):
        listing.refuse_clashes("src", entries + [("cat/1.jpg", "a:0:0:1:1:0:cat.tar")], scratch, container)

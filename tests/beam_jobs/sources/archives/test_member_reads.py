"""Workers' reads of archive members: the bytes of one read each, consecutive members by one request.

The archives are generated with ``tarfile``/``zipfile``; each member read
through a :class:`MemberReader` is compared with ``read_member`` on the file,
and the reader's request count pins the coalescing. (The same count against
a real S3 server: tests/converter/test_object_store.py.)
"""

from __future__ import annotations

import io
import random
import tarfile
import zipfile

import pytest

from beam_jobs.sources.archives import archive_members, tar_members, zip_members
from beam_jobs.sources.archives.archive_members import ArchiveError, Member
from beam_jobs.sources.archives.member_reads import MAX_GAP, MAX_RUN, MemberReader, plan_runs


def _tar(path, sizes, seed=0) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {f"c/{i:04d}.jpg": rng.randbytes(size) for i, size in enumerate(sizes)}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return files


def _locators(path, file="") -> dict[str, str]:
    """name -> locator of every member of the tar or zip at ``path``, in archive order."""
    with open(path, "rb") as handle:
        size = handle.seek(0, io.SEEK_END)
        handle.seek(0)
        scan = zip_members.scan_zip(handle) if str(path).endswith(".zip") else \
            tar_members.scan_tar(handle, size)
        return {m.path: archive_members.locator(file, m) for m in scan if isinstance(m, Member)}


def test_a_chunk_of_consecutive_members_is_read_by_one_request_per_run(tmp_path):
    files = _tar(tmp_path / "a.tar", [random.Random(i).randint(1, 40_000) for i in range(200)])
    sources = _locators(tmp_path / "a.tar")
    with MemberReader(str(tmp_path / "a.tar"), upcoming=sources.values()) as reader:
        assert {name: reader.read(source) for name, source in sources.items()} == files
        assert reader.requests == 1  # 200 members, about 4 MB: one run


def test_runs_end_at_max_run_bytes_and_at_gaps_wider_than_max_gap(tmp_path):
    big = MAX_RUN // 4 + 1  # four of these pass MAX_RUN
    files = _tar(tmp_path / "a.tar", [big] * 6)
    sources = list(_locators(tmp_path / "a.tar").values())
    spans = plan_runs(sources)
    assert len(set(spans.values())) == 2 and all(s.end - s.start <= MAX_RUN for s in spans.values())
    # Every other member: gaps of `big` bytes, wider than MAX_GAP, so each is fetched alone.
    assert big > MAX_GAP and plan_runs(sources[::2]) == {}
    with MemberReader(str(tmp_path / "a.tar"), upcoming=sources) as reader:
        assert [reader.read(s) for s in sources] == list(files.values())
        assert reader.requests == 2


def test_members_read_in_another_order_than_planned_are_read_alone_and_right(tmp_path):
    files = _tar(tmp_path / "a.tar", [500] * 20)
    sources = _locators(tmp_path / "a.tar")
    shuffled = list(sources.items())
    random.Random(3).shuffle(shuffled)
    with MemberReader(str(tmp_path / "a.tar")) as reader:  # the writer's case: shard order, no plan
        assert {name: reader.read(source) for name, source in shuffled} == files
        assert reader.requests == 20


def test_zip_members_stored_and_deflated_inflate_as_declared(tmp_path):
    rng = random.Random(1)
    files = {f"d/{i}.png": rng.randbytes(300) + bytes(3000) for i in range(30)}
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        for i, (name, data) in enumerate(files.items()):
            archive.writestr(name, data, zipfile.ZIP_DEFLATED if i % 2 else zipfile.ZIP_STORED)
    sources = _locators(tmp_path / "a.zip")
    with MemberReader(str(tmp_path / "a.zip"), upcoming=sources.values()) as reader:
        assert {name: reader.read(source) for name, source in sources.items()} == files
        assert reader.requests == 1


def test_an_archive_cut_inside_a_run_fails_only_the_members_past_the_cut(tmp_path):
    files = _tar(tmp_path / "a.tar", [1000] * 10)
    sources = list(_locators(tmp_path / "a.tar").values())
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "a.tar").write_bytes(data[:6 * 1536 + 700])  # inside the 7th member
    with MemberReader(str(tmp_path / "a.tar"), upcoming=sources) as reader:
        assert [reader.read(s) for s in sources[:6]] == list(files.values())[:6]
        for source in sources[6:]:
            with pytest.raises(ArchiveError, match="the archive ends"):
                reader.read(source)


def test_members_of_two_archives_and_plain_files_between_them_keep_their_runs(tmp_path):
    one = _tar(tmp_path / "one.tar", [700] * 5, seed=1)
    two = _tar(tmp_path / "two.tar", [900] * 5, seed=2)
    sources = [*_locators(tmp_path / "one.tar", "one.tar").values(), "",
               *_locators(tmp_path / "two.tar", "two.tar").values()]
    with MemberReader(str(tmp_path), upcoming=sources) as reader:
        read = [reader.read(s) for s in sources if s]
        assert read == [*one.values(), *two.values()] and reader.requests == 2


def test_the_input_bytes_of_a_small_run_are_its_files_and_members_sizes(tmp_path):
    """What the rule that runs small runs in one process weighs: files by stat, members by their stored size."""
    from beam_jobs.sources.archives.archives import list_tree
    from beam_jobs.sources.archives.member_reads import UNKNOWN_ITEM_BYTES, input_bytes
    from beam_jobs.stage_records import ImageRef

    files = _tar(tmp_path / "a.tar", [100, 2_000, 30_000])
    (tmp_path / "b.jpg").write_bytes(b"x" * 777)
    listing = list_tree(str(tmp_path)).listing
    refs = [ImageRef("train", path, 0, source) for path, source in listing.entries()]
    assert input_bytes(str(tmp_path), refs, limit=100) == sum(map(len, files.values())) + 777
    cell = ImageRef("train", "train/000", 0, "q:0:0:image:x.parquet")
    assert input_bytes(str(tmp_path), [cell], limit=100) == UNKNOWN_ITEM_BYTES
    assert input_bytes(str(tmp_path), refs, limit=1) in {777, 100, 2_000, 30_000}

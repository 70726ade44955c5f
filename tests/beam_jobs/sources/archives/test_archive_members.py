"""Archive member tables: every member located without extracting, hostile members refused with a reason.

Archives are made here with ``tarfile`` and ``zipfile`` (small, seeded); the
hostile ones are what strangers ship: absolute and ``..`` names, links,
devices, duplicates, zip bombs, overlapping members, archives cut short.
"""

from __future__ import annotations

import io
import os
import tarfile
import tracemalloc
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_jobs.sources.archives.archive_members import (
    ArchiveError,
    Member,
    RangeFile,
    Refused,
    folder_members,
    read_member,
)
from beam_jobs.sources.archives.tar_members import scan_tar
from beam_jobs.sources.archives.zip_members import scan_zip

FILES = {"cat/a.jpg": b"A" * 700, "cat/b.jpg": os.urandom(1500), "dog/c.png": b"C" * 10}


def _tar(members: list) -> bytes:
    """A tar of (TarInfo, bytes or None) pairs."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            info.size = len(data) if data is not None else 0
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _file(name: str, data: bytes) -> tuple:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def _zip(files: dict, method=zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def _scan_tar(data: bytes) -> list:
    return list(scan_tar(io.BytesIO(data), len(data)))


def _read_all(data: bytes, entries) -> dict:
    handle = io.BytesIO(data)
    return {m.path: read_member(handle, m) for m in entries if isinstance(m, Member)}


def test_a_tar_lists_every_file_with_the_offset_of_its_bytes():
    data = _tar([_file(name, body) for name, body in FILES.items()] + [_special("cat", tarfile.DIRTYPE)])
    entries = _scan_tar(data)
    assert [e.path for e in entries] == list(FILES)
    assert _read_all(data, entries) == FILES


def test_hostile_tar_members_are_refused_each_with_its_reason_and_the_rest_is_listed():
    data = _tar([_file("/etc/passwd", b"x"), _file("../../escape.jpg", b"x"), _file("cat/../../up.jpg", b"x"),
                 _special("cat/link.jpg", tarfile.SYMTYPE, "/etc/passwd"),
                 _special("cat/hard.jpg", tarfile.LNKTYPE, "cat/a.jpg"), _special("cat/fifo", tarfile.FIFOTYPE),
                 _special("cat/dev", tarfile.CHRTYPE), _file("./cat/ok.jpg", b"fine")])
    entries = _scan_tar(data)
    assert [(e.path, e.reason) for e in entries if isinstance(e, Refused)] == [
        ("/etc/passwd", "unsafe-path"), ("../../escape.jpg", "unsafe-path"), ("cat/../../up.jpg", "unsafe-path"),
        ("cat/link.jpg", "link"), ("cat/hard.jpg", "link"), ("cat/fifo", "special-file"),
        ("cat/dev", "special-file")]
    assert _read_all(data, entries) == {"cat/ok.jpg": b"fine"}


@pytest.mark.parametrize("cut", ["inside the last member", "inside a header"])
def test_a_tar_cut_short_lists_its_whole_members_and_refuses_the_cut_naming_where(cut):
    data = _tar([_file(name, body) for name, body in FILES.items()])
    last_header = data.index(b"dog/c.png") // 512 * 512
    cut_at = last_header + 512 + 5 if cut == "inside the last member" else last_header + 100
    entries = _scan_tar(data[:cut_at])
    refused = [e for e in entries if isinstance(e, Refused)]
    assert _read_all(data[:cut_at], entries) == {k: v for k, v in FILES.items() if k != "dog/c.png"}
    assert len(refused) == 1 and refused[0].reason == "truncated-archive"
    assert str(cut_at if cut == "inside the last member" else last_header) in refused[0].detail


def test_a_zip_lists_stored_and_deflated_members_and_reads_them():
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        data = _zip(FILES, method)
        entries = list(scan_zip(io.BytesIO(data)))
        assert [e.path for e in entries] == list(FILES)
        assert _read_all(data, entries) == FILES


def test_a_zip_bomb_is_refused_from_its_central_directory_without_inflating_it():
    data = _zip({"bomb.bmp": bytes(256 << 20), "ok.jpg": b"fine"})
    assert len(data) < 1 << 20
    tracemalloc.start()
    entries = list(scan_zip(io.BytesIO(data)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [(e.path, e.reason) for e in entries if isinstance(e, Refused)] == [("bomb.bmp", "suspicious-compression")]
    assert peak < 8 << 20  # a 256 MiB member of zeros costs no 256 MiB
    assert _read_all(data, entries) == {"ok.jpg": b"fine"}
    limited = list(scan_zip(io.BytesIO(_zip(FILES)), limit=1000))
    assert [e.path for e in limited if isinstance(e, Refused)] == ["cat/b.jpg"]  # 1500 bytes > the limit


def test_zip_links_encrypted_and_overlapping_members_are_refused():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("a.jpg", b"first")
        link = zipfile.ZipInfo("link.jpg")
        link.external_attr = (0o120777 << 16)
        archive.writestr(link, "/etc/passwd")
        archive.writestr("secret.jpg", b"xxxx")
        archive.writestr("b.jpg", b"second")
    data = bytearray(out.getvalue())
    cd_secret = data.rindex(b"PK\x01\x02", 0, data.rindex(b"secret.jpg"))
    data[cd_secret + 8] |= 0x1  # the encrypted flag (zipfile writes no encrypted members itself)
    # A second central-directory entry for b.jpg pointing at a.jpg's bytes: the overlapping-member trick.
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        first = archive.getinfo("a.jpg").header_offset
    cd_b = data.rindex(b"PK\x01\x02", 0, data.rindex(b"b.jpg"))
    data[cd_b + 42:cd_b + 46] = first.to_bytes(4, "little")
    entries = list(scan_zip(io.BytesIO(bytes(data))))
    assert {e.path: e.reason for e in entries if isinstance(e, Refused)} == {
        "link.jpg": "link", "secret.jpg": "encrypted", "b.jpg": "overlapping-member"}


@pytest.mark.parametrize("damage", ["not a zip", "corrupt central directory"])
def test_an_unreadable_zip_is_an_error(damage):
    data = b"this is not a zip" * 10 if damage == "not a zip" else _zip(FILES)
    if damage == "corrupt central directory":
        data = data[:data.rindex(b"PK\x01\x02") + 10] + b"\xff" * 40 + data[-22:]
    with pytest.raises(ArchiveError):
        list(scan_zip(io.BytesIO(data)))


def test_an_archive_inside_an_uncompressed_tar_is_read_through_a_range_of_the_outer_file():
    inner_tar = _tar([_file(name, body) for name, body in FILES.items()])
    inner_zip = _zip(FILES)
    data = _tar([_file("train/n01.tar", inner_tar), _file("train/n02.zip", inner_zip)])
    outer = io.BytesIO(data)
    tars = {e.path: e for e in _scan_tar(data)}
    found = {}
    for name, member in tars.items():
        view = RangeFile(outer, member.offset, member.size)
        entries = scan_tar(view, member.size, member.offset) if name.endswith(".tar") else scan_zip(view, member.offset)
        found[name] = {m.path: read_member(outer, m) for m in entries}  # offsets are in the outer file
    assert found == {"train/n01.tar": FILES, "train/n02.zip": FILES}


def test_as_a_folder_a_later_member_replaces_an_earlier_one_and_one_top_folder_is_the_archive_folder():
    data = _tar([_file("shapes/cat/a.jpg", b"old"), _file("shapes/dog/c.jpg", b"c"), _file("shapes/cat/a.jpg", b"new")])
    members, refused, top = folder_members(iter(_scan_tar(data)))
    assert top == "shapes"
    assert {m.path: read_member(io.BytesIO(data), m) for m in members} == {"cat/a.jpg": b"new", "dog/c.jpg": b"c"}
    assert [(r.path, r.reason) for r in refused] == [("shapes/cat/a.jpg", "duplicate-member")]  # as stored
    flat = _tar([_file("a.jpg", b"a"), _file("cat/b.jpg", b"b")])
    assert folder_members(iter(_scan_tar(flat)))[2] == ""  # members at the top: no folder to strip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["tar", "zip"]), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                           max_size=8), cut=st.integers(0, 10**6))
def test_mutated_archives_give_entries_or_an_archive_error_never_anything_else(kind, flips, cut):
    data = bytearray(_tar([_file(n, b) for n, b in FILES.items()]) if kind == "tar" else _zip(FILES))
    for position, value in flips:
        data[position % len(data)] = value
    data = bytes(data[:max(1, cut % (len(data) + 1))])
    try:
        entries = _scan_tar(data) if kind == "tar" else list(scan_zip(io.BytesIO(data)))
    except ArchiveError:
        return
    handle = io.BytesIO(data)
    for entry in entries:
        assert isinstance(entry, (Member, Refused))
        if isinstance(entry, Member):
            assert entry.length <= 1 << 62
            try:
                read_member(handle, entry)
            except ArchiveError:
                pass


@settings(max_examples=200, deadline=None)
@given(paths=st.lists(st.sampled_from(["a.jpg", "x/a.jpg", "x/b.jpg", "x/y/c.jpg", "y/d.jpg", "x/a.jpg"]),
                      max_size=8),
       name=st.sampled_from(["", "x", "other"]))
def test_streamed_folder_members_agree_with_folder_members(paths, name):
    """The two-pass, hash-keeping form used for tars decides as the in-memory one: same members, same refusals."""
    from beam_jobs.sources.archives.archive_members import streamed_folder_members

    entries = [Member(path, index * 10, 5, 5) for index, path in enumerate(paths)]
    members, refused, top = folder_members(iter(entries), name)
    streamed_top, streamed = streamed_folder_members(lambda: iter(entries), name)
    streamed = list(streamed)
    assert streamed_top == top
    assert sorted((m.path, m.offset) for m in streamed if isinstance(m, Member)) == sorted((m.path, m.offset) for m in members)
    assert sorted((r.path, r.reason) for r in streamed if isinstance(r, Refused)) == \
        sorted((r.path, r.reason) for r in refused)


@settings(max_examples=300, deadline=None)
@given(spans=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=12))
def test_zip_overlaps_are_found_by_bisection_as_a_pairwise_check_finds_them(spans):
    """A member is refused when its bytes overlap any member accepted before it (found in log time, not n^2)."""
    from beam_jobs.sources.archives.zip_members import _Spans

    accepted, found = [], _Spans()
    for index, (start, size) in enumerate(spans):
        overlapping = {path for s, e, path in accepted if start < e and s < start + size}
        named = found.overlapped(start, start + size)
        assert (named in overlapping) if overlapping else named is None
        if not overlapping:
            accepted.append((start, start + size, str(index)))
            found.add(start, start + size, str(index))


def test_a_tar_scanned_twice_for_its_folder_is_read_once(tmp_path):
    """The lister's two passes read the tar once (in S3 or GCS that is one download): the second replays a spool."""
    from beam_jobs.sources.archives.archive_members import replayable, streamed_folder_members

    data = _tar([_file(name, body) for name, body in FILES.items()] + [_special("cat/link.jpg", tarfile.SYMTYPE, "x")])
    reads = []

    class Counted(io.BytesIO):
        def read(self, *args):
            reads.append(self.tell())
            return super().read(*args)

    scan = replayable(scan_tar(Counted(data), len(data)), str(tmp_path))
    top, entries = streamed_folder_members(scan, "")
    reads_of_the_first_pass = len(reads)
    assert list(entries) == _scan_tar(data) and top == ""
    assert len(reads) == reads_of_the_first_pass > 0
    assert os.listdir(tmp_path) == []  # the spool is an unnamed temporary file, gone once replayed

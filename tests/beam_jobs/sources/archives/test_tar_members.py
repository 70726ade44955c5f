"""The fast tar header scanner reads every tar exactly as tarfile does: plain headers by itself, the rest
(GNU long names, pax headers, global pax headers, sparse files, base-256 sizes, damaged headers) by
tarfile, and mutated or cut archives to the same entries and refusals."""

from __future__ import annotations

import io
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_jobs.sources.archives.archive_members import Entry, Refused
from beam_jobs.sources.archives.tar_members import _entry, _tarfile_header, _unless_ended, scan_tar  # the reference's parts


def _by_tarfile(data: bytes) -> list[Entry]:
    """The reference: every header read by tarfile (what scan_tar did before it read plain headers itself)."""
    handle = io.BytesIO(data)
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")
    except tarfile.ReadError as err:
        return [Refused("", "truncated-archive", f"no tar header could be read: {err}")]
    entries, offset = [], 0
    with archive:
        while True:
            try:
                header = _tarfile_header(archive, offset)
            except (tarfile.ReadError, EOFError) as err:
                return entries + [Refused("", "truncated-archive", f"the tar breaks after byte {archive.offset}: {err}")]
            if header is None:
                return entries + list(_unless_ended(handle, archive.offset, len(data)))
            entry = _entry(header, len(data), 0)
            if entry is not None:
                entries.append(entry)
            if isinstance(entry, Refused) and entry.reason == "truncated-archive":
                return entries
            offset = header.next_at


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", pax: dict | None = None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.pax_headers = kind, link, pax or {}
    return info


def _tar(members: list, tar_format: int, pax: dict | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tar_format, pax_headers=pax) as archive:
        for info, data in members:
            info.size = len(data or b"")
            archive.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


LONG = "class-" + "x" * 120 + "/image.jpg"  # a GNU long name, a ustar prefix or a pax path, by format
MIXED = [(_info("cat/a.jpg"), b"A" * 700), (_info("cat"), None), (_info("cat/empty.jpg"), b""),
         (_info(LONG), b"long" * 40), (_info("cat/link.jpg", tarfile.SYMTYPE, "a.jpg"), None),
         (_info("cat/hard.jpg", tarfile.LNKTYPE, "cat/a.jpg"), None), (_info("cat/fifo", tarfile.FIFOTYPE), None),
         (_info("cat/dir", tarfile.DIRTYPE), None), (_info("caf\u00e9/\u00fc.jpg"), b"U" * 513),
         (_info("cat/pax.jpg", pax={"comment": "a pax header of its own"}), b"P" * 1024)]
FORMATS = {"gnu": tarfile.GNU_FORMAT, "ustar": tarfile.USTAR_FORMAT, "pax": tarfile.PAX_FORMAT}


def _mixed(tar_format: str, pax: dict | None = None) -> bytes:
    members = MIXED if tar_format != "ustar" else [m for m in MIXED if m[0].name != "caf\u00e9/\u00fc.jpg"]
    return _tar(members, FORMATS[tar_format], pax)


def test_plain_and_extended_headers_of_every_format_read_as_tarfile_reads_them():
    for tar_format in FORMATS:
        data = _mixed(tar_format)
        entries = list(scan_tar(io.BytesIO(data), len(data)))
        assert entries == _by_tarfile(data)
        assert LONG in {entry.path for entry in entries}


def test_a_global_pax_path_renames_every_later_member_as_tarfile_says():
    """A "g" header's path applies to every member after it (tarfile's rule): the rest is read by tarfile."""
    data = _mixed("pax", pax={"path": "everything.jpg"})
    assert list(scan_tar(io.BytesIO(data), len(data))) == _by_tarfile(data)
    harmless = _mixed("pax", pax={"comment": "git archive writes the commit here"})
    assert list(scan_tar(io.BytesIO(harmless), len(harmless))) == _by_tarfile(harmless)


def test_an_old_tars_file_named_with_a_slash_is_a_folder_and_base256_sizes_read():
    folder = tarfile.TarInfo("old/")
    folder.type = tarfile.AREGTYPE
    big = tarfile.TarInfo("big.jpg")
    data = bytearray(_tar([(folder, None), (big, b"B" * 700)], tarfile.GNU_FORMAT))
    # Rewrite big.jpg's size field in base-256 (as GNU tar writes sizes past 8 GiB) and fix its checksum.
    header = data.index(b"big.jpg")
    data[header + 124:header + 136] = b"\x80" + (700).to_bytes(11, "big")
    _fix_checksum(data, header)
    data = bytes(data)
    assert list(scan_tar(io.BytesIO(data), len(data))) == _by_tarfile(data)
    assert [entry.path for entry in _by_tarfile(data)] == ["big.jpg"]


def _fix_checksum(data: bytearray, header: int) -> None:
    data[header + 148:header + 156] = b" " * 8
    data[header + 148:header + 156] = b"%06o\0 " % sum(data[header:header + 512])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tar_format=st.sampled_from(sorted(FORMATS)),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 511), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, 10**6), checksums=st.booleans())
def test_mutated_and_cut_tars_give_what_tarfile_gives(tar_format, flips, cut, checksums):
    data = bytearray(_mixed(tar_format))
    headers = [offset for offset in range(0, len(data), 512) if data[offset + 257:offset + 262] == b"ustar"]
    for which, position, value in flips:  # damage headers, where the two readers could disagree
        header = headers[which % len(headers)]
        data[header + position] = value
        if checksums and not 148 <= position < 156:  # damage that a checksum does not catch
            _fix_checksum(data, header)
    data = bytes(data[:cut % (len(data) + 1)])
    assert list(scan_tar(io.BytesIO(data), len(data))) == _by_tarfile(data)

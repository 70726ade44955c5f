"""Image headers read without decoding: the format from magic bytes, the size a header declares, and the EXIF
orientation of a JPEG. One home for the bytes of image formats, as ``record_files/`` is for records.

In: an image file's bytes. Out: small facts about them, or None when the header does not say (the decode
decides then). Plain functions, no Pillow: the validation stage asks them before it decodes anything.
"""

from __future__ import annotations

import struct
from typing import Optional

EXIF_ORIENTATION = 0x0112  # the EXIF tag (in IFD0) that turns an image


def sniff_format(data: bytes) -> Optional[str]:
    """The image format found from magic bytes, or None; extensions are never used."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def declared_size(data: bytes, fmt: str) -> Optional[tuple[int, int]]:
    """(height, width) as the PNG or JPEG header declares it, without decoding; None if unknown.

    Pillow refuses to even identify a zero-sized image, which would hide the
    real reason behind "cannot identify image file".
    """
    if fmt == "png" and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    if fmt == "jpeg":
        pos = 2
        while pos + 9 <= len(data) and data[pos] == 0xFF:
            marker = data[pos + 1]
            if marker in _SOF_MARKERS:
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return height, width
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            pos += 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
    return None


_XMP_SIGNATURE = b"http://ns.adobe.com/xap/1.0/"


def jpeg_orientation(data: bytes) -> Optional[int]:
    """EXIF orientation of a JPEG from its APP1 segment: 1 when absent, None when unsure.

    Unsure (malformed EXIF, or XMP metadata, from which Pillow may also take an
    orientation) sends the image down the general path.
    """
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker in (0xDA, 0xD9):  # start of scan: no more metadata
            return 1
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        segment = data[pos + 4 : pos + 2 + length]
        if marker == 0xE1 and segment.startswith(_XMP_SIGNATURE):
            return None
        if marker == 0xE1 and segment.startswith(b"Exif\x00\x00"):
            return tiff_orientation(segment[6:])
        pos += 2 + length
    return None


def tiff_orientation(tiff: bytes) -> Optional[int]:
    """Orientation (tag 0x0112) of IFD0 of a TIFF structure; 1 when absent, None when malformed."""
    try:
        order = {b"II": "<", b"MM": ">"}[tiff[:2]]
        (offset,) = struct.unpack(order + "I", tiff[4:8])
        (count,) = struct.unpack(order + "H", tiff[offset : offset + 2])
        for index in range(count):
            entry = tiff[offset + 2 + 12 * index : offset + 14 + 12 * index]
            tag, kind = struct.unpack(order + "HH", entry[:4])
            if tag == EXIF_ORIENTATION:
                return struct.unpack(order + "H", entry[8:10])[0] if kind == 3 else None
    except (KeyError, struct.error):
        return None
    return 1

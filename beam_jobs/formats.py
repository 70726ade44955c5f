"""Which image formats the converter reads: an explicit allow-list of Pillow formats, and what it refuses.

One table, not branches: each converted format is a Pillow format name with
the reason it is on the list. Files are identified by content (magic bytes
for the common formats, then Pillow restricted to this list), never by
extension. Everything that is not JPEG-as-is is re-encoded to JPEG by
``beam_jobs.stages.encode``, which decodes it through Pillow.

Left out on purpose, and named so: formats whose Pillow decoder a security
advisory says not to open on untrusted input (FITS: GHSA-whj4-6x5x-4v2j), that
run external programs (EPS, through Ghostscript), that are vector or
document formats (PDF, WMF/EMF, SVG), or that Pillow only identifies without
decoding (BUFR, GRIB, HDF5, MPEG). HEIC/HEIF phone photos are read when the
optional ``pillow-heif`` is installed (``pip install '.[heif]'``).
"""

from __future__ import annotations

import functools
from typing import Optional

from PIL import Image

# Pillow format name -> why we convert it (still rasters with a maintained Pillow decoder).
CONVERTED: dict[str, str] = {
    "JPEG": "the common case; clean RGB/gray JPEGs are stored byte for byte",
    "MPO": "multi-picture JPEG from cameras (first picture; read by Pillow's JPEG plugin)",
    "PNG": "lossless; alpha composited on white, 16-bit scaled",
    "GIF": "first frame",
    "BMP": "Windows bitmaps",
    "DIB": "headerless Windows bitmaps",
    "TIFF": "scanners, microscopy, satellites; BigTIFF too",
    "WEBP": "web images",
    "PPM": "PBM/PGM/PPM/PFM (the German Traffic Sign benchmark ships PPM)",
    "TGA": "Truevision targa (games, older datasets)",
    "ICO": "icons (largest image)",
    "CUR": "cursors",
    "ICNS": "macOS icons",
    "SGI": "Silicon Graphics images",
    "PSD": "Photoshop (merged image)",
    "JPEG2000": "medical and satellite sets",
    "AVIF": "AV1 still images",
    "DDS": "DirectDraw surfaces (textures)",
    "PCX": "ZSoft Paintbrush",
    "QOI": "Quite OK Image",
    "SUN": "Sun raster",
    "XBM": "X bitmaps",
    "XPM": "X pixmaps",
    "MSP": "Microsoft Paint",
    "DCX": "multi-page PCX (first page)",
    "BLP": "Blizzard textures",
    "IM": "LabEye/IFUNC images",
}

# Pillow format -> why its pixels are proven reproducible before they are stored: such a file is decoded
# twice, the memory its decoder will reuse filled with different bytes before each decode, and
# rejected as "unstable-decode" if the pixels differ. A decoder that reads uninitialised memory on
# malformed input would otherwise put different pixels, so different shard bytes, in every run.
# Decoding twice costs only these formats; a format joins when a file is found that needs it.
DECODED_TWICE: dict[str, str] = {
    "TIFF": "libtiff leaves parts of malformed JPEG-compressed tiles unwritten (mutated tiled JPEG TIFFs of "
            "Pillow's test images decode to different pixels on every decode with Pillow 12.3)",
}

try:  # HEIC/HEIF phone photos, when the optional extra is installed
    import pillow_heif

    pillow_heif.register_heif_opener()
    CONVERTED["HEIF"] = "HEIC/HEIF phone photos (pillow-heif)"
except ImportError:
    pass

# Content we recognise but do not convert: (test, name shown in the rejection).
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1")


def allowed() -> list[str]:
    """The Pillow formats ``Image.open`` may try, installed decoders only."""
    Image.init()
    return [name for name in CONVERTED if name in Image.OPEN]  # MPO opens through the JPEG plugin


@functools.lru_cache(maxsize=1)
def image_extensions() -> frozenset[str]:
    """File name extensions (lower case, no dot) of the formats we convert, as Pillow registers them.

    Only to find a file a label file names without its extension (formats are
    identified by content when converting).
    """
    Image.init()
    formats = set(allowed())
    names = {ext.lstrip(".").lower() for ext, fmt in Image.registered_extensions().items() if fmt in formats}
    return frozenset(names | ({"heic", "heif"} if "HEIF" in formats else set()))


def has_image_extension(name: str) -> bool:
    """``name`` ends in the extension of a format we convert (``x.JPG``, ``y.png``; not ``id``, ``z.txt``)."""
    return "." in name and name.rpartition(".")[2].lower() in image_extensions()


def unsupported_format(data: bytes) -> Optional[str]:
    """The name of a known format we do not convert, or None (then it is not an image at all)."""
    head = data[:64]
    if head.startswith(b"%PDF"):
        return "PDF"
    if head.startswith((b"%!PS", b"\xc5\xd0\xd3\xc6")):
        return "EPS (not opened: Pillow runs Ghostscript for it)"
    if head.startswith(b"SIMPLE  ="):
        return "FITS (not opened: Pillow security advisory GHSA-whj4-6x5x-4v2j)"
    if head.startswith((b"\xd7\xcd\xc6\x9a", b"\x01\x00\x00\x00")) and (b" EMF" in data[40:44] or head[0] == 0xD7):
        return "WMF/EMF (vector)"
    text = head.lstrip().lower()
    if text.startswith(b"<svg") or (text.startswith(b"<?xml") and b"<svg" in data[:1024].lower()):
        return "SVG (vector)"
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        return "HEIF (install the heif extra: pip install '.[heif]')"
    if data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis"):
        return "AVIF (this Pillow was built without AVIF)"
    if head.startswith((b"GRIB", b"BUFR", b"\x89HDF")):
        return "scientific data (GRIB/BUFR/HDF5)"
    return None

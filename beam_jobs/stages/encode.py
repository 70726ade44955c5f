"""Per-image work: sniff, validate, and (only when needed) re-encode to JPEG.

Plain functions of bytes, with no Beam and no file system, so every input kind
is unit-tested directly. :func:`encode_image` returns :class:`Encoded` or
:class:`Rejected`; it never raises for bad image content.

Policy, in the words of the contract:

* A JPEG whose pixels are RGB or grayscale, with no EXIF rotation, that decodes
  without a libjpeg warning and fits ``max_side`` is stored byte for byte.
  It is validated by a 1/8-scale decode (a larger n/8 for images under 256 px a side, whose perceptual
  hash needs 32 px; libjpeg's DCT scaling still parses the
  whole entropy-coded stream, so truncation and corrupt data are caught at a
  fraction of a full decode's cost); ``simplejpeg``'s strict mode turns
  libjpeg's recoverable warnings ("Corrupt JPEG data: ...") into errors, which
  Pillow would silently swallow and TensorFlow would print at training time.
* Everything else that decodes fully with Pillow is re-encoded as RGB JPEG.
* Empty files, non-images, undecodable or truncated images, zero-sized images
  and images with more than ``max_pixels`` pixels are rejected with a reason.
* Every accepted image gets its perceptual hash (the near-duplicate search's) from the pixels this
  decoded anyway: the 1/8-scale check of a JPEG stored as it is, the stored pixels of a re-encoded one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import re
import struct
import threading
import warnings
import zlib
from typing import Optional, Union

import numpy as np
import simplejpeg
import tifffile
from PIL import Image, ImageOps

from beam_jobs import formats, image_headers
from beam_jobs.options import EncodeOptions
from beam_jobs.stages import perceptual_hash, stable_decode

# What Pillow raises on malformed input. Pillow's own fuzzers treat this same
# family as "expected" failures; anything else is a bug worth crashing on.
DECODE_ERRORS = (
    OSError,  # includes UnidentifiedImageError and "image file is truncated"
    SyntaxError,  # "broken PNG file", bad TIFF tags
    ValueError,
    EOFError,
    struct.error,
    zlib.error,
    IndexError,
    Image.DecompressionBombError,
    RuntimeError,  # the AVIF and HEIF decoders (libavif, libheif) report malformed frames this way
)

_PIL_FORMATS = {"jpeg": "JPEG", "png": "PNG", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF", "webp": "WEBP"}
_WHITE = (255, 255, 255)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """An image ready to store.

    Attributes:
      data: JPEG bytes to store as ``image/encoded``.
      height, width: size of the stored image.
      source_format: format found from the content ("jpeg", "png", ...).
      reencoded_because: empty when ``data`` is the input byte for byte,
        otherwise why it was re-encoded (e.g. "png", "cmyk", "exif-rotated").
      channels: what ``data`` decodes to: 3, or 1 for a grayscale JPEG stored
        byte for byte (re-encoded images are always RGB).
      orientation: the EXIF orientation turned upright by re-encoding (1: none), and
      source_size: the input's ``(width, height)`` as stored, before any turn or resize (``()``: the
        stored image's own); what places an image's objects (:func:`beam_jobs.annotations.place`).
      perceptual_hash: the stored pixels' 64-bit DCT hash (:mod:`beam_jobs.stages.perceptual_hash`), from the
        decode the validation did anyway (the 1/8-scale one of a JPEG stored as it is); None when
        ``EncodeOptions.perceptual_hash`` is off.
      thumbnail: the stored pixels' 8x8 gray thumbnail (64 bytes, :func:`perceptual_hash.thumbnail_of_scaled`),
        from the same pixels as the hash, which verifies the near search's pairs; b"" when it takes none.
      signature_pixels: the scaled decode the hash and thumbnail are still to be taken from, when
        :func:`encode_image` was asked to leave them to a batch (``sign=False``: :func:`signed`); else None.
    """

    data: bytes
    height: int
    width: int
    source_format: str
    reencoded_because: str = ""
    channels: int = 3
    orientation: int = 1
    source_size: tuple = ()
    perceptual_hash: Optional[int] = None
    thumbnail: bytes = b""
    signature_pixels: Optional[np.ndarray] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def input_size(self) -> tuple[int, int]:
        """The input's ``(width, height)`` as stored in its file."""
        return tuple(self.source_size) if self.source_size else (self.width, self.height)

    @property
    def reencoded(self) -> bool:
        return bool(self.reencoded_because)


@dataclasses.dataclass(frozen=True)
class Rejected:
    """An input that is not stored.

    Attributes:
      reason: a short stable code to group by ("empty-file", "not-an-image",
        "undecodable", "zero-sized", "too-many-pixels", ...).
      detail: a human explanation, including the library's message.
    """

    reason: str
    detail: str


EncodeResult = Union[Encoded, Rejected]


def encode_image(data: bytes, options: EncodeOptions, sign: bool = True) -> EncodeResult:
    """Validate one image file's bytes and return what to store, or why not.

    The result depends only on ``data`` and ``options`` (and the library
    versions), so a rerun produces byte-identical output. ``sign`` False: a JPEG
    stored as it is keeps its scaled decode in ``signature_pixels`` instead of its
    perceptual hash and thumbnail, for the caller to take many at once
    (:func:`perceptual_hash.signatures_of_scaled`, the same bits: the validation
    does, #56 §5).
    """
    result = _encode_image(data, options)
    if isinstance(result, Rejected):
        # Library messages may carry memory addresses ("<_io.BytesIO object at 0x7f...>"); the report
        # must be byte-identical across runs, like the shards.
        return Rejected(result.reason, _ADDRESS.sub("", result.detail))
    return signed(result) if sign else result


def signed(result: Encoded) -> Encoded:
    """``result`` with the perceptual hash and thumbnail of its ``signature_pixels`` taken (as it is without)."""
    if result.signature_pixels is None:
        return result
    phash, thumbnail = perceptual_hash.signature_of_scaled(result.signature_pixels)
    return dataclasses.replace(result, perceptual_hash=phash, thumbnail=thumbnail, signature_pixels=None)


_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")
# We enforce --max-pixels ourselves (see _encode_image); Pillow's warning below twice the limit is noise.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)


def _encode_image(data: bytes, options: EncodeOptions) -> EncodeResult:
    if not data:
        return Rejected("empty-file", "the file is empty")
    # --max-pixels is the one limit: Pillow's own decompression-bomb check (178,956,970 pixels by
    # default) would otherwise refuse images the user allowed. Ours runs on the declared size
    # before any pixel is allocated; Pillow's then guards the same number.
    Image.MAX_IMAGE_PIXELS = options.max_pixels
    fmt = image_headers.sniff_format(data)
    declared = image_headers.declared_size(data, fmt) if fmt else None
    if declared is not None and 0 in declared:
        return Rejected("zero-sized", f"{fmt} header declares {declared[1]}x{declared[0]} pixels")
    if fmt == "jpeg":
        clean = _clean_jpeg(data, options)
        if clean is not None:
            return clean
    try:
        img = Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[fmt]] if fmt else formats.allowed())
    except Image.DecompressionBombError as err:
        return Rejected("too-many-pixels", str(err))
    except DECODE_ERRORS as err:
        if fmt is None:  # no converted format's decoder recognises it
            name = formats.unsupported_format(data)
            if name:
                return Rejected("unsupported-format", f"{name} files are not converted")
            return Rejected("not-an-image", "content is not an image format the converter reads")
        float_tiff = _float64_tiff(data, options.max_pixels) if fmt == "tiff" else None
        if float_tiff is None:
            return Rejected("undecodable", f"{fmt} header could not be read: {err}")
        if isinstance(float_tiff, Rejected):
            return float_tiff
        img = float_tiff
    fmt = fmt or str(img.format).lower()
    width, height = img.size
    if width <= 0 or height <= 0:
        return Rejected("zero-sized", f"image is {width}x{height} pixels")
    if width * height > options.max_pixels:
        return Rejected(
            "too-many-pixels",
            f"{width}x{height} = {width * height} pixels exceeds the limit of {options.max_pixels}",
        )
    if options.min_side is not None and min(width, height) < options.min_side:
        return Rejected("too-small", f"{width}x{height}: the shorter side is under --min-side {options.min_side}")
    fits = options.max_side is None or max(width, height) <= options.max_side
    if fmt == "jpeg" and fits and img.mode in ("RGB", "L") and _orientation(img) in (None, 1):
        warning, pixels = _libjpeg_check(data, img.mode, options.perceptual_hash)
        if warning is None:
            return Encoded(data, height, width, fmt, channels=1 if img.mode == "L" else 3,
                           signature_pixels=_signature_pixels(pixels, options))
        return _reencode(img, data, fmt, options, because="corrupt-data")
    return _reencode(img, data, fmt, options, because=_reencode_reason(img, fmt, fits))


class _QuietWhileActive(logging.Filter):
    """Drops a logger's records in the threads that are inside :meth:`active`.

    tifffile logs every malformed tag it meets at WARNING or ERROR; on hostile
    inputs that is noise naming no file, and the rejection says what failed.
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    @contextlib.contextmanager
    def active(self):
        self._local.on = True
        try:
            yield
        finally:
            self._local.on = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self._local, "on", False)


_TIFFFILE_QUIET = _QuietWhileActive()
logging.getLogger("tifffile").addFilter(_TIFFFILE_QUIET)


def _float64_tiff(data: bytes, max_pixels: int) -> Union[Image.Image, Rejected, None]:
    """A TIFF of 64-bit float samples (microscopy, remote sensing), which Pillow cannot open, read by tifffile.

    Pillow reads float samples up to 32 bits only. The pixels come back as a
    Pillow image the common path converts like any other: gray as mode ``F``
    (scaled as 32-bit float TIFFs are), RGB(A) scaled to 8 bits here. None when
    the file is not such a TIFF, so its rejection stays Pillow's.
    """
    try:
        with _TIFFFILE_QUIET.active(), tifffile.TiffFile(io.BytesIO(data)) as tiff:
            page = tiff.pages.first
            if page.dtype is None or page.dtype != np.float64:
                return None
            if page.imagewidth * page.imagelength > max_pixels:
                return Rejected("too-many-pixels", f"{page.imagewidth}x{page.imagelength} = "
                                f"{page.imagewidth * page.imagelength} pixels exceeds the limit of {max_pixels}")
            pixels = page.asarray()
    except Exception as err:  # noqa: BLE001 - a pure-Python parser of hostile bytes: any failure is "undecodable"
        # (Hypothesis found TypeError, besides tifffile's own TiffFileError, ValueError, KeyError...)
        return Rejected("undecodable", f"tiff data could not be decoded: {type(err).__name__}: {err}")
    if pixels.ndim == 2:
        return Image.fromarray(np.nan_to_num(pixels).astype(np.float32), mode="F")
    if pixels.ndim == 3 and pixels.shape[-1] in (3, 4):
        return Image.fromarray(_to_uint8(np.nan_to_num(pixels[..., :3])), mode="RGB")
    return Rejected("undecodable", f"tiff holds float samples of shape {pixels.shape}, not a gray or RGB image")


def _clean_jpeg(data: bytes, options: EncodeOptions) -> Optional[Encoded]:
    """The common case decided without Pillow: a clean, upright RGB or gray JPEG that fits.

    Returns None whenever anything is unusual (then the general path decides),
    so the result is the general path's for every input; it only skips
    Pillow's header parsing, a tenth of the per-image cost.
    """
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "RGB", "Gray") or not 0 < width * height <= options.max_pixels:
        return None
    if options.max_side is not None and max(width, height) > options.max_side:
        return None
    if options.min_side is not None and min(width, height) < options.min_side:
        return None  # the general path rejects it
    if image_headers.jpeg_orientation(data) != 1:
        return None
    warning, pixels = _libjpeg_check(data, "L" if colorspace == "Gray" else "RGB", options.perceptual_hash)
    if warning is not None:
        return None
    return Encoded(data, height, width, "jpeg", channels=1 if colorspace == "Gray" else 3,
                   signature_pixels=_signature_pixels(pixels, options))


def _orientation(img: Image.Image) -> Optional[int]:
    try:
        return img.getexif().get(image_headers.EXIF_ORIENTATION)
    except DECODE_ERRORS:
        # Unreadable EXIF does not make the pixels unreadable; the decode decides.
        return None


def _libjpeg_check(data: bytes, mode: str, hashed: bool = False) -> tuple[Optional[str], Optional[np.ndarray]]:
    """``(warning, pixels)``: libjpeg's first warning or error for ``data`` (None when it decodes cleanly), and the
    pixels the check decoded (None when it failed), which the perceptual hash is taken from.

    The check decodes at 1/8 scale; when the pixels are ``hashed``, at the smallest of libjpeg's scales (n/8)
    that keeps both sides at 32 px or more, so a small image's hash is not taken from a dozen pixels: 1/8
    still for any image of 256 px or more a side.
    """
    least = perceptual_hash.SIDE if hashed else 1
    try:
        pixels = simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY" if mode == "L" else "RGB",
            min_height=least,
            min_width=least,
            min_factor=1 if hashed else 8,
            strict=True,
        )
    except ValueError as err:
        return str(err), None
    return None, pixels


def _libjpeg_warning(data: bytes, mode: str) -> Optional[str]:
    """libjpeg's first warning or error for ``data``, None when it decodes cleanly."""
    return _libjpeg_check(data, mode)[0]


def _signature_pixels(pixels: Optional[np.ndarray], options: EncodeOptions) -> Optional[np.ndarray]:
    """A pass-through JPEG's checked pixels, which its perceptual hash and the thumbnail that verifies its near
    pairs are taken from (:func:`signed`), when the options ask for them (None when not)."""
    return pixels if options.perceptual_hash else None


def _reencode_reason(img: Image.Image, fmt: str, fits: bool) -> str:
    if fmt != "jpeg":
        return fmt
    if img.mode not in ("RGB", "L"):
        return img.mode.lower()  # "cmyk", "ycbcr", ...
    if _orientation(img) not in (None, 1):
        return "exif-rotated"
    if not fits:
        return "resized"
    return "jpeg"


def _reencode(img: Image.Image, data: bytes, fmt: str, options: EncodeOptions, because: str) -> EncodeResult:
    """Decode ``img`` (opened from ``data``) once with Pillow and encode it as an upright RGB JPEG.

    Formats in :data:`formats.DECODED_TWICE` are decoded a second time, to
    prove the pixels reproducible (see :mod:`beam_jobs.stages.stable_decode`).

    A JPEG that will be downsized by 2x or more is decoded at reduced scale
    (libjpeg's DCT scaling through Pillow's ``draft``: 1/2, 1/4 or 1/8 of the
    pixels' work), to no less than twice the output size, so the LANCZOS
    resize that follows still filters instead of aliasing (what Pillow's
    ``thumbnail`` does with ``reducing_gap=2``).
    """
    stored, orientation = img.size, _orientation(img) or 1
    try:
        if options.max_side is not None and fmt == "jpeg":
            _draft_for(img, options.max_side)
        if img.format not in formats.DECODED_TWICE:
            img.load()
        elif (problem := stable_decode.load_checked(img, data)) is not None:
            return Rejected(problem[0], f"{fmt} data {problem[1]}")
        img = ImageOps.exif_transpose(img)
        rgb = _to_rgb(img)
    except Image.DecompressionBombError as err:
        return Rejected("too-many-pixels", str(err))
    except DECODE_ERRORS as err:
        return Rejected("undecodable", f"{fmt} data could not be decoded: {err}")
    out = io.BytesIO()
    try:
        if options.max_side is not None and max(rgb.size) > options.max_side:
            rgb = _downsize(rgb, options.max_side)
        rgb.save(out, format="JPEG", quality=options.quality)
    except DECODE_ERRORS as err:  # a malformed TIFF can decode "successfully" yet fail in the encoder
        return Rejected("undecodable", f"{fmt} data could not be converted to JPEG: {err}")
    width, height = rgb.size
    phash = perceptual_hash.of_image(rgb) if options.perceptual_hash else None  # the stored pixels
    thumbnail = perceptual_hash.thumbnail_of_image(rgb) if options.perceptual_hash else b""
    return Encoded(out.getvalue(), height, width, fmt, because, orientation=orientation, source_size=stored,
                   perceptual_hash=phash, thumbnail=thumbnail)


def _to_rgb(img: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB; transparency is composited on white."""
    if img.mode.startswith("I") or img.mode == "F":
        img = Image.fromarray(_to_uint8(np.asarray(img)), mode="L")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def _to_uint8(pixels: np.ndarray) -> np.ndarray:
    """Scale 16-bit, 32-bit or float grayscale to 0..255."""
    pixels = pixels.astype(np.float64)
    peak = float(pixels.max()) if pixels.size else 0.0
    if peak > 255.0:
        scale = 65535.0 if peak <= 65535.0 else peak
        pixels = pixels * (255.0 / scale)
    elif 0.0 < peak <= 1.0:
        pixels = pixels * 255.0
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _draft_for(img: Image.Image, max_side: int) -> None:
    """Ask libjpeg for the smallest DCT scale that keeps the image at least twice ``max_side``."""
    width, height = img.size
    scale = max_side / max(width, height)
    if scale <= 0.5:
        img.draft(img.mode, (math.ceil(2 * width * scale), math.ceil(2 * height * scale)))


def _downsize(img: Image.Image, max_side: int) -> Image.Image:
    width, height = img.size
    scale = max_side / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return img.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)

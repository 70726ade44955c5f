"""Per-image policy: what is stored as is, re-encoded, or rejected, and why."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_jobs.options import EncodeOptions
from beam_jobs.stages import encode as encode_module
from beam_jobs.image_headers import sniff_format
from beam_jobs.stages.encode import Encoded, Rejected, encode_image
from tests.conftest import REJECTED_KINDS, _save

OPTIONS = EncodeOptions()

PASS_THROUGH = ["jpeg_rgb", "jpeg_gray", "jpeg_progressive", "jpeg_large"]
REENCODED = {
    "jpeg_cmyk": "cmyk",
    "jpeg_exif_rotated": "exif-rotated",
    "jpeg_corrupt_data": "corrupt-data",
    "png_rgb": "png",
    "png_rgba": "png",
    "png_palette": "png",
    "png_16bit_gray": "png",
    "gif": "gif",
    "bmp": "bmp",
    "tiff": "tiff",
    "webp": "webp",
}


def _tf_decode(data: bytes) -> np.ndarray:
    return tf.io.decode_jpeg(data, channels=3).numpy()


@pytest.mark.parametrize("kind", PASS_THROUGH)
def test_clean_rgb_and_gray_jpegs_are_stored_byte_for_byte(sample_images, kind):
    result = encode_image(sample_images[kind], OPTIONS)
    assert isinstance(result, Encoded)
    assert result.data == sample_images[kind]
    assert not result.reencoded
    assert _tf_decode(result.data).shape == (result.height, result.width, 3)


@pytest.mark.parametrize("kind,because", sorted(REENCODED.items()))
def test_other_decodable_inputs_are_reencoded_as_rgb_jpeg(sample_images, kind, because):
    result = encode_image(sample_images[kind], OPTIONS)
    assert isinstance(result, Encoded), result
    assert result.reencoded_because == because
    assert sniff_format(result.data) == "jpeg"
    assert Image.open(io.BytesIO(result.data)).mode == "RGB"
    assert _tf_decode(result.data).shape == (result.height, result.width, 3)


@pytest.mark.parametrize("kind,reason", sorted(REJECTED_KINDS.items()))
def test_bad_inputs_are_rejected_with_a_reason(sample_images, kind, reason):
    result = encode_image(sample_images[kind], OPTIONS)
    assert isinstance(result, Rejected)
    assert result.reason == reason
    assert result.detail


def test_exif_rotated_jpeg_is_stored_upright(sample_images):
    # The source is 100 wide, 60 high, with "rotate 90" in EXIF: stored 60 wide, 100 high.
    result = encode_image(sample_images["jpeg_exif_rotated"], OPTIONS)
    assert (result.height, result.width) == (100, 60)


def test_transparent_pixels_are_composited_on_white(sample_images):
    pixels = _tf_decode(encode_image(sample_images["png_rgba"], OPTIONS).data)
    assert pixels[:, :30].min() > 240  # the transparent left quarter
    assert pixels[:, 60:].mean() < 230  # the opaque rest keeps its colours


def test_16bit_png_is_scaled_not_clipped(sample_images):
    pixels = _tf_decode(encode_image(sample_images["png_16bit_gray"], OPTIONS).data)
    # A full-range ramp must stay a ramp: dark first rows, bright last rows.
    assert pixels[:5].mean() < 20 and pixels[-5:].mean() > 235


def test_corrupt_data_jpeg_is_reencoded_to_a_clean_stream(sample_images):
    from beam_jobs.stages.encode import _libjpeg_warning

    assert "Corrupt JPEG data" in _libjpeg_warning(sample_images["jpeg_corrupt_data"], "RGB")
    result = encode_image(sample_images["jpeg_corrupt_data"], OPTIONS)
    assert _libjpeg_warning(result.data, "RGB") is None


def test_max_side_downsizes_keeping_aspect(sample_images):
    result = encode_image(sample_images["jpeg_large"], EncodeOptions(max_side=200))
    assert (result.height, result.width) == (150, 200)
    assert result.reencoded_because == "resized"
    small = encode_image(sample_images["jpeg_rgb"], EncodeOptions(max_side=200))
    assert not small.reencoded  # already fits: untouched


def test_pixel_limit_rejects_before_decoding(sample_images):
    result = encode_image(sample_images["jpeg_large"], EncodeOptions(max_pixels=100_000))
    assert isinstance(result, Rejected) and result.reason == "too-many-pixels"
    assert "480000" in result.detail


def test_quality_option_changes_reencoded_size(sample_images):
    low = encode_image(sample_images["png_rgb"], EncodeOptions(quality=30)).data
    high = encode_image(sample_images["png_rgb"], EncodeOptions(quality=95)).data
    assert len(low) < len(high)


def test_encoding_is_deterministic(sample_images):
    for kind in REENCODED:
        assert encode_image(sample_images[kind], OPTIONS) == encode_image(sample_images[kind], OPTIONS)


@pytest.mark.parametrize(
    "field,value",
    [("quality", 0), ("quality", 101), ("max_side", 8), ("max_pixels", 0)],
)
def test_encode_options_name_the_bad_flag(field, value):
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')}"):
        EncodeOptions(**{field: value})


def test_the_pillow_free_jpeg_path_takes_only_clean_upright_jpegs(sample_images):
    from beam_jobs.stages.encode import _clean_jpeg, signed

    for kind in PASS_THROUGH:
        assert signed(_clean_jpeg(sample_images[kind], OPTIONS)) == encode_image(sample_images[kind], OPTIONS)
    for kind in ("jpeg_cmyk", "jpeg_exif_rotated", "jpeg_corrupt_data", "truncated_jpeg"):
        assert _clean_jpeg(sample_images[kind], OPTIONS) is None
    assert _clean_jpeg(sample_images["jpeg_large"], EncodeOptions(max_side=200)) is None
    assert _clean_jpeg(sample_images["jpeg_large"], EncodeOptions(max_pixels=1000)) is None


def test_an_image_signed_later_gets_the_hash_and_thumbnail_it_gets_signed_at_once(sample_images):
    from beam_jobs.stages.encode import signed

    for kind in PASS_THROUGH:
        later = encode_image(sample_images[kind], OPTIONS, sign=False)
        assert later.perceptual_hash is None and later.signature_pixels is not None
        assert signed(later) == encode_image(sample_images[kind], OPTIONS)
        assert signed(later).signature_pixels is None


def test_exif_orientation_one_is_still_stored_byte_for_byte():
    exif = Image.Exif()
    exif[0x0112] = 1
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buffer, "JPEG", exif=exif.tobytes())
    result = encode_image(buffer.getvalue(), OPTIONS)
    assert result.data == buffer.getvalue() and not result.reencoded


def _large_photo_jpeg(width=1600, height=1200):
    from tests.conftest import _photo

    pixels = _photo(9, height, width).astype(np.int16) + np.random.default_rng(0).normal(0, 6, (height, width, 1)).astype(np.int16)
    return _save(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)), "JPEG", quality=90)


def test_a_jpeg_downsized_2x_or_more_is_decoded_at_reduced_scale_without_visible_loss():
    data = _large_photo_jpeg()
    result = encode_image(data, EncodeOptions(max_side=256))
    assert (result.width, result.height, result.reencoded_because) == (256, 192, "resized")
    # The reference: a full-size decode, then the same LANCZOS resize.
    full = Image.open(io.BytesIO(data)).convert("RGB").resize((256, 192), Image.Resampling.LANCZOS)
    ours = np.asarray(Image.open(io.BytesIO(result.data)).convert("RGB"), np.float64)
    mse = ((ours - np.asarray(full, np.float64)) ** 2).mean()
    assert 10 * np.log10(255**2 / mse) > 35  # dB: the JPEG re-encode itself costs about as much
    # And the decode really was reduced: Pillow's draft picked 1/2 scale (800x600 >= 2 x 256).
    img = Image.open(io.BytesIO(data))
    encode_module._draft_for(img, 256)
    img.load()
    assert img.size == (800, 600)


def test_a_jpeg_downsized_less_than_2x_is_decoded_at_full_size():
    img = Image.open(io.BytesIO(_large_photo_jpeg(400, 300)))
    encode_module._draft_for(img, 256)
    img.load()
    assert img.size == (400, 300)


def test_max_pixels_is_the_one_limit_even_above_pillows_own():
    """A 196 MP image with --max-pixels 300000000 gets past Pillow's 179 MP bomb check (this one is then
    rejected only because its pixel data is a stub); without the option, ours rejects it first."""
    from tests.conftest import _png_with_size

    data = _png_with_size(14_000, 14_000)
    allowed = encode_image(data, EncodeOptions(max_pixels=300_000_000))
    assert allowed.reason == "undecodable" and "truncated" in allowed.detail
    refused = encode_image(data, EncodeOptions())
    assert refused == Rejected("too-many-pixels", "14000x14000 = 196000000 pixels exceeds the limit of 100000000")


def test_rejection_details_carry_no_memory_addresses():
    result = encode_image(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, EncodeOptions())
    assert result.reason == "undecodable" and " at 0x" not in result.detail


DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")  # tests/data
UNSTABLE = os.path.join(DATA, "unstable-decode")
DECODE_ERRORS = os.path.join(DATA, "decode-errors")


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(UNSTABLE) if n.endswith(".tif")))
def test_a_tiff_that_decodes_to_different_pixels_each_time_is_always_rejected(name):
    data = open(os.path.join(UNSTABLE, name), "rb").read()
    results = {encode_image(data, OPTIONS) for _ in range(20)}
    assert len(results) == 1
    (result,) = results
    assert isinstance(result, Rejected) and result.reason == "unstable-decode", result


@pytest.mark.parametrize("compression", ["jpeg", "group4", "tiff_lzw", "tiff_adobe_deflate", None])
def test_well_formed_tiffs_decode_the_same_every_time_and_are_converted(compression):
    rgb = Image.fromarray(np.random.default_rng(3).integers(0, 256, (96, 128, 3), np.uint8))
    image = rgb.convert("1") if compression == "group4" else rgb
    data = _save(image, "TIFF", **({"compression": compression} if compression else {}),
                 **({"tile": (64, 64)} if compression == "jpeg" else {}))
    results = {encode_image(data, OPTIONS) for _ in range(3)}
    assert len(results) == 1
    (result,) = results
    assert isinstance(result, Encoded) and result.reencoded_because == "tiff" and (result.width, result.height) == (128, 96)


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(DECODE_ERRORS) if n.endswith(".tif")))
def test_a_tiff_whose_decoder_reports_errors_is_rejected_with_them_and_nothing_reaches_stderr(name, capfd):
    data = open(os.path.join(DECODE_ERRORS, name), "rb").read()
    result = encode_image(data, OPTIONS)
    assert isinstance(result, Rejected) and result.reason == "decode-errors", result
    assert "Fax4Decode: " in result.detail and " at line " in result.detail and "%" not in result.detail
    assert encode_image(data, OPTIONS) == result
    assert capfd.readouterr().err == ""  # libtiff's default handler would have printed every error


@pytest.mark.parametrize("channels", [1, 3])
def test_a_64_bit_float_tiff_pillow_cannot_open_is_converted_like_a_32_bit_one(channels):
    import tifffile

    gray = np.linspace(0.0, 1.0, 48 * 64).reshape(48, 64)
    pixels = gray if channels == 1 else np.stack([gray, 1.0 - gray, gray / 2], axis=-1)
    as_64, as_32 = io.BytesIO(), io.BytesIO()
    photometric = "minisblack" if channels == 1 else "rgb"
    tifffile.imwrite(as_64, pixels, photometric=photometric)
    tifffile.imwrite(as_32, pixels.astype(np.float32), photometric=photometric)
    with pytest.raises(OSError):  # UnidentifiedImageError
        Image.open(io.BytesIO(as_64.getvalue()))  # what used to make it "tiff header could not be read"
    result = encode_image(as_64.getvalue(), EncodeOptions())
    assert isinstance(result, Encoded) and (result.height, result.width, result.reencoded_because) == (48, 64, "tiff")
    decoded = np.asarray(Image.open(io.BytesIO(result.data)).convert("RGB"), np.int16)
    expected = np.rint(np.clip(pixels, 0, 1) * 255)
    expected = np.repeat(expected[..., None], 3, axis=-1) if channels == 1 else expected
    assert np.abs(decoded - expected).mean() < 2  # JPEG's error only
    if channels == 1:  # the same pixels as the 32-bit float file Pillow reads itself
        thirty_two = encode_image(as_32.getvalue(), EncodeOptions())
        assert np.abs(decoded - np.asarray(Image.open(io.BytesIO(thirty_two.data)).convert("RGB"), np.int16)).max() <= 1
    assert encode_image(as_64.getvalue(), EncodeOptions(max_pixels=100)).reason == "too-many-pixels"

"""The perceptual hash: stable under resizing, re-encoding and the 1/8-scale decode, far apart for other photos;
the bands find every pair within the distance; the validation takes it from the decode it does anyway."""

from __future__ import annotations

import io
import itertools
import random

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from tests.photo_data import source_photos
from beam_jobs.stages import perceptual_hash
from beam_jobs.options import DEFAULT_NEAR_DISTANCE, EncodeOptions
from beam_jobs.stages.encode import Encoded, encode_image


@pytest.fixture(autouse=True)
def _no_pillow_limit(monkeypatch):
    """encode_image sets Pillow's pixel limit from its options; another test's small one must not leak here."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    """Real photos (scikit-image's, scikit-learn's), 320 px on the longer side; the stereo twin (7) left out."""
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # encode_image sets it: other tests' limits
    try:
        return [p.resize((round(p.width * 320 / max(p.size)), round(p.height * 320 / max(p.size))))
                for index, p in enumerate(source_photos()) if index != 7]
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def _jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def test_a_hash_is_64_bits_and_the_same_for_the_same_pixels(photos):
    hashes = [perceptual_hash.of_image(p) for p in photos]
    assert all(0 <= h < 1 << 64 for h in hashes)
    assert hashes == [perceptual_hash.of_image(p.copy()) for p in photos]
    assert perceptual_hash.of_scaled(np.asarray(photos[0].reduce(8))) == hashes[0]  # 320 px: 1/8 is 40 px


def test_resized_and_reencoded_copies_are_near_and_other_photos_far(photos):
    for photo in photos:
        original = perceptual_hash.of_image(photo)
        half = photo.resize((photo.width // 2, photo.height // 2), Image.Resampling.BILINEAR)
        assert perceptual_hash.distance(original, perceptual_hash.of_image(half)) <= 8
        requantized = Image.open(io.BytesIO(_jpeg(photo, 50)))
        assert perceptual_hash.distance(original, perceptual_hash.of_image(requantized)) <= 8
    hashes = [perceptual_hash.of_image(p) for p in photos]
    assert min(perceptual_hash.distance(a, b) for a, b in itertools.combinations(hashes, 2)) > 16


def test_the_eighth_scale_decode_and_a_full_decode_hash_alike(photos):
    for photo in photos:
        data = _jpeg(photo)
        full = perceptual_hash.of_image(Image.open(io.BytesIO(data)))
        scaled = simplejpeg.decode_jpeg(data, min_height=32, min_width=32)  # as the validation's check does
        assert scaled.shape[1::-1] == perceptual_hash.scaled_size(*photo.size)
        assert perceptual_hash.distance(full, perceptual_hash.of_scaled(scaled)) <= 8
        small = photo.resize((photo.width // 3, photo.height // 3))  # about 100 px: decoded at 3/8 to 5/8
        scaled = simplejpeg.decode_jpeg(_jpeg(small), min_height=32, min_width=32)
        assert scaled.shape[1::-1] == perceptual_hash.scaled_size(*small.size)
        # a small image hashes less steadily (perceptual_hash's docstring says so): up to 10 bits measured
        assert perceptual_hash.distance(perceptual_hash.of_image(small), perceptual_hash.of_scaled(scaled)) <= 12


def test_every_pair_within_the_distance_agrees_on_a_band():
    rng = random.Random(0)
    for distance in (0, 1, 5, 10, 12):
        cut = perceptual_hash.bands(distance)
        assert sorted(itertools.chain(*cut)) == list(range(64)) and len(cut) == distance + 1
        for _ in range(200):
            a = rng.getrandbits(64)
            b = a
            for bit in rng.sample(range(64), rng.randint(0, distance)):
                b ^= 1 << bit
            values = perceptual_hash.band_values([a, b], cut)
            assert (values[0] == values[1]).any()
    with pytest.raises(ValueError, match="0..12"):
        perceptual_hash.bands(13)


def test_band_values_hold_the_bands_bits():
    cut = perceptual_hash.bands(3)  # bit i in band i % 4
    value = perceptual_hash.band_values([1 << 63], cut)  # the first bit (position 0) alone
    assert value.tolist() == [[1 << 15, 0, 0, 0]]
    assert perceptual_hash.pairwise_distances(np.array([0, 7], np.uint64), np.array([1, 0], np.uint64)).tolist() \
        == [[1, 0], [2, 3]]


def test_validation_hashes_jpegs_stored_as_they_are_and_reencoded_images_unless_told_not_to(photos):
    jpeg = _jpeg(photos[0])
    png = io.BytesIO()
    photos[0].save(png, format="PNG")
    stored, reencoded = encode_image(jpeg, EncodeOptions()), encode_image(png.getvalue(), EncodeOptions())
    assert isinstance(stored, Encoded) and not stored.reencoded and stored.data == jpeg
    assert isinstance(reencoded, Encoded) and reencoded.reencoded_because == "png"
    # the PNG and its JPEG copy: near-duplicates at the default distance
    assert perceptual_hash.distance(stored.perceptual_hash, reencoded.perceptual_hash) <= DEFAULT_NEAR_DISTANCE
    gray = _jpeg(photos[0].convert("L"))
    assert encode_image(gray, EncodeOptions()).perceptual_hash is not None
    off = EncodeOptions(perceptual_hash=False)
    assert encode_image(jpeg, off).perceptual_hash is None and encode_image(png.getvalue(), off).perceptual_hash is None
    assert encode_image(jpeg, off).data == stored.data  # the hash never changes what is stored


def _scene(photo: Image.Image, cloth: Image.Image, seed: int) -> Image.Image:
    """``photo`` (an object) laid on ``cloth`` near its centre, a sixth to a third of the frame, as products are
    photographed one after another under a fixed camera."""
    rng = random.Random(seed)
    scene = cloth.copy()
    side = rng.randint(170, 230)
    item = photo.resize((side, round(side * 0.65)))
    scene.paste(item, (256 - item.width // 2 + rng.randint(-20, 20), 192 - item.height // 2 + rng.randint(-20, 20)))
    return scene


def _thumbnail(data: bytes) -> bytes:
    result = encode_image(data, EncodeOptions())
    assert isinstance(result, Encoded) and len(result.thumbnail) == perceptual_hash.THUMB_BYTES
    return result.thumbnail


def test_the_thumbnail_keeps_copies_together_and_tells_other_objects_on_one_background_apart(photos):
    """#56 §1: the pairs the bands find are checked on the thumbnail. Copies (resized, re-encoded, brighter,
    another colour balance or contrast) stay within MAX_THUMBNAIL_DISTANCE; other objects on one patterned
    cloth (their hashes often a few bits apart) do not."""
    rng = np.random.default_rng(5)
    checks = np.kron(rng.integers(0, 2, (25, 33)), np.ones((16, 16)))[:384, :512] * 90 + 80
    cloth = Image.fromarray((checks + rng.normal(0, 12, checks.shape)).clip(0, 255).astype(np.uint8)).convert("RGB")
    scenes = [_scene(photo, cloth, index) for index, photo in enumerate(photos)]
    thumbnails = [_thumbnail(_jpeg(scene)) for scene in scenes]
    apart = [perceptual_hash.thumbnail_distance(a, b) for a, b in itertools.combinations(thumbnails, 2)]
    assert min(apart) > perceptual_hash.MAX_THUMBNAIL_DISTANCE
    copies = {
        "resized to half": lambda im: _jpeg(im.resize((im.width // 2, im.height // 2), Image.Resampling.BILINEAR)),
        "re-encoded at quality 40": lambda im: _jpeg(im, 40),
        "brighter": lambda im: _jpeg(im.point(lambda v: min(255, round(v * 1.2)))),
        "another colour balance": lambda im: _jpeg(Image.merge("RGB", [
            band.point(lambda v, s=s: min(255, round(v * s))) for band, s in zip(im.split(), (1.15, 1.0, 0.85))])),
        "a PNG (re-encoded, hashed from its full decode)": lambda im: _png(im),
    }
    for image, thumbnail in [*zip(photos, (_thumbnail(_jpeg(p)) for p in photos)), (scenes[0], thumbnails[0])]:
        for kind, make in copies.items():
            assert perceptual_hash.thumbnail_distance(thumbnail, _thumbnail(make(image))) \
                <= perceptual_hash.MAX_THUMBNAIL_DISTANCE, kind


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_the_validation_takes_the_hash_and_the_thumbnail_in_one_product_as_each_alone_gives_them(photos):
    """``signature_of_scaled`` (what every validated image pays) is ``of_scaled`` and ``thumbnail_of_scaled``
    in one pair of products: the same bits and the same cells, on photos at many sizes, in RGB and gray."""
    rng = np.random.default_rng(5)
    checked = 0
    for photo in photos:
        for width in rng.integers(8, 220, size=6).tolist():
            image = photo.resize((width, max(8, int(width * rng.uniform(0.5, 1.6)))))
            for pixels in (np.asarray(image), np.asarray(image.convert("L"))):
                assert perceptual_hash.signature_of_scaled(pixels) == (
                    perceptual_hash.of_scaled(pixels), perceptual_hash.thumbnail_of_scaled(pixels))
                checked += 1
    assert checked >= 60


def test_a_batch_of_images_signs_each_as_it_is_signed_alone(photos):
    """``signatures_of_scaled`` (the validation signs a part's images a batch at a time) gives each image the bits
    and cells ``signature_of_scaled`` gives it alone, whatever else is in the batch: shapes repeated and not,
    RGB and gray, flat images, a batch of one."""
    rng = np.random.default_rng(11)
    images = []
    for photo in photos:
        for width in rng.integers(8, 120, size=4).tolist():
            image = photo.resize((width, max(8, int(width * rng.uniform(0.5, 1.6)))))
            images += [np.asarray(image), np.asarray(image.convert("L")), np.asarray(image.resize((8, 8)))]
    images += [np.full((40, 50, 3), value, dtype=np.uint8) for value in (0, 7, 255)]
    alone = [perceptual_hash.signature_of_scaled(pixels) for pixels in images]
    assert perceptual_hash.signatures_of_scaled(images) == alone
    order = rng.permutation(len(images)).tolist()
    assert perceptual_hash.signatures_of_scaled([images[i] for i in order]) == [alone[i] for i in order]
    assert perceptual_hash.signatures_of_scaled(images[:1]) == alone[:1]
    assert perceptual_hash.signatures_of_scaled([]) == []


@pytest.mark.parametrize("noise", [0, 1])
def test_a_flat_image_hashes_the_same_whatever_order_its_sums_take(noise):
    """A flat image's 64 coefficients are rounding noise about zero: their signs must not decide its hash (the
    order of a product's sums differs between BLAS builds and CPUs), nor may a pixel of noise make it random."""
    rng = np.random.default_rng(noise)
    for _ in range(60):
        height, width = rng.integers(8, 300, size=2).tolist()
        pixels = np.full((height, width, 3), rng.integers(0, 256, size=3), dtype=np.uint8)
        if noise:
            pixels = np.clip(pixels.astype(int) + rng.integers(-1, 2, size=pixels.shape), 0, 255).astype(np.uint8)
        alone, joined = perceptual_hash.of_scaled(pixels), perceptual_hash.signature_of_scaled(pixels)[0]
        assert alone == joined
        if not noise:  # only the mean (the first coefficient) is above the median: the top bit, unless black
            assert alone == (1 << 63 if pixels.any() else 0)
            assert perceptual_hash.of_scaled(np.ascontiguousarray(pixels[::-1, ::-1])) == alone

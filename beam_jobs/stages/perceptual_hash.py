"""A 64-bit perceptual hash of an image (a DCT hash), and the bands that find near pairs by exact matches.

In:  pixels the validation decoded anyway: the 1/8-scale decode that checks a JPEG stored as it is
     (``simplejpeg``'s array: :func:`of_scaled`), or the decoded image of one that is re-encoded (a Pillow
     image: :func:`of_image`, which first averages it in blocks, as that decode does).
Out: an ``int`` in ``[0, 2**64)``; :func:`distance` (Hamming); :func:`bands` and :func:`band_values`,
     the cut of the 64 bits into ``d + 1`` disjoint bands by which the near search finds every pair within
     distance ``d`` (two hashes differing in at most ``d`` bits agree exactly on at least one band:
     pigeonhole).

The hash is the DCT hash (pHash as the ``imagehash`` library computes it): the image in gray, averaged
down to 32x32, its 2-D DCT-II, the 8x8 lowest frequencies, each bit set when its coefficient is above
their median. It survives resizing, JPEG re-encoding and small crops (``bench/near_duplicates.py``
measures how far); it does not claim flips or rotations (a flipped image is another image to it).

Which pixels: libjpeg's 1/8-scale decode gives each 8x8 block's mean (its DCT's DC term), so that is what
every image is hashed from: a JPEG stored as it is from the check's own decode (no second decode), any
other image from its decoded pixels averaged in 8x8 blocks. An image under 256 px a side is scaled less
(:func:`scaled_size`: the smallest n/8 keeping 32 px, as libjpeg's check decodes such a JPEG, a small
image's cheap decode), so its hash is taken from at least 32x32 pixels. The DCT hash's bits near the
median flip under small changes of the pixels: the same picture decoded two ways (a 320 px photo's scaled
decode and its full decode averaged down) hashes 0-8 bits apart, most often 0-2, a 100 px one up to 10
(``tests/beam_jobs/stages/test_perceptual_hash.py``); the default distance (10) allows for most of it, and
``bench/near_duplicates.py`` measures what it finds.
"""

from __future__ import annotations

import functools
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
from PIL import Image

SIDE = 32  # the gray image the DCT runs on
LOW = 8  # the 8x8 lowest frequencies: 64 bits
BITS = LOW * LOW
MAX_DISTANCE = 12  # the bands of a larger distance are too few bits: every band's bucket would hold too many


@functools.lru_cache(maxsize=1)
def _dct_matrix() -> np.ndarray:
    """The orthonormal DCT-II rows 0..LOW-1 of length SIDE: ``M @ x @ M.T`` is the low corner of the 2-D DCT."""
    n = np.arange(SIDE)
    k = np.arange(LOW)[:, None]
    matrix = np.cos(np.pi * (2 * n + 1) * k / (2 * SIDE)) * np.sqrt(2.0 / SIDE)
    matrix[0] /= np.sqrt(2.0)
    return matrix


def scaled_size(width: int, height: int) -> tuple[int, int]:
    """The size libjpeg's check decodes a ``width`` x ``height`` JPEG at, which every image's hash is taken at:
    the smallest of its scales n/8 (n = 1..8, sides rounded up) keeping both sides >= SIDE px; 1/8 for any
    image of 256 px or more a side."""
    for eighths in range(1, 8):
        size = (-(-width * eighths // 8), -(-height * eighths // 8))
        if min(size) >= SIDE:
            return size
    return width, height


def of_image(image: Image.Image) -> int:
    """The hash of a decoded image at full scale (mode ``RGB`` or ``L``; others are converted first): averaged
    down to :func:`scaled_size` (8x8 block means when it is 1/8, as a 1/8-scale JPEG decode gives them)."""
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    size = scaled_size(*image.size)
    if size == (-(-image.width // 8), -(-image.height // 8)):
        image = image.reduce(8)
    elif size != image.size:
        image = image.resize(size, Image.Resampling.BOX)
    return of_scaled(np.asarray(image))


def of_scaled(pixels: np.ndarray) -> int:
    """The hash of a scaled decode's pixels (:func:`scaled_size`): ``(H, W, 3)`` RGB or ``(H, W)`` / ``(H, W, 1)``
    gray, uint8.

    In gray (ITU-R 601 weights, as Pillow's ``L``), averaged to SIDE x SIDE by area and the low corner of its
    DCT taken in one product, ``A @ gray @ B.T``, whose matrices depend on the size only (cached): a few
    microseconds of arithmetic on the 1/8-scale pixels.
    """
    height, width = pixels.shape[:2]
    if pixels.ndim == 3 and pixels.shape[2] == 3:  # the gray weights folded into the columns' matrix
        low = _low_rows(height) @ (pixels.reshape(height, width * 3) @ _low_columns_rgb(width))
    else:
        low = _low_rows(height) @ pixels.reshape(height, width) @ _low_rows(width).T
    return _bits(low.ravel())


_GRAY = np.array([0.299, 0.587, 0.114])


@functools.lru_cache(maxsize=1024)
def _low_rows(length: int) -> np.ndarray:
    """``(LOW, length)``: the area average of ``length`` samples down (or up) to SIDE, then the DCT's first rows."""
    edges = np.arange(SIDE + 1) * (length / SIDE)
    starts, stops = edges[:-1, None], edges[1:, None]
    samples = np.arange(length)[None, :]
    overlap = np.clip(np.minimum(stops, samples + 1) - np.maximum(starts, samples), 0, None)
    return _dct_matrix() @ (overlap / (length / SIDE))


@functools.lru_cache(maxsize=1024)
def _low_columns_rgb(width: int) -> np.ndarray:
    """``(width * 3, LOW)``: :func:`_low_rows` of the columns, transposed, with the gray weights of each channel."""
    return np.einsum("kw,c->wck", _low_rows(width), _GRAY).reshape(width * 3, LOW)


# --- the thumbnail that verifies a candidate pair -----------------------------------------------------------------
# The 64-bit hash is of the layout of light at its lowest frequencies: photos of one scene with another object in
# it (other shoes on one patterned cloth under a fixed camera) hash a few bits apart, as copies do. Each pair the
# bands find is checked on an 8x8 gray thumbnail of the same pixels (64 bytes): a copy (resized, re-encoded,
# brighter, darker, another contrast or colour balance) differs a little everywhere, another object a lot where
# it is. Measured on the photos scikit-image and scikit-learn ship (tests/beam_jobs/stages/test_perceptual_hash.py,
# docs/benchmarks.md): copies' :func:`thumbnail_distance` at most 0.28, other objects on one background 0.37 and
# more when they fill a sixth of the frame or more (smaller ones, 0.18 and up, are not told apart).
THUMB = 8
THUMB_BYTES = THUMB * THUMB
MAX_THUMBNAIL_DISTANCE = 0.32
_WORST_CELLS = 8  # the mean of the 8 cells (an eighth of the frame) that differ most
_FLAT = 8.0  # added to the thumbnail's spread: a flat image's noise is not blown up to a pattern


@functools.lru_cache(maxsize=1024)
def _area(length: int) -> np.ndarray:
    """``(THUMB, length)``: each of THUMB cells the area average of its share of ``length`` samples."""
    edges = np.arange(THUMB + 1) * (length / THUMB)
    starts, stops = edges[:-1, None], edges[1:, None]
    samples = np.arange(length)[None, :]
    return np.clip(np.minimum(stops, samples + 1) - np.maximum(starts, samples), 0, None) / (length / THUMB)


def thumbnail_of_scaled(pixels: np.ndarray) -> bytes:
    """The 8x8 gray thumbnail (area means, ITU-R 601 weights, uint8, row by row) of a scaled decode's pixels, as
    :func:`of_scaled` takes them."""
    height, width = pixels.shape[:2]
    gray = pixels.reshape(height, width, -1) @ (_GRAY if pixels.ndim == 3 and pixels.shape[2] == 3 else np.ones(1))
    cells = _area(height) @ gray @ _area(width).T
    return np.clip(np.rint(cells), 0, 255).astype(np.uint8).tobytes()


@functools.lru_cache(maxsize=1024)
def _signature_rows(length: int) -> np.ndarray:
    """``(LOW + THUMB, length)``: :func:`_low_rows` over :func:`_area`, so one product gives both."""
    return np.vstack([_low_rows(length), _area(length)])


@functools.lru_cache(maxsize=1024)
def _signature_columns(width: int, channels: int) -> np.ndarray:
    """``(width * channels, LOW + THUMB)``: :func:`_signature_rows` of the columns, transposed, with the gray
    weights of each channel folded in when there are three."""
    rows = _signature_rows(width)
    if channels == 3:
        return np.einsum("kw,c->wck", rows, _GRAY).reshape(width * 3, LOW + THUMB)
    return np.ascontiguousarray(rows.T)


def signature_of_scaled(pixels: np.ndarray) -> tuple[int, bytes]:
    """``(of_scaled(pixels), thumbnail_of_scaled(pixels))`` in one pair of matrix products, as the validation
    takes them for every image (#56 §5: the two apart, with their clipping, cost a tiny image's conversion 15%).

    The products' low corner is the DCT's, their high corner the thumbnail's cells: the same sums in another
    order, so a coefficient may differ from :func:`of_scaled`'s in its last bits, which :func:`_bits` rounds
    away (a flat image's hash is its mean's bit alone, 1 << 63, either way).
    The thumbnail needs no clipping: area means of uint8 lie in [0, 255].
    """
    return signatures_of_scaled([pixels])[0]


def signatures_of_scaled(images: Sequence[np.ndarray]) -> list[tuple[int, bytes]]:
    """:func:`signature_of_scaled` of many scaled decodes at once, bit for bit (#56 §5: one image at a time, numpy's
    cost per call was most of a tiny image's 40-90 us of hashing; a part's images are hashed in batches).

    Images of one shape are stacked: ``np.matmul`` runs one matrix product per image of the stack, the same one
    (shapes, operands) as a single image's, so every coefficient is the same double; the median test, the bits
    and the thumbnails' rounding are per image whatever the batch. The results do not depend on what is batched
    with what.
    """
    by_shape: dict[tuple, list[int]] = {}
    for index, pixels in enumerate(images):
        by_shape.setdefault(pixels.shape, []).append(index)
    order: list[int] = []
    lows, cells = [], []
    for shape, indices in by_shape.items():
        height, width = shape[:2]
        channels = 3 if len(shape) == 3 and shape[2] == 3 else 1
        stack = np.stack([images[index].reshape(height, width * channels) for index in indices])
        both = _signature_rows(height) @ (stack @ _signature_columns(width, channels))
        lows.append(both[:, :LOW, :LOW].reshape(len(indices), BITS))
        cells.append(both[:, LOW:, LOW:].reshape(len(indices), THUMB_BYTES))
        order += indices
    if not order:
        return []
    hashes = _bits_of_rows(np.concatenate(lows))
    thumbnails = np.rint(np.concatenate(cells)).astype(np.uint8)
    signatures: list = [None] * len(order)
    for row, index in enumerate(order):
        signatures[index] = (hashes[row], thumbnails[row].tobytes())
    return signatures


def thumbnail_of_image(image: Image.Image) -> bytes:
    """:func:`thumbnail_of_scaled` of a decoded image at full scale (as :func:`of_image` scales it first)."""
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    return thumbnail_of_scaled(np.asarray(image.reduce(8) if min(image.size) >= 8 * THUMB else image))


def standardized(thumbnails: np.ndarray) -> np.ndarray:
    """``(n, 64)`` uint8 thumbnails, each with its mean off and divided by its spread plus a little (so brightness
    and contrast do not count), as float32: what :func:`standardized_distances` compares."""
    cells = thumbnails.astype(np.float32)
    return (cells - cells.mean(axis=1, keepdims=True)) / (cells.std(axis=1, keepdims=True) + _FLAT)


def standardized_distances(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``(n,)`` distances of :func:`standardized` thumbnails row by row: the mean of the 8 cells that differ most."""
    worst = np.partition(np.abs(left - right), THUMB_BYTES - _WORST_CELLS, axis=1)[:, THUMB_BYTES - _WORST_CELLS:]
    return worst.mean(axis=1)


def thumbnail_distances(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``(n,)`` distances of ``(n, 64)`` uint8 thumbnails row by row (:func:`standardized_distances`)."""
    return standardized_distances(standardized(left), standardized(right))


def verified_pairs(pairs: Iterable[np.ndarray], thumbnails: np.ndarray,
             column_thumbnails: Optional[np.ndarray] = None, kept: Optional[np.ndarray] = None,
             column_kept: Optional[np.ndarray] = None) -> Iterator[np.ndarray]:
    """The pairs (``(2, k)`` record indices) whose thumbnails (``(n, 64)`` uint8, by record; the second of each
    pair's from ``column_thumbnails`` when given) agree: within :data:`MAX_THUMBNAIL_DISTANCE`,
    as copies are and other photos of one scene are not.

    ``kept`` (bool by record; the second's from ``column_kept``): an update's kept records, which have no
    thumbnail (none was kept). A pair of a kept record and another is kept on its hash distance alone (the
    leak an update must see: a new validation image near an old training one); a pair of two kept records is
    left out (the version that converted them searched them with their thumbnails).

    Each block's rows are standardized as it comes (each row alone: the same values as all at once), not the
    range's records all at once up front: that was 256 bytes of float32 a record, a fifth of a range task's
    memory, for the few records in a pair (#56 §1: a task within the part size's budget)."""
    columns = thumbnails if column_thumbnails is None else column_thumbnails
    for block in pairs:
        keep = np.concatenate([
            thumbnail_distances(thumbnails[block[0, start:start + _VERIFY_BATCH]],
                                                columns[block[1, start:start + _VERIFY_BATCH]])
            <= MAX_THUMBNAIL_DISTANCE
            for start in range(0, block.shape[1], _VERIFY_BATCH)]) if block.shape[1] else np.zeros(0, dtype=bool)
        if kept is not None:
            rows, cols = kept[block[0]], (kept if column_kept is None else column_kept)[block[1]]
            keep = np.where(rows | cols, rows ^ cols, keep)
        if keep.any():
            yield block[:, keep]


_VERIFY_BATCH = 1 << 16  # pairs whose thumbnails are compared at once: about 50 MB of float32 rows


def thumbnail_distance(left: bytes, right: bytes) -> float:
    """:func:`thumbnail_distances` of two thumbnails."""
    return float(thumbnail_distances(np.frombuffer(left, np.uint8)[None], np.frombuffer(right, np.uint8)[None])[0])


# Coefficients are rounded to this many decimals before the median test: a flat image's are all rounding noise
# (about 1e-13) but the mean's, whose signs the order of the floating-point sums decides (another BLAS, CPU or
# product order: another hash); rounded, they are all 0 and its hash is 1 << 63 everywhere (0 when black). A
# photo's coefficients differ by far more than the rounding.
_DECIMALS = 6


def _bits(low: np.ndarray) -> int:
    """Bit ``i`` (from the top) set where coefficient ``i`` is above the 64 coefficients' median."""
    return _bits_of_rows(low.reshape(1, BITS))[0]


def _bits_of_rows(low: np.ndarray) -> list[int]:
    """:func:`_bits` of each row of ``(n, 64)`` coefficients."""
    low = np.round(low, _DECIMALS)
    middle = np.partition(low, (BITS // 2 - 1, BITS // 2), axis=1)  # np.median, ten times faster on 64 values
    bits = low > (middle[:, BITS // 2 - 1:BITS // 2] + middle[:, BITS // 2:BITS // 2 + 1]) / 2
    return np.packbits(bits, axis=1).view(">u8").ravel().tolist()


@functools.lru_cache(maxsize=None)
def band_masks(max_distance: int) -> tuple[int, ...]:
    """Each band of :func:`bands` as a mask of the hash's bits: two hashes agree on band ``b`` when
    ``(a ^ b) & mask == 0``. Cached: the near search asks for them once a band value."""
    return tuple(sum(1 << (BITS - 1 - position) for position in positions) for positions in bands(max_distance))


def distance(a: int, b: int) -> int:
    """Bits in which two hashes differ (Hamming distance)."""
    return (a ^ b).bit_count()


def bands(max_distance: int) -> tuple[tuple[int, ...], ...]:
    """The 64 bit positions cut into ``max_distance + 1`` disjoint bands, bit ``i`` in band ``i % bands``.

    Interleaved, not contiguous: neighbouring DCT coefficients are correlated, so a band of spread-out
    bits splits the images more evenly (smaller buckets to compare within).
    """
    if not 0 <= max_distance <= MAX_DISTANCE:
        raise ValueError(f"a near-duplicate distance must be in 0..{MAX_DISTANCE}, got {max_distance}")
    count = max_distance + 1
    return tuple(tuple(range(band, BITS, count)) for band in range(count))


def expected_candidates(images: int, max_distance: int) -> float:
    """The pairs the band search compares among ``images`` hashes spread evenly: two images share band ``b``'s
    value with probability ``2**-bits(b)``, so about ``images**2 / 2 * sum(2**-bits(b))``. Quadratic in ``images``:
    at 3 (four 16-bit bands) 1e9 at 10M images; at 10 (eleven 5-6 bit bands) about ``images**2 / 10``. Alike
    photos (one scene, one background) share values more often than this."""
    return images * (images - 1) / 2 * sum(2.0 ** -len(band) for band in bands(max_distance))


MAX_COMPARISONS_PER_IMAGE = 256  # what --near-distance auto allows: about a microsecond of numpy an image


def auto_distance(images: int, widest: int) -> int:
    """The widest distance up to ``widest`` whose search compares at most MAX_COMPARISONS_PER_IMAGE pairs an
    image among ``images`` evenly spread hashes (:func:`expected_candidates`), so the search is linear in N:
    at ``widest`` 3, 3 up to 8.4 million images, 2 up to 430 million, 1 up to about a trillion."""
    for distance in range(widest, 0, -1):
        if expected_candidates(images, distance) <= MAX_COMPARISONS_PER_IMAGE * images:
            return distance
    return 0


def band_values(hashes: Sequence[int], cut: Sequence[Sequence[int]]) -> np.ndarray:
    """``(len(hashes), len(cut))`` uint64: each hash's value on each band (its bits there, high bit first)."""
    array = hashes.astype(np.uint64).reshape(-1) if isinstance(hashes, np.ndarray) \
        else np.asarray(list(hashes), dtype=np.uint64).reshape(-1)
    values = np.zeros((array.size, len(cut)), dtype=np.uint64)
    for column, positions in enumerate(cut):
        for position in positions:  # bit i of the hash is 2**(63 - i): the first coefficient is the top bit
            bit = (array >> np.uint64(BITS - 1 - position)) & np.uint64(1)
            values[:, column] = (values[:, column] << np.uint64(1)) | bit
    return values


def pairwise_distances(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``(len(left), len(right))`` Hamming distances of two uint64 arrays of hashes."""
    return np.bitwise_count(left[:, None] ^ right[None, :])

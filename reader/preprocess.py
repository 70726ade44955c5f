"""Decode and preprocess one image: the training and eval presets.

Both crop before decoding: ``tf.image.decode_and_crop_jpeg`` decodes only the
MCU rows and columns the crop needs, so cost follows the crop, not the full
image. When the crop is at least twice the output size, JPEGs are also
decoded at 1/2, 1/4 or 1/8 scale (libjpeg scales while it decodes, skipping
most of the inverse DCT and colour work), which also filters better than a
bilinear resize that skips pixels. Randomness is stateless and seeded per example, so a seeded pipeline
gives identical batches on every run even with parallel, non-deterministic
map scheduling (tensorflow/tensorflow#44491).

Images come out as ``dtype`` in 0..255 (Keras' ``image_dataset_from_directory``
convention), or normalised when asked.
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from reader.options import IMAGENET_MEAN, IMAGENET_STD, Augmentation


def _decode_any(data: tf.Tensor) -> tf.Tensor:
    """Full decode of a non-JPEG record (PNG, GIF... in foreign shards) to uint8 RGB."""
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def random_crop_window(shape: tf.Tensor, seed: tf.Tensor, augment: Augmentation) -> tf.Tensor:
    """A random-resized-crop window ``[y, x, height, width]`` for an image of ``shape`` (h, w, c).

    Sampled by ``stateless_sample_distorted_bounding_box``; for JPEG the shape
    comes from the header (``extract_jpeg_shape`` reads no pixels).
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        seed=seed,
        min_object_covered=augment.area_range[0],
        aspect_ratio_range=augment.aspect_ratio_range,
        area_range=augment.area_range,
        max_attempts=augment.max_attempts,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def center_crop_window(shape: tf.Tensor, crop_fraction: float) -> tf.Tensor:
    """The centred square window covering ``crop_fraction`` of the shorter side of ``shape`` (h, w, c)."""
    height, width = shape[0], shape[1]
    side = tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side) // 2, (width - side) // 2, side, side])


# The scales libjpeg decodes at (``ratio`` of the decode ops): 1/1, 1/2, 1/4, 1/8.
JPEG_RATIOS = (1, 2, 4, 8)


def decode_jpeg_window(data: tf.Tensor, window: tf.Tensor, scale_to: Optional[tuple[int, int]] = None) -> tf.Tensor:
    """Decode the ``window`` [y, x, height, width] of a JPEG to uint8 RGB.

    With ``scale_to`` (height, width; ints or an int32 tensor [2]), decode at the
    smallest scale 1/r (r in 2, 4, 8) that still leaves the crop at least ``scale_to``, so the resize
    that follows still shrinks. The window is in full-size pixels; libjpeg
    takes it in scaled pixels (rounded down).
    """
    if scale_to is None:
        return tf.image.decode_and_crop_jpeg(data, window, channels=3)
    window = tf.convert_to_tensor(window, tf.int32)
    fits = tf.reduce_min(window[2:] // tf.convert_to_tensor(scale_to, tf.int32))  # whole outputs across the crop
    index = tf.reduce_sum(tf.cast(fits >= tf.constant(JPEG_RATIOS[1:]), tf.int32))

    def at(ratio: int) -> Callable[[], tf.Tensor]:
        # The scaled window is made inside its branch: only the branch taken computes one (a record paid
        # for all four, 20 small ops, when they were made before the choice).
        return lambda: tf.image.decode_and_crop_jpeg(data, window // ratio if ratio > 1 else window, channels=3,
                                                     ratio=ratio)

    return tf.switch_case(index, [at(ratio) for ratio in JPEG_RATIOS])


def crop_and_decode(
    data: tf.Tensor, window_fn: Callable[[tf.Tensor], tf.Tensor], all_jpeg: bool, scale_to: Optional[tuple[int, int]]
) -> tf.Tensor:
    """Crop-before-decode for JPEG; full decode then slice for other formats.

    ``window_fn`` maps an image shape (h, w, c) to a window [y, x, height, width].
    ``all_jpeg`` skips the per-record format check (a conditional costs about
    3% of a record's decode time), for datasets known to hold only JPEGs.
    ``scale_to``: see :func:`decode_jpeg_window`.
    """

    def jpeg() -> tf.Tensor:
        window = window_fn(tf.image.extract_jpeg_shape(data))
        return decode_jpeg_window(data, window, scale_to)

    def other() -> tf.Tensor:
        image = _decode_any(data)
        y, x, h, w = tf.unstack(window_fn(tf.shape(image)))
        return image[y : y + h, x : x + w]

    image = jpeg() if all_jpeg else tf.cond(tf.io.is_jpeg(data), jpeg, other)
    image.set_shape([None, None, 3])
    return image


def train_image(
    data: tf.Tensor,
    seed: tf.Tensor,
    size: tuple[int, int],
    augment: Augmentation,
    all_jpeg: bool = False,
    scaled_decode: bool = True,
) -> tf.Tensor:
    """Training preset: random resized crop (decoded cropped) + random flip, resized to ``size``; float32.

    ``scaled_decode``: decode large crops at reduced scale (False when no image
    is large enough, which saves the choice per record).
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    image = crop_and_decode(data, lambda shape: random_crop_window(shape, crop_seed, augment), all_jpeg,
                             size if scaled_decode else None)
    image = tf.image.resize(image, size, method="bilinear")
    # Flipped after the resize (a mirror commutes with it): the output usually has fewer pixels than
    # the crop, and the flip (a conditional and a copy) cost 10% of a 300-500 px decode before it, 7% after.
    if augment.flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return image


def eval_image(
    data: tf.Tensor, size: tuple[int, int], crop_fraction: float, all_jpeg: bool = False, scaled_decode: bool = True
) -> tf.Tensor:
    """Eval preset: centre crop (decoded cropped) resized to ``size``; float32 (``scaled_decode`` as in training)."""
    image = crop_and_decode(data, lambda shape: center_crop_window(shape, crop_fraction), all_jpeg,
                             size if scaled_decode else None)
    return tf.image.resize(image, size, method="bilinear")


def finish(image: tf.Tensor, dtype: tf.DType, normalization: Optional[str]) -> tf.Tensor:
    """Normalise (optional) and cast a float32 0..255 image."""
    if normalization == "mobilenet":
        image = image / 127.5 - 1.0
    elif normalization == "imagenet":
        image = (image - tf.constant(IMAGENET_MEAN)) / tf.constant(IMAGENET_STD)
    if dtype == tf.uint8:
        return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    return tf.cast(image, dtype)

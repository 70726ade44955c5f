"""The reader on segmentation and multi-label datasets: masks move with the pixels; labels become multi-hot.

Detection has its own module (``test_objects.py``). The datasets are converted in-process from generated
trees (``tests/object_data.py``): red rectangles on gray noise, the mask's class ids on the red pixels.
"""

from __future__ import annotations

import numpy as np
import pytest

import reader
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.object_data import class_mask_png, jpeg, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
SEGMENTS = [(120, 90, (10, 10, 60, 50), 1), (90, 140, (30, 60, 90, 140), 2), (160, 100, (0, 40, 70, 100), 1),
            (100, 100, (20, 20, 80, 80), 2)]
TAGS = {"a": "clear primary", "b": "water", "c": "", "d": "clear water haze", "e": "primary", "f": "haze"}


@pytest.fixture(scope="module")
def segmentation_dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("segments")
    for index, (width, height, box, class_id) in enumerate(SEGMENTS):
        for split in ("training", "validation"):
            write_file(str(root / f"src/images/{split}/{index}.jpg"), jpeg(picture(width, height, [box], seed=index)))
            write_file(str(root / f"src/annotations/{split}/{index}.png"), class_mask_png(width, height, box, class_id))
    write_file(str(root / "labels.txt"), "background\nroad\ncar\n")
    out = str(root / "ds")
    run(ConvertOptions(src=str(root / "src"), out=out, shards=1, labels_file=str(root / "labels.txt")), FAST,
        show_progress=False)
    return out


def _check_mask_on_its_pixels(image: np.ndarray, mask: np.ndarray) -> None:
    pixels = image.astype(int)
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)
    labelled = np.isin(mask[..., 0], (1, 2))
    if labelled.sum() > 50:
        assert red[labelled].mean() > 0.9
    if red.sum() > 50:
        assert labelled[red].mean() > 0.9
    padded = mask[..., 0] == 255
    assert not image[padded].any(), "padded pixels are 0 in the image and 255 (ignored) in the mask"


@pytest.mark.slow
def test_masks_are_cropped_resized_and_flipped_with_their_pixels(segmentation_dataset):
    augment = reader.BoxAugmentation(scale_range=(0.5, 2.0))
    dataset = reader.build_dataset(segmentation_dataset, "train", batch_size=2, image_size=(64, 80), seed=4,
                                   augment=augment, num_epochs=5)
    padded = 0
    for images, masks in dataset:
        assert images.shape == (2, 64, 80, 3) and masks.shape == (2, 64, 80, 1) and masks.dtype == "int32"
        for image, mask in zip(images.numpy(), masks.numpy()):
            _check_mask_on_its_pixels(image, mask)
            padded += int((mask == 255).any())
    assert padded > 0, "some draws scale the image under the output size"
    evaluation = reader.build_dataset(segmentation_dataset, "validation", batch_size=4, image_size=64, training=False)
    images, masks = next(iter(evaluation))
    for image, mask in zip(images.numpy(), masks.numpy()):
        _check_mask_on_its_pixels(image, mask)
    assert sorted(np.unique(masks.numpy())) == [0, 1, 2, 255]


@pytest.fixture(scope="module")
def multilabel_dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tags")
    for index, name in enumerate(TAGS):
        write_file(str(root / "src" / f"{name}.jpg"), jpeg(picture(40, 30, [], seed=index)))
    write_file(str(root / "tags.csv"), "image_name,tags\n" + "".join(f"{name},{tags}\n" for name, tags in TAGS.items()))
    out = str(root / "ds")
    run(ConvertOptions(src=str(root / "src"), out=out, shards=1, annotations=str(root / "tags.csv"),
                       annotation_columns=("image_name", "tags"), label_separator=" "), FAST, show_progress=False)
    return out


@pytest.mark.slow
def test_several_labels_become_multi_hot_vectors_a_sigmoid_head_fits_on(multilabel_dataset):
    import keras

    info = reader.dataset_info(multilabel_dataset)
    assert info.classes == ("clear", "haze", "primary", "water")
    evaluation = reader.build_dataset(multilabel_dataset, "train", batch_size=6, image_size=32, training=False)
    _, hot = next(iter(evaluation))
    assert hot.shape == (6, 4) and hot.dtype == "float32"
    assert sorted(map(tuple, hot.numpy().tolist())) == sorted(
        tuple(float(name in tags.split()) for name in info.classes) for tags in TAGS.values())
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Conv2D(4, 3),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4, activation="sigmoid")])
    model.compile("adam", keras.losses.BinaryCrossentropy(), metrics=[keras.metrics.AUC(multi_label=True)])
    train = reader.build_dataset(multilabel_dataset, "train", batch_size=3, image_size=32, seed=0)
    history = model.fit(train, steps_per_epoch=2, epochs=2, verbose=0)
    assert all(np.isfinite(history.history["loss"]))

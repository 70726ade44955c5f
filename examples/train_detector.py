"""Train a small object detector on a converted dataset of objects, fed by ``reader``, and score it with COCOeval.

KerasHub's ``RetinaNetObjectDetector`` on a small ResNet, randomly initialized
(nothing to download), learns the demo's shapes on a CPU: with the defaults (40 epochs of 15 steps at
128 px), in about 7 minutes on 2 cores, to AP50 0.29, AP 0.10 and AR@100 0.31 on the 60 validation
images (after 12 epochs it had found almost nothing: AR@100 0.02)::

    pip install ".[detection]"
    python -m converter.demo --objects coco demo/objects && python -m converter --src demo/objects --overwrite
    python examples/train_detector.py --data demo/objects-tfrecords

The training batches are ``reader.build_dataset``'s: images with
``{"boxes", "labels"}`` targets in KerasHub's format, boxes moved with the
pixels under scale jitter, crop and flip. Evaluation reads the validation
split resized with padding, maps the predicted boxes back to each stored image
(``reader.boxes_to_source``) and scores them with pycocotools' ``COCOeval``
against the split's own boxes: mean average precision over IoU 0.5:0.95 and
at IoU 0.5, and recall at 100 detections, printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

import reader  # first: TensorFlow then loads without its start-up lines (reader.quiet_start)  # isort: skip
import numpy as np
import tensorflow as tf

import record_schema


def build_detector(num_classes: int):
    """RetinaNet on a ResNet of one basic block a stage (64 filters), pyramid levels 3-4, anchors of 24-75 px."""
    import keras
    from keras_hub.layers import AnchorGenerator, NonMaxSuppression
    from keras_hub.models import ResNetBackbone, RetinaNetBackbone, RetinaNetObjectDetector

    encoder = ResNetBackbone(input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 64, 64],
                             stackwise_num_blocks=[1, 1, 1], stackwise_num_strides=[1, 2, 2],
                             image_shape=(None, None, 3), block_type="basic_block", use_pre_activation=False)
    backbone = RetinaNetBackbone(image_encoder=encoder, min_level=3, max_level=4, use_p5=False)
    anchors = AnchorGenerator(bounding_box_format="yxyx", min_level=3, max_level=4, num_scales=3,
                              aspect_ratios=[0.5, 1.0, 2.0], anchor_size=3)
    # Detections down to a confidence of 0.05, as COCO evaluations keep them (KerasHub's default is 0.5).
    decoder = NonMaxSuppression(bounding_box_format="yxyx", from_logits=True, confidence_threshold=0.05)
    model = RetinaNetObjectDetector(backbone=backbone, anchor_generator=anchors, num_classes=num_classes,
                                    bounding_box_format="yxyx", prediction_decoder=decoder)
    model.compile(optimizer=keras.optimizers.Adam(1e-3, global_clipnorm=10.0))
    return model


def evaluate(model, data: str, image_size: int, batch_size: int, classes: Sequence[str]) -> dict:
    """COCOeval's AP, AP50 and AR@100 of ``model`` on the validation split, in each stored image's pixels."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    dataset = reader.build_dataset(data, "validation", batch_size, image_size, training=False,
                                   normalization="mobilenet", targets=reader.ObjectTargets(source_size=True))
    images, truth, found = [], [], []
    for batch, targets in dataset:
        # Eagerly: KerasHub's non-max suppression needs the batch size, which a traced predict() leaves unknown.
        predicted = model.decode_predictions(model(batch, training=False), (batch, None))
        sizes = targets["source_size"]
        boxes = reader.boxes_to_source(targets["boxes"], sizes, image_size).numpy()
        guesses = reader.boxes_to_source(predicted["boxes"], sizes, image_size).numpy()
        for row in range(int(batch.shape[0])):
            image_id = len(images) + 1
            height, width = (int(v) for v in sizes[row].numpy())
            images.append({"id": image_id, "height": height, "width": width})
            for box, label in zip(boxes[row], targets["labels"][row].numpy()):
                if label >= 0:
                    truth.append(_coco_box(box, int(label), image_id, id=len(truth) + 1, iscrowd=0))
            count = int(predicted["num_detections"][row])
            for box, label, score in list(zip(guesses[row], predicted["labels"][row], predicted["confidence"][row]))[:count]:
                found.append(_coco_box(box, int(label), image_id, score=float(score)))
    ground = COCO()
    ground.dataset = {"images": images, "annotations": truth,
                      "categories": [{"id": i, "name": name} for i, name in enumerate(classes) if name]}
    ground.createIndex()
    if not found:
        return {"AP": 0.0, "AP50": 0.0, "AR100": 0.0, "images": len(images), "objects": len(truth)}
    evaluation = COCOeval(ground, ground.loadRes(found), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    stats = evaluation.stats
    return {"AP": round(float(stats[0]), 4), "AP50": round(float(stats[1]), 4), "AR100": round(float(stats[8]), 4),
            "images": len(images), "objects": len(truth)}


def _coco_box(box: np.ndarray, label: int, image_id: int, **extra) -> dict:
    ymin, xmin, ymax, xmax = (float(v) for v in box)
    return {"image_id": image_id, "category_id": label, "bbox": [xmin, ymin, xmax - xmin, ymax - ymin],
            "area": (xmax - xmin) * (ymax - ymin), **extra}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a converted dataset of objects (train and validation splits)")
    parser.add_argument("--epochs", type=int, default=40, help="(default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="(default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metrics-json", default=None, help="write the final metrics here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        info = reader.dataset_info(args.data)
    except (reader.DatasetNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if info.task != record_schema.TASK_OBJECTS or not {"train", "validation"} <= set(info.splits):
        print(f"error: {args.data} holds task {info.task!r} with splits {sorted(info.splits)}; this trains on "
              "objects with train and validation splits", file=sys.stderr)
        return 1
    tf.keras.utils.set_random_seed(args.seed)
    model = build_detector(info.num_classes)
    train = reader.build_dataset(info, "train", args.batch_size, args.image_size, seed=args.seed,
                                 normalization="mobilenet", num_epochs=args.epochs)
    steps = reader.steps_per_epoch(args.data, "train", args.batch_size)
    # shuffle=False: the reader shuffles; Keras's default True only warns that it ignores itself.
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps, shuffle=False, verbose=2)
    metrics = evaluate(model, args.data, args.image_size, args.batch_size, info.classes)
    metrics["loss"] = round(float(history.history["loss"][-1]), 4)
    print(json.dumps(metrics))
    if args.metrics_json:
        with open(args.metrics_json, "w", encoding="utf-8") as handle:
            json.dump(metrics, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())

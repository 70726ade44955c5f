"""Train a small object detector on a mixture of a COCO-style and a VOC-style dataset, and score it per source.

``reader.build_dataset(plan)`` gives every batch each source's exact share, their
classes met by name (``--rename motorbike=motorcycle``, ``--rename dog=`` drops
a class, ``--labels`` keeps only the listed ones), and evaluation says which
source each image came from, so AP is computed for each source on its own
(pycocotools' ``COCOeval``, in each stored image's pixels). The detector is
``examples/train_detector.py``'s KerasHub RetinaNet, randomly initialized::

    pip install ".[detection]"
    python -m converter.demo --objects coco demo/objects && python -m converter --src demo/objects --overwrite
    python -m converter.demo --objects yolo demo/objects-yolo && python -m converter --src demo/objects-yolo --overwrite
    python examples/train_mixture.py --source demo/objects-tfrecords:0.7 --source demo/objects-yolo-tfrecords:0.3

The mixture's label map is written beside the metrics (``--label-map DIR``)
in the OD API's format. Prints the metrics per source as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from typing import Optional, Sequence

import reader  # first: TensorFlow then loads without its start-up lines (reader.quiet_start)  # isort: skip
import tensorflow as tf

import record_schema

_DETECTOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_detector.py")


def _detector_example():
    """``examples/train_detector.py`` as a module: its detector and its COCO box conversion."""
    spec = importlib.util.spec_from_file_location("train_detector", _DETECTOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def evaluate_by_source(model, plan: "reader.Mixture", split: str, image_size: int, batch_size: int) -> dict:
    """COCOeval's AP, AP50 and AR@100 of ``model`` on each source's ``split``, scored apart."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    coco_box = _detector_example()._coco_box
    dataset = reader.build_dataset(plan, split, batch_size, image_size, training=False, normalization="mobilenet",
                                   targets=reader.ObjectTargets(source_size=True), with_source=True)
    per_source = {name: {"images": [], "truth": [], "found": []} for name in plan.names}
    for batch, targets, sources in dataset:
        predicted = model.decode_predictions(model(batch, training=False), (batch, None))
        sizes = targets["source_size"]
        boxes = reader.boxes_to_source(targets["boxes"], sizes, image_size).numpy()
        guesses = reader.boxes_to_source(predicted["boxes"], sizes, image_size).numpy()
        for row in range(int(batch.shape[0])):
            kept = per_source[plan.names[int(sources[row])]]
            image_id = len(kept["images"]) + 1
            height, width = (int(v) for v in sizes[row].numpy())
            kept["images"].append({"id": image_id, "height": height, "width": width})
            for box, label in zip(boxes[row], targets["labels"][row].numpy()):
                if label >= 0:
                    kept["truth"].append(coco_box(box, int(label), image_id, id=len(kept["truth"]) + 1, iscrowd=0))
            count = int(predicted["num_detections"][row])
            for box, label, score in list(zip(guesses[row], predicted["labels"][row],
                                              predicted["confidence"][row]))[:count]:
                kept["found"].append(coco_box(box, int(label), image_id, score=float(score)))
    categories = [{"id": i, "name": name} for i, name in enumerate(plan.classes) if name]
    return {name: _score(COCO, COCOeval, kept, categories) for name, kept in per_source.items()}


def _score(coco_type, eval_type, kept: dict, categories: list) -> dict:
    """AP, AP50, AR@100 of one source's detections (zeros when there are none)."""
    result = {"images": len(kept["images"]), "objects": len(kept["truth"])}
    if not kept["found"] or not kept["truth"]:
        return {"AP": 0.0, "AP50": 0.0, "AR100": 0.0, **result}
    ground = coco_type()
    ground.dataset = {"images": kept["images"], "annotations": kept["truth"], "categories": categories}
    ground.createIndex()
    evaluation = eval_type(ground, ground.loadRes(kept["found"]), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    stats = evaluation.stats
    return {"AP": round(float(stats[0]), 4), "AP50": round(float(stats[1]), 4), "AR100": round(float(stats[8]), 4),
            **result}


def _sources(values: Sequence[str]) -> list[tuple]:
    """``PATH:WEIGHT`` -> ``(PATH, WEIGHT)``."""
    found = []
    for value in values:
        path, _, weight = value.rpartition(":")
        try:
            found.append((path, float(weight)))
        except ValueError:
            raise SystemExit(f"error: --source {value!r} must be PATH:WEIGHT, e.g. demo/objects-tfrecords:0.7") from None
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", required=True, help="a converted dataset of objects and its "
                        "weight, PATH:WEIGHT (repeat for each source)")
    parser.add_argument("--rename", action="append", default=[], help="OLD=NEW renames a class, OLD= drops it")
    parser.add_argument("--labels", default=None, help="comma-separated classes to keep, in id order")
    parser.add_argument("--epochs", type=int, default=40, help="passes over the first source (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="(default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--eval-split", default="validation", help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label-map", default=None, help="write the mixture's label_map.pbtxt into this folder")
    parser.add_argument("--metrics-json", default=None, help="write the final metrics here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    rename = dict((old, new or None) for old, _, new in (item.partition("=") for item in args.rename))
    space = reader.LabelSpace(labels=args.labels.split(",") if args.labels else None, rename=rename)
    try:
        plan = reader.mixture(_sources(args.source), "train", args.batch_size, space)
    except (reader.DatasetNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if plan.task != record_schema.TASK_OBJECTS:
        print(f"error: the sources hold task {plan.task!r}; this trains a detector on objects", file=sys.stderr)
        return 1
    tf.keras.utils.set_random_seed(args.seed)
    model = _detector_example().build_detector(plan.num_classes)
    steps = plan.steps_for(1, plan.names[0])
    train = reader.build_dataset(plan, image_size=args.image_size, seed=args.seed, normalization="mobilenet",
                                 num_steps=args.epochs * steps)  # the plan's split and batch
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps, shuffle=False, verbose=2)
    metrics = {"sources": evaluate_by_source(model, plan, args.eval_split, args.image_size, args.batch_size),
               "loss": round(float(history.history["loss"][-1]), 4), "classes": list(plan.object_classes),
               "weights": dict(zip(plan.names, (round(w, 4) for w in plan.quotas.weights)))}
    if args.label_map:
        metrics["label_map"] = plan.write_label_map(args.label_map)
    print(json.dumps(metrics))
    if args.metrics_json:
        with open(args.metrics_json, "w", encoding="utf-8") as handle:
            json.dump(metrics, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.resume``: the resumable "streams" order against today's shuffle buffer, on the same shards.

    python -m bench.resume                         # about 20 minutes (12,000 photos: more records than a buffer)
    python -m bench.resume --photos 600 --tiny 5000 --rounds 2   # a quick look
    python -m bench.resume --photos 70 --tiny 400 --rounds 1 --batches 1 --latency-rounds 1 --shuffle-records 1000 \
        --batch 8 --quality-batch 64 --convert-in-process
                                                   # a smoke run (tests/bench/test_resume.py): the harness, no figures

Four things, each measured in this one run on the same data (issue #20):

- throughput: images/s of the training preset (224 px, batch 64, 300-500 px
  JPEG photos) in the "streams" order and in the "buffer" order (interleave +
  ``shuffle(10_000)``, the order of earlier versions), alternating in rounds,
  with and without a seed; and each one's peak RSS in a process of its own;
- resume latency: seconds from ``build_dataset(start=...)`` to the first batch
  at 1%, 50% and 99% of an epoch against a fresh start, with the record
  indexes and without them (a dataset written before indexes);
- state: the bytes of a position's JSON;
- shuffle quality, on records (no decoding) of a 100-class dataset of tiny
  JPEGs, batch 256: distinct shards and label entropy per batch for both
  orders and for a true uniform shuffle, and whether epochs are permutations
  in new orders.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "resume.json")
SIZE, BATCH, QUALITY_BATCH = 224, 64, 256
POSITIONS = (0.01, 0.5, 0.99)
SHUFFLE_RECORDS = 10_000  # the reader's default shuffle buffer, and what its default stream windows hold


def convert(src: str, out: str, shards: int, in_process: bool = False) -> None:
    """``python -m converter`` in a process of its own; or, for a smoke run, the same job in this process on
    Beam's in-memory runner (set-up, not measured: the same shards; a converter process's start-up would cost
    more than its few photos)."""
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    if in_process:
        from beam_jobs.options import ConvertOptions
        from beam_jobs.pipeline import run

        run(ConvertOptions(src=src, out=out, shards=shards),
            ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)
        return
    subprocess.run([sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", str(shards),
                    "--no-progress"], cwd=REPO, check=True, capture_output=True)


def without_indexes(data: str, folder: str) -> str:
    """A copy of ``data`` as datasets were written before record indexes."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(data, folder)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            os.remove(os.path.join(folder, shard.pop("dali_index")))
    json.dump(manifest, open(os.path.join(folder, "manifest.json"), "w"))
    return folder


def read_options(data: str, order: str, batch: int = BATCH, shuffle_records: int = SHUFFLE_RECORDS) -> dict:
    """The reader's options for ``order`` holding ``shuffle_records`` records: the buffer order's shuffle
    buffer, or the streams order's windows in flight sized to hold as many (W = records / (6 C), as the reader
    sizes them for its default 10,000), so that both orders are compared at the same memory."""
    if shuffle_records == SHUFFLE_RECORDS:
        return {"order": order}
    if order == "buffer":
        return {"order": order, "shuffle_buffer": shuffle_records}
    import reader
    from reader.order import WINDOWS_IN_FLIGHT, stream_layout

    streams = stream_layout(reader.dataset_info(data).split("train").num_examples, batch).streams
    return {"order": order, "window": max(1, shuffle_records // (WINDOWS_IN_FLIGHT * streams))}


def _pipeline(data: str, order: str, seed: Optional[int], batch: int = BATCH, size: int = SIZE,
              shuffle_records: int = SHUFFLE_RECORDS, **kwargs):
    import reader

    return reader.build_dataset(data, "train", batch, size, seed=seed,
                                options=read_options(data, order, batch, shuffle_records), **kwargs)


def bench_throughput(data: str, rounds: int, batches: int, shuffle_records: int = SHUFFLE_RECORDS,
                     batch: int = BATCH) -> dict:
    from bench.read_bench import alternating_rounds, paired_ratio

    def pipeline(order: str, seed: Optional[int]):
        return lambda: _pipeline(data, order, seed, batch=batch, shuffle_records=shuffle_records)

    makers = {"streams_seeded": pipeline("streams", 1), "buffer_seeded": pipeline("buffer", 1),
              "streams": pipeline("streams", None), "buffer": pipeline("buffer", None)}
    measured = alternating_rounds(makers, rounds, lambda _: batches)
    return {"images_per_s": {name: round(m["images_per_s"], 1) for name, m in measured.items()},
            "cpu_ms_per_image": {name: round(m["cpu_ms_per_image"], 2) for name, m in measured.items()},
            "ratio_seeded": round(paired_ratio(measured, "streams_seeded", "buffer_seeded"), 3),
            "ratio_unseeded": round(paired_ratio(measured, "streams", "buffer"), 3)}


def peak_rss_mb(data: str, order: str, batches: int, shuffle_records: int = SHUFFLE_RECORDS,
                batch: int = BATCH) -> float:
    """Peak RSS of a process that reads ``batches`` training batches in ``order`` (its own process, fresh)."""
    options = read_options(data, order, batch, shuffle_records)
    code = ("import sys, reader\n"
            f"ds = reader.build_dataset({data!r}, 'train', {batch}, {SIZE}, seed=1, options={options!r})\n"
            f"for _ in ds.take({batches}): pass\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True)
    return int(proc.stdout.split()[-1]) / 1024


def first_batch_seconds(data: str, start: int, batch: int = QUALITY_BATCH) -> float:
    started = time.perf_counter()
    next(iter(_pipeline(data, "streams", 1, batch=batch, size=64, start=start)))
    return time.perf_counter() - started


def bench_latency(data: str, old: str, repeats: int, batch: int = QUALITY_BATCH) -> dict:
    import reader

    steps = reader.steps_per_epoch(data, "train", batch)
    starts = {"fresh": 0, **{f"{int(p * 100)}%": int(p * steps) for p in POSITIONS}}
    samples: dict = {f"{kind} {name}": [] for kind in ("indexed", "no index") for name in starts}
    if repeats > 1:  # TensorFlow's own start-up is nobody's latency (a one-round smoke run skips it)
        first_batch_seconds(data, 0, batch)
    for repeat in range(repeats):
        names = list(starts) if repeat % 2 == 0 else list(reversed(starts))
        for name in names:
            samples[f"indexed {name}"].append(first_batch_seconds(data, starts[name], batch))
            samples[f"no index {name}"].append(first_batch_seconds(old, starts[name], batch))
    seconds = {name: round(statistics.median(values), 3) for name, values in samples.items()}
    ratios = {name: round(seconds[name] / seconds[f"{name.rsplit(' ', 1)[0]} fresh"], 2) for name in seconds
              if not name.endswith("fresh")}
    return {"steps_per_epoch": steps, "seconds": seconds, "ratio_to_fresh": ratios}


def _record_ids(data: str, order: str, epochs: int, batch: int = QUALITY_BATCH) -> tuple[list[int], dict]:
    """Record ids in the order ``order`` reads them over ``epochs`` epochs, and id -> (shard, label)."""
    import tensorflow as tf

    import reader
    from reader import order as stream_order
    from reader.records import file_order, interleave_records

    info = reader.dataset_info(data).split("train")
    counts = [s.num_examples for s in info.shards]
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    names, where = {}, {}
    for shard, path in enumerate(info.files):
        for record in tf.data.TFRecordDataset(path).batch(4096):
            parsed = tf.io.parse_example(record, spec)
            for name, label in zip(parsed["image/filename"].numpy(), parsed["image/class/label"].numpy()):
                where[len(names)] = (shard, int(label))
                names[name] = len(names)
    if order == "streams":
        layout = stream_order.stream_layout(info.num_examples, batch)
        ids = []
        for epoch in range(epochs):
            records = stream_order.host_records(info.files, counts, [s.index_path for s in info.shards], layout, 1,
                                                tf.constant(epoch * layout.steps_per_epoch, tf.int64), epoch + 1,
                                                1, 0, lambda p, i, f, c: tf.data.TFRecordDataset(p).skip(f).take(c))
            ids += [int(key) - epoch * info.num_examples for _, key in records.as_numpy_iterator()]
        return ids, where
    chained = tf.data.Dataset.range(epochs).flat_map(
        lambda e: interleave_records(file_order(info.files, counts, seed=1, epoch=e), deterministic=True))
    shuffled = chained.shuffle(10_000, seed=1, reshuffle_each_iteration=True).batch(4096)
    ids = []
    for batch in shuffled:
        ids += [names[name] for name in tf.io.parse_example(batch, spec)["image/filename"].numpy()]
    return ids, where


def _batch_stats(ids: Sequence[int], where: dict, batch: int) -> dict:
    shards, entropies = [], []
    for start in range(0, len(ids) - batch + 1, batch):
        members = [where[i] for i in ids[start:start + batch]]
        shards.append(len({shard for shard, _ in members}))
        _, counts = np.unique([label for _, label in members], return_counts=True)
        p = counts / counts.sum()
        entropies.append(float(-(p * np.log2(p)).sum()))
    return {"distinct_shards_per_batch": round(statistics.mean(shards), 1),
            "label_entropy_bits": round(statistics.mean(entropies), 3)}


def bench_quality(data: str, batch: int = QUALITY_BATCH) -> dict:
    import reader

    info = reader.dataset_info(data).split("train")
    per_epoch = info.num_examples // batch * batch
    streams, where = _record_ids(data, "streams", 2, batch)
    buffer, _ = _record_ids(data, "buffer", 1, batch)
    uniform = list(np.random.default_rng(0).permutation(info.num_examples))
    first, second = streams[:per_epoch], streams[per_epoch:]
    return {
        "records": info.num_examples, "shards": len(info.shards), "batch": batch,
        "streams": _batch_stats(first, where, batch),
        "buffer_10000": _batch_stats(buffer, where, batch),
        "uniform": _batch_stats(uniform, where, batch),
        "epochs_are_permutations": len(set(first)) == len(first) == per_epoch and len(set(second)) == per_epoch,
        "epoch_orders_differ": first != second,
        "same_position_in_both_epochs": sum(a == b for a, b in zip(first, second)),
    }


def format_table(results: dict) -> str:
    """The README's table (quoted verbatim there; tests/bench/test_resume.py checks it is current)."""
    t, lat, q = results["throughput"], results["latency"], results["quality"]
    # a run with --shuffle-records says so beside what it measured that way
    at = f" ({results['shuffle_records']:,} records shuffled)" if "shuffle_records" in results else ""
    lines = [
        "| measure | streams (default, resumable) | buffer (`shuffle(10_000)`) |",
        "|---|---|---|",
        f"| training images/s, seeded{at} | {t['images_per_s']['streams_seeded']} | "
        f"{t['images_per_s']['buffer_seeded']} |",
        f"| training images/s, no seed{at} | {t['images_per_s']['streams']} | {t['images_per_s']['buffer']} |",
        f"| ratio streams / buffer (paired rounds) | {t['ratio_seeded']} seeded, {t['ratio_unseeded']} no seed | 1 |",
        f"| peak RSS of a training process{at} | {results['memory_mb']['streams']:.0f} MB | "
        f"{results['memory_mb']['buffer']:.0f} MB |",
        f"| state to resume | {results['state_bytes']} bytes of JSON | not resumable |",
        f"| distinct shards per batch of {q['batch']} ({q['shards']} shards) | "
        f"{q['streams']['distinct_shards_per_batch']} | {q['buffer_10000']['distinct_shards_per_batch']} "
        f"(uniform: {q['uniform']['distinct_shards_per_batch']}) |",
        f"| label entropy per batch, bits (100 classes) | {q['streams']['label_entropy_bits']} | "
        f"{q['buffer_10000']['label_entropy_bits']} (uniform: {q['uniform']['label_entropy_bits']}) |",
        f"| every epoch a permutation, in a new order | {_yes(q['epochs_are_permutations'] and q['epoch_orders_differ'])}"
        " | epochs blur by one buffer |",
        "",
        f"| first batch after resuming ({lat['steps_per_epoch']} steps per epoch) | with record indexes | without |",
        "|---|---|---|",
    ]
    for name in ("fresh", *(f"{int(p * 100)}%" for p in POSITIONS)):
        cells = []
        for kind in ("indexed", "no index"):
            seconds = lat["seconds"][f"{kind} {name}"]
            ratio = "" if name == "fresh" else f" ({lat['ratio_to_fresh'][f'{kind} {name}']}x)"
            cells.append(f"{seconds:.2f} s{ratio}")
        lines.append(f"| {'fresh start' if name == 'fresh' else 'at ' + name + ' of the epoch'} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=12000, help="photos for throughput (default: %(default)s)")
    parser.add_argument("--tiny", type=int, default=50_000, help="tiny images for quality and latency")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, default=30, help="batches per throughput measurement")
    parser.add_argument("--latency-rounds", type=int, default=None,
                        help="rounds of the first-batch latencies, whose median is reported (default: --rounds, "
                        "at least 3)")
    parser.add_argument("--shuffle-records", type=int, default=SHUFFLE_RECORDS,
                        help="records the buffer order's shuffle buffer holds in the throughput and memory "
                        "measurements, and the streams order's windows as many (default: %(default)s, the reader's "
                        "default; a smoke run takes fewer: the buffer fills before its first batch)")
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="batch of the throughput and memory measurements (default: %(default)s; a smoke run "
                        "takes fewer: each decodes whole 300-500 px photos)")
    parser.add_argument("--quality-batch", type=int, default=QUALITY_BATCH,
                        help="batch of the latency, state and quality measurements (default: %(default)s; a smoke "
                        "run takes fewer, on fewer --tiny images)")
    parser.add_argument("--convert-in-process", action="store_true",
                        help="convert the two datasets in this process, in memory (set-up, not measured: a smoke "
                        "run's few photos cost less than a converter process's start-up)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "imgshards-bench-resume"))
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    from bench import data
    from bench.scale import make_tiny_jpegs

    os.makedirs(args.work, exist_ok=True)
    photos, tiny = os.path.join(args.work, f"photos-{args.photos}"), os.path.join(args.work, f"tiny-{args.tiny}")
    if not os.path.isdir(photos):
        data.make_photo_dataset(photos + ".tmp", args.photos)
        os.rename(photos + ".tmp", photos)
    make_tiny_jpegs(tiny, args.tiny, classes=100)
    photo_data, tiny_data = photos + "-tfrecords", tiny + "-tfrecords"
    convert(photos, photo_data, 64, args.convert_in_process)
    convert(tiny, tiny_data, max(8, min(128, args.tiny // 400)), args.convert_in_process)
    old = without_indexes(tiny_data, tiny_data + "-no-index")
    import reader

    results = {
        "throughput": bench_throughput(photo_data, args.rounds, args.batches, args.shuffle_records, args.batch),
        "memory_mb": {order: round(peak_rss_mb(photo_data, order, 3 * args.batches, args.shuffle_records,
                                               args.batch), 1)
                      for order in ("streams", "buffer")},
        "latency": bench_latency(tiny_data, old, args.latency_rounds or max(3, args.rounds), args.quality_batch),
        "state_bytes": len(reader.position(tiny_data, "train", args.quality_batch, 1, 123).to_json().encode()),
        "quality": bench_quality(tiny_data, args.quality_batch),
        "images": {"photos": args.photos, "tiny": args.tiny},
        **({} if args.batch == BATCH else {"batch": args.batch}),
        **({} if args.shuffle_records == SHUFFLE_RECORDS else {"shuffle_records": args.shuffle_records}),
    }
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as handle:
        json.dump(results, handle, indent=1)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

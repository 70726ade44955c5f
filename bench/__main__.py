"""``python -m bench``: make the photo dataset, convert it, measure, and write bench/results/.

    python -m bench                      # defaults: 12000 + 1000 images, 5 rounds (about an hour on 2 cores)
    python -m bench --images 1200 --rounds 1 --out /tmp/bench   # quicker, noisier
    python -m bench --images 36 --rounds 1 --batches 1 --slow-batches 1 --batch 8 --large-images 8 \
        --downsize-images 0 --png-images 0 --convert-in-process --out /tmp/bench
                                         # a smoke run (tests/bench/test_smoke.py): no figures

Converter comparisons (each against the plain loop, side by side): JPEG
pass-through on 300-500 px photos; ``--max-side 256`` on 1200-1600 px photos;
PNG sources (300-500 px) re-encoded to JPEG. Reader comparisons: the presets
against the alternatives and the in-memory decode bound; the large photos; and
the downsizing workflow (convert once with ``--max-side 256``, then train).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import shutil
import sys
import tempfile

from bench import convert_bench, data, read_bench, report

LARGE_SIDES = (1200, 1600)  # longer side of the large photos, like a phone photo downsized for the web


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=12000,
                        help="images in the large set; the small set has a twelfth (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per comparison (default: %(default)s)")
    parser.add_argument("--batches", type=int, default=60,
                        help="timed batches per reader measurement (60: about 4 s; 20 was within noise)")
    parser.add_argument("--slow-batches", type=int, default=4, help="timed batches for ImageDataGenerator")
    parser.add_argument("--batch", type=int, default=read_bench.BATCH,
                        help="images per batch of the reader measurements (default: %(default)s; a smoke run takes "
                        "fewer)")
    parser.add_argument("--large-images", type=int, default=640,
                        help="photos of 1200-1600 px for the large-photo reader comparison; 0 skips it "
                        "(default: %(default)s)")
    parser.add_argument("--downsize-images", type=int, default=1200,
                        help="1200-1600 px photos for the --max-side 256 converter comparison; 0 skips it "
                        "(default: %(default)s; the small set has a twelfth)")
    parser.add_argument("--png-images", type=int, default=2400,
                        help="300-500 px PNG photos for the PNG-to-JPEG converter comparison; 0 skips it "
                        "(default: %(default)s)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--convert-in-process", action="store_true",
                        help="make the shards the reader measurements read in this process, in memory (set-up, "
                        "not measured; for a smoke run); the converter comparisons run processes regardless")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    work = args.work or tempfile.mkdtemp(prefix="imgshards-bench-")
    try:
        # Per-image cost is the slope between the sizes: the gap must dwarf start-up noise (up to 1-2 s
        # on a shared machine; with 6000 images the plain loop's slope swung 3x between rounds).
        small_n, large_n = max(args.images // 12, 10), args.images
        small, large = os.path.join(work, "small"), os.path.join(work, "large")
        data.make_photo_dataset(small, small_n, seed=1)
        data.make_photo_dataset(large, large_n, seed=2)
        print(f"made {small_n} + {large_n} photos in {work}", flush=True)
        results = {"date": datetime.date.today().isoformat(), "images": large_n, "machine": report.machine()}
        results["convert"] = convert_bench.bench_converter((small, small_n), (large, large_n), work, args.rounds)
        print("converter done", flush=True)
        shards = os.path.join(work, "shards")
        convert_bench.prepare(large, shards, 16, args.convert_in_process)
        results["read"] = read_bench.bench_reader(large, shards, args.rounds, args.batches, args.slow_batches,
                                                  args.batch)
        print("reader done", flush=True)
        if args.downsize_images:
            results["convert_downsize"] = _second_converter_bench(work, "downsize", args.downsize_images, args.rounds,
                                                                  LARGE_SIDES, "JPEG", ["--max-side", "256"])
            print("downsizing converter done", flush=True)
        if args.png_images:
            results["convert_png"] = _second_converter_bench(work, "png", args.png_images, args.rounds, (300, 500),
                                                             "PNG", [])
            print("PNG converter done", flush=True)
        if args.large_images:
            photos, photo_shards = os.path.join(work, "large-photos"), os.path.join(work, "large-photo-shards")
            data.make_photo_dataset(photos, args.large_images, seed=3, sides=LARGE_SIDES)
            convert_bench.prepare(photos, photo_shards, 8, args.convert_in_process)
            results["read_large_photos"] = {
                "images": args.large_images, "sides": list(LARGE_SIDES),
                **read_bench.bench_large_photos(photos, photo_shards, args.rounds, max(1, args.batches // 2),
                                                args.batch),
            }
            downsized = os.path.join(work, "large-photo-shards-256")
            seconds = convert_bench.timed_run(convert_bench.ours(photos, downsized, 8, ["--max-side", "256"]))[0]
            results["downsize_workflow"] = read_bench.bench_downsize_workflow(
                photos, downsized, seconds, args.rounds, max(1, args.batches // 2), args.batch)
        paths = report.write(results, args.out)
        print(report.markdown(results))
        print("wrote " + ", ".join(paths.values()))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _second_converter_bench(work: str, name: str, count: int, rounds: int, sides: tuple[int, int],
                            image_format: str, flags: list[str]) -> dict:
    """The converter against the plain loop on another kind of input (fewer, costlier images)."""
    small_n, large_n = max(count // 12, 10), count
    small, large = os.path.join(work, f"{name}-small"), os.path.join(work, f"{name}-large")
    data.make_photo_dataset(small, small_n, seed=11, sides=sides, image_format=image_format)
    data.make_photo_dataset(large, large_n, seed=12, sides=sides, image_format=image_format)
    result = convert_bench.bench_converter((small, small_n), (large, large_n), work, rounds, extra=flags)
    result.update({"sides": list(sides), "format": image_format})
    shutil.rmtree(small, ignore_errors=True)
    shutil.rmtree(large, ignore_errors=True)
    return result


if __name__ == "__main__":
    sys.exit(main())

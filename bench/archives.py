"""``python -m bench.archives``: converting archives against converting their extraction, in one run.

    python -m bench.archives                                   # the issue #28 targets (about 1 h)
    python -m bench.archives --photos 300 --tiny 5000 --tiny-classes 10 --memory 0 --rounds 1   # a smoke run

Speed: the same photos (``bench.data``) as a folder, an uncompressed tar, a zip
(deflated, as ``zip -r`` makes it) and a ``.tar.gz``; and tiny 8x8 JPEGs as
ImageNet ships them (a tar of class tars) against their extracted tree, its
headers read by the launcher and by the workers (``--archive-scan``). Each
form is converted ``--rounds`` times, alternating, and the median wall times
are compared with the folder's: ratios, taken in one run on the same data.

Memory: one tar holding N tiny images at two sizes: each process's peak RSS
(launcher, largest worker), and its growth between the sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import zipfile
from typing import Optional, Sequence

from bench import data
from bench.scale import REPO, make_tiny_jpegs, measured_run

RESULTS = os.path.join(REPO, "bench", "results", "archives.json")
# Issue #28: archive time / folder time.
TARGETS = {"tar": 1.25, "zip": 1.25, "tar.gz": 2.0, "tar of tars": 1.25}
# Forms that convert another form's archive with --archive-scan workers (the others: launcher).
WORKER_SCANS = {"tar of tars, workers read headers": "tar of tars"}
TARGET_GROWTH_MB = 60


def _files(folder: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        found += [os.path.relpath(os.path.join(root, name), folder) for name in sorted(names) if name[0] != "."]
    return found


def pack(folder: str, out: str, kind: str) -> str:
    """``folder`` as an archive of ``kind``: tar, zip (deflated), tar.gz, or "tar of tars" (a tar per class)."""
    if kind == "zip":
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for rel in _files(folder):
                archive.write(os.path.join(folder, rel), rel)
    elif kind == "tar of tars":
        classes = os.path.join(os.path.dirname(out), "class-tars")
        os.makedirs(classes, exist_ok=True)
        for name in sorted(os.listdir(folder)):
            if os.path.isdir(os.path.join(folder, name)):
                pack(os.path.join(folder, name), os.path.join(classes, f"{name}.tar"), "tar")
        pack(classes, out, "tar")
        shutil.rmtree(classes)
    else:
        with tarfile.open(out, "w:gz" if kind == "tar.gz" else "w", format=tarfile.GNU_FORMAT) as archive:
            for rel in _files(folder):
                archive.add(os.path.join(folder, rel), rel)
    return out


def _convert(src: str, out: str, extra: Sequence[str] = ()) -> dict:
    command = [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "16", "--no-progress",
               "--overwrite", *extra]
    return measured_run(command, {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}, REPO)


def speed(folder: str, kinds: Sequence[str], work: str, rounds: int) -> dict:
    """Median seconds of the folder and of each archive of it, converted alternately; each one's ratio."""
    forms = {"folder": folder}
    for kind in kinds:
        if kind in WORKER_SCANS:  # the same archive, its headers read by the workers
            forms[kind] = forms[WORKER_SCANS[kind]]
            continue
        suffix = {"tar of tars": "tar"}.get(kind, kind)  # ImageNet's train tar: a .tar of class .tar files
        forms[kind] = pack(folder, os.path.join(work, f"{kind.replace(' ', '-')}.{suffix}"), kind)
    runs: dict[str, list[dict]] = {name: [] for name in forms}
    for _ in range(rounds):
        for name, src in forms.items():
            extra = ["--archive-scan", "workers" if name in WORKER_SCANS else "launcher"] if name != "folder" else []
            runs[name].append(_convert(src, os.path.join(work, "out"), extra))
    median = {name: statistics.median(run["seconds"] for run in values) for name, values in runs.items()}
    return {"seconds": median, "ratio": {kind: round(median[kind] / median["folder"], 2) for kind in kinds},
            "archive_mb": {kind: round(os.path.getsize(forms[kind]) / 1e6, 1) for kind in kinds}}


def memory(sizes: Sequence[int], work: str) -> dict:
    """Peak RSS of one tar of N tiny images at each size, and the growth from the first to the last."""
    runs = {}
    for size in sizes:
        folder = os.path.join(work, f"tiny-{size}")
        make_tiny_jpegs(folder, size)
        archive = pack(folder, os.path.join(work, f"tiny-{size}.tar"), "tar")
        runs[str(size)] = _convert(archive, os.path.join(work, "out"))
        os.remove(archive)
    first, last = runs[str(sizes[0])], runs[str(sizes[-1])]
    return {"runs": runs, "growth_mb": {key: round(last[key] - first[key], 1)
                                        for key in ("launcher_mb", "largest_worker_mb")}}


def format_table(results: dict) -> str:
    lines = ["| input | archive size | median s (folder) | median s (archive) | archive / folder | target |",
             "|---|---|---|---|---|---|"]
    for section in ("photos", "tiny"):
        part = results.get(section)
        if not part:
            continue
        for kind, ratio in part["ratio"].items():
            target = TARGETS.get(kind)
            goal = f"<= {target}x ({'met' if ratio <= target else 'missed'})" if target else \
                "none: a comparison (auto reads tars under 4 GiB in the launcher)"
            lines.append(f"| {part['what']}: {kind} | {part['archive_mb'][kind]} MB | {part['seconds']['folder']} | "
                         f"{part['seconds'][kind]} | {ratio}x | {goal} |")
    mem = results.get("memory")
    if mem:
        sizes = list(mem["runs"])
        lines += ["", f"| one tar of tiny images | {' | '.join(sizes)} | growth | target |", "|---|---|---|---|---|"]
        for key, label in (("launcher_mb", "launcher peak RSS"), ("largest_worker_mb", "largest worker peak RSS")):
            values = " | ".join(f"{mem['runs'][size][key]} MB" for size in sizes)
            lines.append(f"| {label} | {values} | {mem['growth_mb'][key]:+} MB | <= {TARGET_GROWTH_MB} MB |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.archives", description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=3000, help="photos in the folder/tar/zip/tar.gz comparison")
    parser.add_argument("--tiny", type=int, default=100_000, help="tiny images in the tar-of-tars comparison")
    parser.add_argument("--tiny-classes", type=int, default=1000,
                        help="their classes, a tar each (default: %(default)s, as ImageNet; a smoke run takes fewer)")
    parser.add_argument("--memory", default="100000,1000000", help="sizes of the one-tar memory runs (0: skip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default=None, help="keep generated data here (default: a temporary folder)")
    parser.add_argument("--save", action="store_true", help=f"write the results to {RESULTS}")
    args = parser.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="bench-archives-")
    os.makedirs(work, exist_ok=True)
    results: dict = {"cpus": os.cpu_count()}
    try:
        photos = os.path.join(work, "photos")
        if not os.path.isdir(photos):
            data.make_photo_dataset(os.path.join(photos, "all"), args.photos)
        results["photos"] = {"what": f"{args.photos} photos",
                             **speed(photos, ["tar", "zip", "tar.gz"], work, args.rounds)}
        if args.tiny:
            tiny = os.path.join(work, f"tiny-{args.tiny}-{args.tiny_classes}")
            make_tiny_jpegs(tiny, args.tiny, classes=args.tiny_classes)
            results["tiny"] = {"what": f"{args.tiny} tiny images, {args.tiny_classes} classes",
                               **speed(tiny, ["tar of tars", *WORKER_SCANS], work, args.rounds)}
        sizes = [int(size) for size in args.memory.split(",") if int(size)]
        if sizes:
            results["memory"] = memory(sizes, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(format_table(results))
    if args.save:
        with open(RESULTS, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

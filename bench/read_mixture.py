"""``python -m bench.read_mixture``: a mixture of 3 datasets against one dataset of the same images (issue #50).

    python -m bench.read_mixture                      # 3,000 photos, about 10 minutes on 2 cores
    python -m bench.read_mixture --photos 300 --rounds 2 --batches 5   # a quick look
    python -m bench.read_mixture --smoke --results /tmp/m.json   # the test suite's run: seconds, numbers meaningless

Measured in this one run, on the same photos (300-500 px JPEGs, bench/data.py):

- throughput: images/s of the training preset (224 px, batch 64, seeded) reading
  one dataset of all the photos, and reading the mixture of three datasets that
  split them 50 / 30 / 20 with weights 0.5 / 0.3 / 0.2; rounds alternated, each
  a fresh pipeline timed after its first batch; the ratio of the medians;
- quotas: per-batch counts of each source over 10,000 steps of the schedule,
  the worst distance from ``batch * weight`` in one batch and in the running
  totals; and the pipeline's own batches (its records' sources, nothing
  decoded) checked against the schedule over the first steps;
- start-up: CPU seconds to build a pipeline over 10 sources (after TensorFlow's own first use), and what
  each source adds to it;
- hosts (issue #56 §4): bytes each input pipeline reads (``/proc/self/io`` rchar, around iterating its
  records over the same steps) at H = 1, 2, 4, 8 pipelines, against 1/H of one pipeline's, and whether
  the H pipelines' batches together are the one pipeline's; beside it, pipeline 0 of 8 of the mixture
  planned with one canonical pipeline (``canonical_pipelines=1``: every pipeline reads every source);
  and CPU to the first batch over 10 sources planned with C = 1 and the default, at H = 1 and 8; and the
  bytes each reads at each H with repeat-factor sampling (each epoch's copies dealt over the canonical pipelines).

    python -m bench.read_mixture --hosts-only --work /tmp/mix   # the hosts measure alone, data kept
    python -m bench.read_mixture --repeat-hosts-only --photos 1000 --work /tmp/mix   # with repeat factors alone
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
RESULTS = os.path.join(REPO, "bench", "results", "read_mixture.json")
SIZE, BATCH = 224, 64
WEIGHTS = (0.5, 0.3, 0.2)
HOST_PIPELINES = (1, 2, 4, 8)
SOURCES = 10  # the start-up and first-batch measures' mixture: the three parts, over and over
REPEAT_THRESHOLD = 1.0  # the hosts measure with repeat factors: every class repeated, by sqrt(1 / f(c))
# --smoke: the harness, not the figures. Its hosts part reads at H = 1 and 2 only (the same code as at 4 and 8,
# which built 13 more pipelines: half the smoke run's time); its start-up and first-batch measures mix 3 sources,
# not 10 (the same code; each of their seven first batches over 10 sources cost seconds of CPU).
SMOKE = {"photos": 30, "rounds": 1, "batches": 1, "checked_steps": 20, "host_steps": 2, "host_pipelines": (1, 2),
         "sources": 3}


def make_data(work: str, photos: int, in_process: bool = False) -> tuple[str, list[str]]:
    """One converted dataset of ``photos`` photos, and three that split the same photos 50 / 30 / 20 (converted in
    this process when ``in_process``)."""
    from bench.data import make_photo_dataset

    src = os.path.join(work, "photos")
    if not os.path.isdir(src):
        make_photo_dataset(src, photos, seed=5)
    files = sorted(os.path.join(label, name) for label in sorted(os.listdir(src))
                   for name in os.listdir(os.path.join(src, label)))
    bounds = np.cumsum([0] + [round(w * len(files)) for w in WEIGHTS[:-1]] + [len(files)])
    bounds[-1] = len(files)
    parts = []
    for index in range(3):
        part = os.path.join(work, f"part{index}")
        if not os.path.isdir(part):
            for rel in files[bounds[index]:bounds[index + 1]]:
                os.makedirs(os.path.join(part, os.path.dirname(rel)), exist_ok=True)
                shutil.copy2(os.path.join(src, rel), os.path.join(part, rel))
        parts.append(part)
    outs = [_convert(folder, f"{folder}-tfrecords", shards, in_process) for folder, shards in
            [(src, 16), *((part, max(2, round(16 * w))) for part, w in zip(parts, WEIGHTS))]]
    return outs[0], outs[1:]


def _convert(src: str, out: str, shards: int, in_process: bool = False) -> str:
    """``python -m converter`` in a process of its own; or, for the smoke run, the same job in this process on
    Beam's in-memory runner (a converter process's start-up would cost more than its few photos)."""
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    if in_process:
        from beam_jobs.options import ConvertOptions
        from beam_jobs.pipeline import run

        run(ConvertOptions(src=src, out=out, shards=shards, val_fraction=0.0),
            ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)
    else:
        subprocess.run([sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", str(shards),
                        "--val-fraction", "0", "--no-progress"], cwd=REPO, check=True, capture_output=True)
    return out


def _rate(make, batches: int) -> tuple[float, float]:
    """(images/s, CPU ms an image) of a fresh pipeline over ``batches`` batches after its first. The CPU is the
    process's (TensorFlow's threads included): on a shared machine it moves less than the wall time."""
    iterator = iter(make())
    next(iterator)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    images = batches * BATCH
    return images / (time.perf_counter() - start), (time.process_time() - cpu) * 1000 / images


def throughput(single: str, parts: Sequence[str], rounds: int, batches: int) -> dict:
    import reader

    plan = reader.mixture(list(zip(parts, WEIGHTS)), "train", BATCH)
    makers = {"one_dataset": lambda: reader.build_dataset(single, "train", BATCH, SIZE, seed=1),
              "mixture_of_3": lambda: reader.build_dataset(plan, image_size=SIZE, seed=1)}
    rates = {name: [] for name in makers}
    cpu = {name: [] for name in makers}
    for number in range(rounds):
        for name in (list(makers) if number % 2 == 0 else list(makers)[::-1]):  # alternated
            rate, ms = _rate(makers[name], batches)
            rates[name].append(rate)
            cpu[name].append(ms)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    return {"images_per_s": {name: round(value, 1) for name, value in medians.items()},
            "rounds": {name: [round(v, 1) for v in values] for name, values in rates.items()},
            "ratio_mixture_over_one": round(medians["mixture_of_3"] / medians["one_dataset"], 3),
            "cpu_ms_per_image": {name: round(value, 3) for name, value in cpu_medians.items()},
            "cpu_ratio_one_over_mixture": round(cpu_medians["one_dataset"] / cpu_medians["mixture_of_3"], 3),
            "load_average": round(os.getloadavg()[0], 1)}


def quotas(parts: Sequence[str], steps: int, checked_steps: int) -> dict:
    import tensorflow as tf

    import reader
    from reader.mixtures.pipeline import _mixed_records, _present

    plan = reader.mixture(list(zip(parts, WEIGHTS)), "train", BATCH)
    shares = np.array([float(s) for s in plan.quotas.shares])
    table = np.stack([plan.counts(step) for step in range(steps)])
    drift = np.abs(np.cumsum(table, axis=0) - np.arange(1, steps + 1)[:, None] * shares)
    splits = [_present(source) for source in plan.sources]
    records = _mixed_records(plan, splits, 1, lambda: tf.constant(0, tf.int64), checked_steps, (0, BATCH))
    sources = np.concatenate([s for _, _, s in records.batch(BATCH * 64).as_numpy_iterator()])
    pipeline = np.stack([np.bincount(row, minlength=3) for row in sources.reshape(checked_steps, BATCH)])
    return {"steps": steps, "weights": list(WEIGHTS), "share_per_batch": [round(s, 2) for s in shares],
            "counts_seen": [sorted(set(int(c) for c in table[:, k])) for k in range(3)],
            "worst_batch_distance": round(float(np.abs(table - shares).max()), 3),
            "worst_running_drift": round(float(drift.max()), 3),
            "pipeline_steps_checked": checked_steps,
            "pipeline_matches_schedule": bool((pipeline == table[:checked_steps]).all())}


def startup(parts: Sequence[str], rounds: int = 3, many: int = SOURCES) -> dict:
    """CPU seconds to build a pipeline over ``many`` sources and over 1 (medians of alternated rounds, after
    TensorFlow's own first use), and what each source adds."""
    import reader

    sources = [(parts[k % 3], 1 + k, f"source{k}") for k in range(many)]
    if rounds > 1:  # TensorFlow's own first-use costs (a one-round smoke run skips it: its figures mean nothing)
        reader.build_dataset(reader.mixture(sources[:2], "train", BATCH), image_size=SIZE, seed=1)
    builds: dict = {1: [], many: []}
    for _ in range(rounds):
        for count in (many, 1):
            start = time.process_time()
            reader.build_dataset(reader.mixture(sources[:count], "train", BATCH), image_size=SIZE, seed=1)
            builds[count].append(time.process_time() - start)
    ten, one = statistics.median(builds[many]), statistics.median(builds[1])
    # Build and first batch: what a user waits for. Each source fills its first windows (by default about
    # 10,000 / 6 records a stream's worth, here the whole of each source); windows of 8 records show the rest.
    firsts: dict = {"1": [], f"{many}": [], f"{many}, windows of 8": []}
    small = reader.ReadOptions(window=8)
    for _ in range(rounds):
        for name, count, options in ((f"{many}", many, reader.ReadOptions()), ("1", 1, reader.ReadOptions()),
                                     (f"{many}, windows of 8", many, small)):
            start = time.process_time()
            next(iter(reader.build_dataset(reader.mixture(sources[:count], "train", BATCH), image_size=SIZE, seed=1,
                                            options=options)))
            firsts[name].append(time.process_time() - start)
    return {"sources": many, "build_cpu_s": round(ten, 2), "one_source_build_cpu_s": round(one, 2),
            "per_source_cpu_s": round((ten - one) / (many - 1), 3),
            "first_batch_cpu_s": {name: round(statistics.median(values), 2) for name, values in firsts.items()}}


def _read_bytes() -> int:
    """Bytes this process has read (``rchar``: every read and pread, page cache or not)."""
    with open("/proc/self/io", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar:"))


def _pipeline_read(plan, splits, steps: int, pipelines: int, index: int) -> tuple[int, np.ndarray]:
    """(bytes read, keys ``[steps, G / H]``) of input pipeline ``index`` of ``pipelines`` over ``steps`` steps:
    the records the mixture's pipeline parses, nothing decoded (decoding reads no file)."""
    import gc

    import tensorflow as tf

    from reader.mixtures.pipeline import _mixed_records

    per = BATCH // pipelines
    records = _mixed_records(plan, splits, 1, lambda: tf.constant(0, tf.int64), steps, (index * per, (index + 1) * per))
    before = _read_bytes()
    keys = np.concatenate([key for _, key, _ in records.batch(4096).as_numpy_iterator()])
    read = _read_bytes() - before
    del records
    gc.collect()
    return read, keys.reshape(steps, per)


def hosts(parts: Sequence[str], steps: int, counts: Sequence[int] = HOST_PIPELINES, rounds: int = 3,
          sources: int = SOURCES) -> dict:
    """Bytes each of H input pipelines reads, at each H, and the global batches they make together."""
    import reader
    from reader.mixtures.pipeline import _present

    plan = reader.mixture(list(zip(parts, WEIGHTS)), "train", BATCH)
    splits = [_present(source) for source in plan.sources]
    if rounds > 1:  # TensorFlow's own first use reads its files (a one-round smoke run skips it)
        _pipeline_read(plan, splits, 2, 1, 0)
    read, same = _reads_by_pipelines(plan, splits, steps, counts)
    one = read[counts[0]][0]
    before = reader.mixture(list(zip(parts, WEIGHTS)), "train", BATCH, canonical_pipelines=1)
    old = _pipeline_read(before, splits, steps, counts[-1], 0)[0]
    return {"canonical_pipelines": plan.canonical_pipelines, "steps": steps, "bytes_read": read,
            "first_batch_cpu_s": first_batches(parts, plan.canonical_pipelines, counts[-1], rounds, sources),
            "first_batch_sources": sources,
            "worst_over_share": {h: round(max(values) / (one / h), 3) for h, values in read.items()},
            "best_over_share": {h: round(min(values) / (one / h), 3) for h, values in read.items()},
            "same_global_batches": same,
            "one_canonical_pipeline": {"pipelines": counts[-1], "bytes_read_by_pipeline_0": old,
                                       "over_share": round(old / (one / counts[-1]), 3)}}


def _reads_by_pipelines(plan, splits, steps: int, counts: Sequence[int]) -> tuple[dict, dict]:
    """Per pipeline count H: the bytes each of the H pipelines reads over ``steps`` steps, and whether their
    batches together are the first count's global batches."""
    read, same, whole = {}, {}, None
    for pipelines in counts:
        got = [_pipeline_read(plan, splits, steps, pipelines, index) for index in range(pipelines)]
        read[pipelines] = [value for value, _ in got]
        keys = np.concatenate([k for _, k in got], axis=1)
        whole = keys if whole is None else whole
        same[pipelines] = bool((keys == whole).all())
    return read, same


def hosts_repeat_factors(single: str, steps: int, counts: Sequence[int] = HOST_PIPELINES) -> dict:
    """:func:`hosts` for the dataset of all the photos (two classes, half each) with repeat-factor sampling
    (``RepeatFactor(REPEAT_THRESHOLD)``: each image 1.41 copies an epoch, one or two): each epoch's copies
    are dealt over the canonical pipelines, so each of H pipelines reads 1/H of its bytes."""
    import reader
    from reader.mixtures.pipeline import _present

    plan = reader.mixture([(single, 1)], "train", BATCH, repeat_factor=reader.RepeatFactor(REPEAT_THRESHOLD))
    splits = [_present(source) for source in plan.sources]
    read, same = _reads_by_pipelines(plan, splits, steps, counts)
    one = read[counts[0]][0]
    return {"canonical_pipelines": plan.canonical_pipelines, "steps": steps, "threshold": REPEAT_THRESHOLD,
            "records": [s.split.num_examples for s in plan.sources],
            "epoch_records": [s.factors.epoch_records for s in plan.sources], "bytes_read": read,
            "worst_over_share": {h: round(max(values) / (one / h), 3) for h, values in read.items()},
            "best_over_share": {h: round(min(values) / (one / h), 3) for h, values in read.items()},
            "same_global_batches": same}


def format_repeat_hosts(h: dict) -> str:
    rows = [f"| with repeat factors (t = {h['threshold']}; E / N {h['epoch_records']} / {h['records']}): H "
            f"(C = {h['canonical_pipelines']}, {h['steps']} steps) | MB read by each (min-max) | its ratio to 1/H "
            "of one pipeline's (min-max) | global batches as H = 1's |", "|---|---|---|---|"]
    for count, values in h["bytes_read"].items():
        rows.append(f"| {count} | {min(values) / 1e6:.1f}-{max(values) / 1e6:.1f} | "
                    f"{h['best_over_share'][count]}-{h['worst_over_share'][count]} | "
                    f"{'yes' if h['same_global_batches'][count] else 'NO'} |")
    return "\n".join(rows)


def first_batches(parts: Sequence[str], canonical: int, pipelines: int, rounds: int = 3,
                  sources: int = SOURCES) -> dict:
    """CPU seconds to the first batch over ``sources`` sources (build included), planned with one canonical
    pipeline and with ``canonical``, at 1 pipeline and as pipeline 0 of ``pipelines``: medians of alternated
    rounds."""
    import tensorflow as tf

    import reader

    mixed = [(parts[k % 3], 1 + k, f"source{k}") for k in range(sources)]
    plans = {count: reader.mixture(mixed, "train", BATCH, canonical_pipelines=count) for count in (1, canonical)}
    contexts = {1: None, pipelines: tf.distribute.InputContext(pipelines, 0, pipelines)}
    if rounds > 1:  # TensorFlow's own first-use costs (a one-round smoke run skips it)
        reader.build_dataset(plans[1], image_size=SIZE, seed=1)
    cpu: dict = {(count, h): [] for count in plans for h in contexts}
    for number in range(rounds):
        for count, h in (list(cpu) if number % 2 == 0 else list(cpu)[::-1]):
            start = time.process_time()
            next(iter(reader.build_dataset(plans[count], image_size=SIZE, seed=1, input_context=contexts[h])))
            cpu[(count, h)].append(time.process_time() - start)
    return {f"C={count}, H={h}": round(statistics.median(values), 2) for (count, h), values in cpu.items()}


def format_hosts(h: dict) -> str:
    rows = [f"| input pipelines H (C = {h['canonical_pipelines']}, {h['steps']} steps of {BATCH}) | MB read by "
            "each (min-max) | its ratio to 1/H of one pipeline's (min-max) | global batches as H = 1's |",
            "|---|---|---|---|"]
    for count, values in h["bytes_read"].items():
        rows.append(f"| {count} | {min(values) / 1e6:.1f}-{max(values) / 1e6:.1f} | "
                    f"{h['best_over_share'][count]}-{h['worst_over_share'][count]} | "
                    f"{'yes' if h['same_global_batches'][count] else 'NO'} |")
    old = h["one_canonical_pipeline"]
    rows.append(f"| {old['pipelines']}, planned with canonical_pipelines=1 (every pipeline reads every source) | "
                f"{old['bytes_read_by_pipeline_0'] / 1e6:.1f} (pipeline 0) | {old['over_share']} | |")
    first = h.get("first_batch_cpu_s")
    if first:
        canonical = h["canonical_pipelines"]
        sources = h.get("first_batch_sources", SOURCES)  # results recorded before it was a setting: 10
        rows += ["", f"| CPU to the first batch over {sources} sources (build included) | C = 1 | C = {canonical} |",
                 "|---|---|---|"]
        for pipelines in sorted({int(key.split("H=")[1]) for key in first}):
            name = "one pipeline (H = 1)" if pipelines == 1 else f"pipeline 0 of {pipelines}"
            rows.append(f"| {name} | {first[f'C=1, H={pipelines}']} s | {first[f'C={canonical}, H={pipelines}']} s |")
    return "\n".join(rows)


def format_table(results: dict) -> str:
    repeat = "\n\n" + format_repeat_hosts(results["hosts_repeat_factors"]) if "hosts_repeat_factors" in results else ""
    if "throughput" not in results:
        return (format_hosts(results["hosts"]) if "hosts" in results else "") + repeat
    t, q = results["throughput"], results["quotas"]
    many, first = results["startup"]["sources"], results["startup"]["first_batch_cpu_s"]
    rows = [
        "| measure | value |",
        "|---|---|",
        f"| one dataset, images/s | {t['images_per_s']['one_dataset']} |",
        f"| mixture of 3 (0.5 / 0.3 / 0.2), images/s | {t['images_per_s']['mixture_of_3']} |",
        f"| ratio mixture / one (medians of alternated rounds; load average {t['load_average']}) | "
        f"{t['ratio_mixture_over_one']} |",
        f"| CPU ms an image, one / mixture (its ratio: the images/s the CPU allows) | "
        f"{t['cpu_ms_per_image']['one_dataset']} / {t['cpu_ms_per_image']['mixture_of_3']} "
        f"({t['cpu_ratio_one_over_mixture']}) |",
        f"| per-batch counts over {q['steps']:,} steps (share {' / '.join(map(str, q['share_per_batch']))}) | "
        f"{' / '.join('-'.join(map(str, c)) for c in q['counts_seen'])} |",
        f"| worst distance from the share, one batch / running totals | {q['worst_batch_distance']} / "
        f"{q['worst_running_drift']} |",
        f"| pipeline's batches match the schedule ({q['pipeline_steps_checked']} steps) | "
        f"{'yes' if q['pipeline_matches_schedule'] else 'NO'} |",
        f"| CPU to build a pipeline over {results['startup']['sources']} sources | "
        f"{results['startup']['build_cpu_s']} s |",
        f"| CPU each source adds to the build | {results['startup'].get('per_source_cpu_s', '?')} s |",
        f"| CPU to the first batch, 1 / {many} sources (build included; {many} with windows of 8 records) | "
        f"{first['1']} / {first[str(many)]} s ({first.get(f'{many}, windows of 8', '?')} s) |",
    ]
    return "\n".join(rows) + ("\n\n" + format_hosts(results["hosts"]) if "hosts" in results else "") + repeat


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, default=30, help="timed batches a round (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10_000, help="schedule steps checked (default: %(default)s)")
    parser.add_argument("--checked-steps", type=int, default=200, help="pipeline steps checked (default: %(default)s)")
    parser.add_argument("--work", default=None, help="keep the generated data here (default: a temporary folder)")
    parser.add_argument("--host-steps", type=int, default=200, help="steps each pipeline reads in the hosts "
                        "measure (default: %(default)s)")
    parser.add_argument("--hosts-only", action="store_true", help="only the hosts measure (bytes read at H = 1, "
                        "2, 4, 8)")
    parser.add_argument("--repeat-hosts-only", action="store_true", help="only the hosts measure with repeat "
                        "factors (bytes read at H = 1, 2, 4, 8)")
    parser.add_argument("--sources", type=int, default=SOURCES, help="sources the start-up and first-batch "
                        "measures mix (default: %(default)s)")
    parser.set_defaults(host_pipelines=HOST_PIPELINES)
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run, for the tests: {SMOKE['photos']} "
                        "photos converted in this process, 1 round of 1 batch, "
                        f"{SMOKE['checked_steps']} pipeline steps checked, hosts at H = 1 and 2, {SMOKE['sources']} "
                        "sources mixed (its numbers mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    if args.sources < 2:
        parser.error(f"--sources must be at least 2 (what each source adds is measured), got {args.sources}")
    work = args.work or tempfile.mkdtemp(prefix="read-mixture-")
    try:
        import reader  # noqa: F401  (before TensorFlow: its start-up lines stay quiet)

        single, parts = make_data(work, args.photos, in_process=args.smoke)
        results = {"photos": args.photos, "image_size": SIZE, "batch_size": BATCH}
        if not (args.hosts_only or args.repeat_hosts_only):
            results.update({"throughput": throughput(single, parts, args.rounds, args.batches),
                            "quotas": quotas(parts, args.steps, args.checked_steps),
                            "startup": startup(parts, min(3, args.rounds), args.sources)})
        if not args.repeat_hosts_only:
            results["hosts"] = hosts(parts, args.host_steps, args.host_pipelines, rounds=min(3, args.rounds),
                                     sources=args.sources)
        results["hosts_repeat_factors"] = hosts_repeat_factors(single, args.host_steps, args.host_pipelines)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

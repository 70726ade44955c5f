"""Shared, generated test data: every input kind a user meets, and small converted datasets.

Everything is made here with Pillow and NumPy from fixed seeds; nothing is
downloaded. Session-scoped fixtures convert once and are shared read-only.
"""

from __future__ import annotations

import io
import os
import pathlib
import platform
import struct
import subprocess
import sys
import zlib
from typing import Callable, Optional

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The longest tests (half a minute or more each), started first, dealt out in this order to the test processes
# (pytest.ini) in turn, so that each starts on its share, instead of one running them all in a row or one of them
# running alone at the end. The order is their durations' in the last clean-clone runs (.ci/run's --durations),
# longest first. The README chains (tests/test_readme.py) share one set-up, made by the first chain to ask while
# the other process starts on a benchmark (second here), so neither waits for it.
_README = "tests/test_readme.py::test_every_readme_block_runs_as_written_after_the_setup_commands"
LONGEST_FIRST = (f"{_README}[objects]", "tests/bench/test_smoke.py::test_the_startup_benchmark",
                 f"{_README}[sources]", "tests/reader/test_keras.py::test_mobilenet_example_trains_under_mirrored",
                 f"{_README}[the-rest]", "tests/bench/test_read_mixture.py::test_the_mixture_benchmark",
                 f"{_README}[classifier]", "tests/bench/test_resume.py::test_the_resume_benchmark",
                 f"{_README}[keras]", "tests/bench/test_smoke.py::test_the_benchmark_runs_end_to_end",
                 f"{_README}[folders]", "tests/reader/test_resume_training.py::test_the_keras_recipe_survives_kills",
                 "tests/bench/test_smoke.py::test_the_archive_benchmark",
                 "tests/bench/test_smoke.py::test_the_objects_benchmark",
                 "tests/converter/test_signals.py::test_every_stop_signal",
                 "tests/converter/test_signals.py::test_a_signal_at_any_moment",
                 "tests/reader/test_resume_training.py::test_a_killed_run_restarts",
                 "tests/bench/test_smoke.py::test_the_detection_reading_benchmark",
                 "tests/reader/mixtures/test_mixture.py::test_resuming_before_at_and_after",
                 "tests/test_packaging.py::test_the_installed_wheel",
                 "tests/reader/mixtures/test_mixture.py::test_decoded_batches_of_several_pipelines",
                 "tests/reader/test_keras.py::test_a_small_cnn_learns_the_shapes",
                 "tests/reader/test_objects.py::test_training_resumes_exactly",
                 "tests/bench/test_smoke.py::", "tests/converter/test_signals.py::")


def _start_rank(item) -> int:
    return next((rank for rank, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
                len(LONGEST_FIRST))


@pytest.hookimpl(trylast=True)  # after -m has deselected: the sizes below are of what runs
def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=_start_rank)  # stable: the rest keep their order
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    longest = sum(_start_rank(item) < len(LONGEST_FIRST) for item in items)
    # pytest-xdist's --dist load first sends each process a run of consecutive tests, a quarter of its share
    # (every process collects and sorts alike): each run is made to start with every workers-th longest test.
    # Were the scheduler to change, the tests would still all run, only in a worse order.
    chunk = max(len(items) // max(workers, 1) // 4, 2)
    if workers > 1 and longest and chunk * workers <= len(items) and -(-longest // workers) <= chunk:
        long, rest = items[:longest], iter(items[longest:])
        dealt = []
        for worker in range(workers):
            share = long[worker::workers]
            dealt += share + [next(rest) for _ in range(chunk - len(share))]
        items[:] = dealt + list(rest)


# The fast tier (-m "not e2e and not slow") leaves out every test marked e2e: one that runs the converter's
# command line (in or out of this process), starts a process or a server. The mark is explicit; a test that
# starts a process without it fails (below), and so does one that asks for a fixture serving a process.
_SPAWNING_FIXTURES = {"converter", "s3_server", "gcs_emulator", "dask_cluster"}
_PROCESS_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.system", "os.exec",
                   "os.spawn"}


class _ProcessWatch:
    """Processes started while an unmarked test runs (sys.addaudithook: hooks cannot be removed, so one
    hook for the session, switched on per test)."""

    watching = False
    started: list = []

    @classmethod
    def audit(cls, event: str, args: tuple) -> None:
        if cls.watching and event in _PROCESS_EVENTS:
            cls.started.append(f"{event} {str(args[1] if event == 'subprocess.Popen' else args[:1])[:120]}")


sys.addaudithook(_ProcessWatch.audit)
# platform.processor() runs `uname -p` once a process, and caches it: whichever test first imports a module that
# asks (TensorFlow's, Beam's) would be charged with starting a process. Asked here, before any test.
platform.processor()


@pytest.fixture(autouse=True)
def _processes_need_the_e2e_mark(request):
    if request.node.get_closest_marker("e2e") is not None:
        yield
        return
    spawning = _SPAWNING_FIXTURES & set(request.fixturenames)
    if spawning:
        pytest.fail(f"{request.node.nodeid} uses {sorted(spawning)}, which run processes or servers: mark it "
                    "@pytest.mark.e2e")
    _ProcessWatch.watching, _ProcessWatch.started = True, []
    try:
        yield
    finally:
        _ProcessWatch.watching = False
    if _ProcessWatch.started:
        pytest.fail(f"{request.node.nodeid} started processes but is not marked e2e (the fast tier runs it): "
                    f"{_ProcessWatch.started[:3]}; mark it @pytest.mark.e2e")


def _photo(seed: int, height: int = 120, width: int = 160) -> np.ndarray:
    """A smooth, photo-like RGB array (gradients plus a disc), distinct per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    pixels = np.stack([x / width * 255, y / height * 255, np.full_like(x, rng.uniform(0, 255))], axis=-1)
    cy, cx, r = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width, min(height, width) / 4
    pixels[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, size=3)
    return pixels.astype(np.uint8)


def _save(img: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    img.save(out, format=fmt, **params)
    return out.getvalue()


def _png_with_size(width: int, height: int) -> bytes:
    """A PNG whose header declares any size (its pixel data is 1x1)."""
    data = bytearray(_save(Image.new("RGB", (1, 1)), "PNG"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _exif_rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    return _save(Image.fromarray(_photo(3, 60, 100)), "JPEG", quality=90, exif=exif.tobytes())


def _corrupt_jpeg() -> bytes:
    """A JPEG with garbage before a marker: libjpeg warns "Corrupt JPEG data: N extraneous bytes"."""
    data = _save(Image.fromarray(_photo(4, 200, 240)), "JPEG", quality=90)
    cut = data.index(b"\xff\xdb")
    return data[:cut] + b"\x00\x01\x02" + data[cut:]


def make_sample_images() -> dict[str, bytes]:
    """kind -> file bytes, for every kind of input the converter must handle."""
    rgb = Image.fromarray(_photo(1))
    rgba = rgb.convert("RGBA")
    alpha = np.full((120, 160), 255, np.uint8)
    alpha[:, :40] = 0  # left quarter fully transparent
    rgba.putalpha(Image.fromarray(alpha))
    gray16 = Image.fromarray((np.linspace(0, 65535, 120 * 160).reshape(120, 160)).astype(np.uint16))
    jpeg = _save(rgb, "JPEG", quality=90)
    return {
        "jpeg_rgb": jpeg,
        "jpeg_gray": _save(rgb.convert("L"), "JPEG", quality=90),
        "jpeg_cmyk": _save(rgb.convert("CMYK"), "JPEG", quality=90),
        "jpeg_exif_rotated": _exif_rotated_jpeg(),
        "jpeg_corrupt_data": _corrupt_jpeg(),
        "jpeg_progressive": _save(rgb, "JPEG", quality=90, progressive=True),
        "jpeg_large": _save(Image.fromarray(_photo(5, 600, 800)), "JPEG", quality=90),
        "png_rgb": _save(rgb, "PNG"),
        "png_rgba": _save(rgba, "PNG"),
        "png_palette": _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "png_16bit_gray": _save(gray16, "PNG"),
        "gif": _save(rgb.convert("P"), "GIF"),
        "bmp": _save(rgb, "BMP"),
        "tiff": _save(rgb, "TIFF"),
        "webp": _save(rgb, "WEBP", quality=90),
        # Formats beyond the common six (beam_jobs/formats.py), each written by Pillow itself.
        **_more_formats(rgb),
        # Rejected kinds.
        "empty": b"",
        "text": b"this is a text file, not an image\n",
        "truncated_jpeg": jpeg[: len(jpeg) // 2],
        "truncated_png": _save(rgb, "PNG")[:200],
        "garbage_after_magic": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4,
        "zero_sized_png": _png_with_size(0, 10),
        "bomb_png": _png_with_size(50_000, 50_000),
        "pdf": _save(rgb, "PDF"),
        "fits_header": b"SIMPLE  =                    T / conforms to FITS standard" + b" " * 2800,
        "svg": b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>\n',
    }


def _more_formats(rgb: Image.Image) -> dict[str, bytes]:
    """Rasters in every further format the converter reads that this Pillow can write."""
    from PIL import features

    small = rgb.resize((64, 48))
    out = {
        "ppm": _save(rgb, "PPM"),
        "pgm": _save(rgb.convert("L"), "PPM"),
        "tga": _save(rgb, "TGA"),
        "ico": _save(small, "ICO", sizes=[(48, 48)]),
        "sgi": _save(rgb, "SGI"),
        "pcx": _save(rgb, "PCX"),
        "dds": _save(rgb.convert("RGBA"), "DDS"),
        "qoi": _save(rgb, "QOI"),
        "dib": _save(rgb, "DIB"),
        "bigtiff": _save(rgb, "TIFF", big_tiff=True),
        "tiff_16bit": _save(Image.fromarray((np.linspace(0, 65535, 120 * 160).reshape(120, 160)).astype(np.uint16)), "TIFF"),
    }
    if features.check("jpg_2000"):
        out["jpeg2000"] = _save(rgb, "JPEG2000")
    if features.check("avif"):
        out["avif"] = _save(rgb, "AVIF", quality=80)
    try:
        import pillow_heif  # noqa: F401  (the heif extra registers Pillow's HEIF format)

        from beam_jobs import formats

        if "HEIF" in formats.CONVERTED:
            out["heic"] = _save(rgb, "HEIF", quality=80)
    except ImportError:
        pass
    return out


REJECTED_KINDS = {
    "empty": "empty-file",
    "text": "not-an-image",
    "truncated_jpeg": "undecodable",
    "truncated_png": "undecodable",
    "garbage_after_magic": "undecodable",
    "zero_sized_png": "zero-sized",
    "bomb_png": "too-many-pixels",
    "pdf": "unsupported-format",
    "fits_header": "unsupported-format",
    "svg": "unsupported-format",
}


IMAGENET_WNIDS = {"n01440764": "tench, Tinca tinca", "n01443537": "goldfish, Carassius auratus",
                  "n02119789": "kit fox, Vulpes macrotis"}


def write_imagenet_tree(src, labels_dir, images: dict[str, bytes]) -> tuple[dict, dict]:
    """A miniature ILSVRC-2012 as the Kaggle release ships it.

    ``src/train/<wnid>/<wnid>_<i>.JPEG``, a flat ``src/val/ILSVRC2012_val_<n>.JPEG``,
    ``labels_dir/LOC_val_solution.csv`` and ``labels_dir/LOC_synset_mapping.txt``,
    with ImageNet's odd files among them (a PNG named .JPEG, CMYK and grayscale
    JPEGs). Returns the wnids with their text, and ``{relative path: (split, label)}``.
    """
    src, labels_dir = pathlib.Path(src), pathlib.Path(labels_dir)
    wnids = IMAGENET_WNIDS
    kinds = ["jpeg_rgb", "png_rgb", "jpeg_cmyk", "jpeg_gray", "jpeg_progressive", "jpeg_exif_rotated"]
    expected = {}
    for index, wnid in enumerate(sorted(wnids)):
        (src / "train" / wnid).mkdir(parents=True)
        for i in range(2):
            name = f"train/{wnid}/{wnid}_{i}.JPEG"
            (src / name).write_bytes(images[kinds[(2 * index + i) % len(kinds)]])
            expected[name] = ("train", index)
    (src / "val").mkdir()
    truth = ["n02119789", "n01440764", "n01443537", "n02119789"]
    lines = ["ImageId,PredictionString"]
    for i, wnid in enumerate(truth, start=1):
        name = f"ILSVRC2012_val_{i:08d}"
        (src / "val" / f"{name}.JPEG").write_bytes(images[kinds[i % len(kinds)]])
        lines.append(f"{name},{wnid} 10 20 30 40")
        expected[f"val/{name}.JPEG"] = ("validation", sorted(wnids).index(wnid))
    (labels_dir / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    (labels_dir / "LOC_synset_mapping.txt").write_text("".join(f"{w} {t}\n" for w, t in wnids.items()))
    return wnids, expected


@pytest.fixture(scope="session")
def sample_images() -> dict[str, bytes]:
    return make_sample_images()


def checkout_copy(folder) -> str:
    """The tracked files of this checkout, as a fresh clone has them (new modules must be ``git add``-ed)."""
    import shutil

    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and os.path.exists(os.path.join(REPO, rel)):
            os.makedirs(os.path.join(folder, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, rel), os.path.join(folder, rel))
    return str(folder)


def processes_marked(marker: str) -> list[int]:
    """Processes whose environment (as they were started) holds ``marker``: a run's launcher and every
    process it started. Linux only (/proc)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue  # gone meanwhile
    return found


def run_converter_process(*args: str, timeout: float = 300, check: bool = False,
                          env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """``python -m converter ARGS`` in a real subprocess, as a user runs it (``env``: extra variables).

    For tests of the process itself: its signals, its exit, what reaches its file descriptors.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "converter", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"converter failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_converter(*args: str, timeout: float = 300, check: bool = False,
                  env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """``converter.cli.main(ARGS)`` in this process, as ``python -m converter ARGS`` would run (``env``: extra
    variables), its stdout, stderr and exit status returned as :func:`run_converter_process` returns them.

    Why: a process starts by importing Beam or TensorFlow (3-4 s of CPU each), which this test process has
    done already; most tests check what a command does, not how its process starts or ends. What the
    command sets for its process (signal handlers, logging, the reader's S3 client) is put back after. A
    run told to kill or signal itself (``IMGSHARDS_FAULT=kill@...``, ``term@...``) gets its own process.
    ``timeout`` is the process's; here pytest-timeout bounds the test.
    """
    from tests.in_process import cli_in_process, needs_own_process

    if needs_own_process(env or {}):
        return run_converter_process(*args, timeout=timeout, check=check, env=env)
    proc = cli_in_process(list(args), cwd=REPO, env=env or {})
    if check and proc.returncode != 0:
        raise AssertionError(f"converter failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def converter() -> Callable[..., subprocess.CompletedProcess]:
    return run_converter


@pytest.fixture(scope="session")
def demo_src(tmp_path_factory) -> str:
    """The demo dataset (three classes of shapes), 30 images per class."""
    from converter.demo import write_demo

    folder = str(tmp_path_factory.mktemp("demo") / "shapes")
    write_demo(folder, per_class=30, seed=7)
    return folder


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory, demo_src) -> str:
    """``demo_src`` converted in-process (in-memory DirectRunner) into 4 train shards + validation."""
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run

    out = str(tmp_path_factory.mktemp("converted") / "shapes-tfrecords")
    run(
        ConvertOptions(src=demo_src, out=out, shards=4, val_fraction=0.2, seed=1),
        ["--direct_running_mode=in_memory", "--direct_num_workers=1"],
        show_progress=False,
    )
    return out


def read_records(path: str) -> list[dict]:
    """Every record of a shard file, parsed with real TensorFlow into plain Python values."""
    import tensorflow as tf

    import record_schema

    rows = []
    for raw in tf.data.TFRecordDataset(path):
        example = tf.train.Example.FromString(raw.numpy())
        row = {}
        for key, kind in record_schema.FEATURES.items():
            feature = example.features.feature[key]
            row[key] = feature.bytes_list.value[0] if kind == "bytes" else feature.int64_list.value[0]
        rows.append(row)
    return rows


def _serving(start):
    """A session fixture's body: start a server (tests/object_stores.py), yield its handle, stop it."""
    proc, server = start()
    yield server
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on loopback for the whole session."""
    from tests import object_stores

    yield from _serving(object_stores.start)


@pytest.fixture(scope="session")
def gcs_emulator():
    """gcp-storage-emulator on loopback for the whole session."""
    from tests import object_stores

    yield from _serving(object_stores.start_gcs)

"""Install with ``pip install .`` (``.[test]`` for the tests, ``.[bench]``, ``.[dask]``, ``.[heif]``, ``.[aws]``,
``.[gcp]``, ``.[dali]``, ``.[tfds]``, ``.[report]``).

A ``setup.py`` (not only pyproject) because Beam ships a multi-module job to
remote workers with ``--setup_file=./setup.py``.

One side without the other: ``IMGSHARDS_BASE=core pip install ".[read]"`` is a trainer's install (``reader``,
TensorFlow, no Beam), ``IMGSHARDS_BASE=core pip install ".[convert]"`` a converting worker's (``beam_jobs``,
Beam, no TensorFlow). pip's extras only add to the base, and ``pip install .`` (the README's set-up) must
convert and train, so the base is both sides unless ``IMGSHARDS_BASE=core`` asks for the shared core alone
(tests/test_install_sides.py checks the lists and that neither side's modules import the other's framework).
The switch is read when the wheel is built: a wheel built with it (``pip wheel``, ``python -m build``) requires the
core alone whoever installs it, so build it for your own install only and never publish or share it (pip keys
the wheels it caches from an index's sdist by URL, not by this variable; ``--no-cache-dir`` where in doubt).
"""

import os

from setuptools import find_packages, setup

# Beam's minor versions tested: beam_jobs.runtime.worker_handler re-implements private Beam code checked against
# this Beam; a new minor is let in once the tests pass on it (tests/beam_jobs/runtime/test_worker_handler.py).
BEAM = ">=2.77,<2.78"
AWS = [f"apache-beam[aws]{BEAM}", "boto3>=1.34"]  # s3:// through Beam's S3 filesystem; the reader uses boto3
BENCH = ["matplotlib>=3.9", "scikit-image>=0.24", "scikit-learn>=1.5", "tf-keras>=2.21", "scipy>=1.13",
         "psutil>=7.0", "moto[server]>=5.1"] + AWS
GCP = [f"apache-beam[gcp]{BEAM}"]  # gs:// through Beam's GCS filesystem (the reader uses TensorFlow's own)
DASK = [f"apache-beam[dask]{BEAM}", "dask[distributed]>=2024.8"]
HEIF = ["pillow-heif>=1.0"]  # HEIC/HEIF phone photos
TFDS = ["tensorflow-datasets>=4.9.10"]  # python -m converter tfds-metadata
MASKS = ["pycocotools>=2.0.8"]  # COCO's polygons and RLE as instance masks (--masks)
REPORT = ["matplotlib>=3.9"]  # python -m converter report: the figures of the HTML report
DETECTION = ["keras-hub>=0.32", "pycocotools>=2.0.8"]  # KerasHub detectors; COCO evaluation (examples/train_detector.py)
# What both sides import (record_schema, record_files).
CORE = [
    "pyarrow>=25.0",  # comes with Beam (which caps it below 26); the records tables, the Hub's Parquet datasets
    "pillow>=12.3",  # the 2026 security fixes (14 advisories, July 2026)
    "google-crc32c>=1.5",
    "numpy>=2.0",
    "pyyaml>=6.0",  # Ultralytics YOLO's data.yaml
]
# A converting worker: beam_jobs and the converter's conversion; no TensorFlow.
CONVERT = [
    f"apache-beam[tfrecord]{BEAM}",
    "simplejpeg>=1.9",
    "tifffile>=2026.3",  # 64-bit float TIFFs, which Pillow cannot open
    "tqdm>=4.66",
    "ijson>=3.3",  # COCO's annotation files read as a stream (450 MB for train2017), never held whole
]
# A trainer: reader; no Beam.
READ = [
    "tensorflow>=2.21",
    "keras>=3.15",  # BackupAndRestore(double_checkpoint=True), which the README's resume recipe needs
]
# NVIDIA DALI (Linux x86-64 wheels only); the tests run its CPU pipeline on the .idx record index of every shard.
DALI = ["nvidia-dali-cuda120>=2.0; platform_system == 'Linux' and platform_machine == 'x86_64'"]

setup(
    name="imgshards",
    version="0.1.0",
    description="Image folders to sharded TFRecords with Apache Beam, and tf.data pipelines that keep GPUs fed",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Found, never listed by hand: a listed set once left out beam_jobs.sources, and the installed
    # package could not convert (tests/test_packaging.py builds the wheel and checks every module is in it).
    packages=find_packages(include=["converter*", "beam_jobs*", "reader*", "record_files*"]),
    py_modules=["record_schema"],
    install_requires=CORE if os.environ.get("IMGSHARDS_BASE") == "core" else CORE + CONVERT + READ,
    extras_require={
        "read": READ,
        "convert": CONVERT,
        "bench": BENCH,
        "dask": DASK,
        "heif": HEIF,
        "aws": AWS,
        "gcp": GCP,
        "dali": DALI,
        "tfds": TFDS,
        "masks": MASKS,
        # The detectors the reader's object targets are shaped for (examples/train_detector.py).
        "detection": DETECTION,
        "report": REPORT,
        # The tests also smoke-test the benchmark, run a real Dask cluster, a real S3 server (moto's) and a
        # GCS emulator, DALI's CPU pipeline and TFDS's loader.
        # datasets writes Parquet exactly as the Hugging Face Hub does, for the tests of that source.
        # Model Garden's TfExampleDecoder and create_coco_tf_record.py (tf-models-official, installed with
        # --no-deps: it pins tensorflow~=2.20) import gin, OpenCV and pycocotools. KerasHub's RetinaNet
        # fits on the reader's detection batches.
        "test": ["pytest>=9.0", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "hypothesis>=6.100", "ruff>=0.6",
                 "gcp-storage-emulator>=2026.7", "datasets>=5.2", "gin-config>=0.5", "opencv-python-headless>=4.10",
                 "pycocotools>=2.0.8",
                 # mlcroissant validates the Croissant card; selenium drives Debian's Chromium (installed by .ci/run)
                 # through its chromedriver to check the report renders.
                 "mlcroissant>=1.1.1", "selenium>=4.51"] + CONVERT + READ + REPORT + BENCH + DASK + HEIF + DALI + TFDS + GCP + DETECTION,
    },
)

"""A tiny run of the benchmark code (not the benchmark: its numbers mean nothing at this size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import archives, hub, read_objects, reader_stages, startup
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server


def test_the_benchmark_runs_end_to_end_and_writes_json_markdown_and_a_chart(tmp_path):
    out = tmp_path / "results"
    # Batches of 8, not 64: every reader measurement decodes 3 batches (2 warm-up), the large photos' whole
    # (1200-1600 px); a third of this run's time at 64. Run in this process (``main(argv)``, as ``python -m bench``
    # runs it), TensorFlow and Beam loaded already; the shards the reader measurements read are made here too
    # (set-up, not measured). The converter comparisons and --max-side's timed conversion still run processes
    # (convert_bench.timed_run adopts their orphans only while it waits for them).
    from bench.__main__ import main

    assert main(["--images", "36", "--rounds", "1", "--batches", "1", "--slow-batches", "1", "--batch", "8",
                 "--large-images", "8", "--downsize-images", "0", "--png-images", "0", "--convert-in-process",
                 "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["results.json", "results.md", "results.png"]
    results = json.loads((out / "results.json").read_text())
    assert set(results["convert"]["tools"]) == {"ours", "plain_loop"}
    # At this size the slopes are noise (even negative); only their presence is checked.
    assert all(isinstance(tool["cpu_per_image_ms"], float) for tool in results["convert"]["tools"].values())
    assert isinstance(results["convert"]["ratio_ceiling_all_cores"], float)
    assert set(results["read"]["pipelines"]) == {"ours_train", "ours_eval", "image_dataset_from_directory",
                                                 "image_data_generator", "article_tf_data", "decode_bound_in_memory"}
    # A smoke round's few batches can all be ready before the clock starts (prefetched during the warm-up): a
    # CPU of 0 is possible here, so only a measured, non-negative number is checked.
    assert all(r["warm"]["cpu_ms_per_image"] >= 0 for r in results["read"]["pipelines"].values())
    assert set(results["read"]["bound_context_warm"]) == {
        "train_over_decode_bound_paired", "eval_over_decode_bound_paired",
        "train_cpu_efficiency_over_decode_bound", "eval_cpu_efficiency_over_decode_bound"}
    assert "warm CPU ms per image" in (out / "results.md").read_text()
    assert results["read"]["batch"] == 8 and "| reader (224 px, batch 8) |" in (out / "results.md").read_text()
    assert set(results["read_large_photos"]["pipelines"]) == {"ours_train", "ours_eval", "image_dataset_from_directory"}
    assert "| target | goal | measured | met |" in (out / "results.md").read_text()
    assert "| reader, large photos |" in (out / "results.md").read_text()
    # The downsizing and PNG sections run the converter section's code on other files with other flags: left
    # out here (about 25 s each); --max-side's path is in the downsizing workflow below.
    assert "convert_downsize" not in results and "convert_png" not in results
    workflow = results["downsize_workflow"]
    assert workflow["images"] == 8 and workflow["convert_seconds"] > 0 and "break_even_epochs" in workflow
    markdown = (out / "results.md").read_text()
    assert "Downsizing workflow" in markdown


def test_the_reader_stage_profile_runs_and_reports_every_variant_against_the_bound(tmp_path, capsys):
    out = tmp_path / "stages.json"
    # Batches of 8, not 64: each of the nine variants decodes 3 batches (2 warm-up) of 300-500 px photos. Run in
    # this process (``main(argv)``, as ``python -m bench.reader_stages`` runs it; the variant that patches the
    # reader's parse batch puts it back), TensorFlow and Beam loaded already.
    assert reader_stages.main(["--images", "24", "--rounds", "1", "--batches", "1", "--batch", "8",
                               "--convert-in-process", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    measured = json.loads(out.read_text())
    assert set(measured) == {"bound", "memory_eval_fn", "memory_train_fn", "shards_bound", "shards_plain_eval",
                             "ours_eval", "ours_train", "ours_eval_parse_each", "ours_train_parse_each"}
    assert list(measured) == list(reader_stages.VARIANTS)  # what --only accepts is what runs
    assert all(result["images_per_s"] > 0 for result in measured.values())
    assert "over bound" in stdout


def test_the_archive_benchmark_runs_end_to_end(tmp_path, capsys):
    """``python -m bench.archives`` at a tiny size: every form converts and the table names each target. Run in
    this process (``main(argv)``, as ``python -m bench.archives`` runs it): each conversion it times is a
    converter process of its own; one for the harness only loaded its photos' libraries again."""
    # 300 tiny images in 10 classes, not ImageNet's 1000 (300 class tars of one image each): the same forms and
    # code, fewer members for each conversion to list and index.
    assert archives.main(["--photos", "20", "--tiny", "300", "--tiny-classes", "10", "--memory", "0", "--rounds", "1",
                          "--work", str(tmp_path)]) == 0
    stdout = capsys.readouterr().out
    for row in ("20 photos: tar ", "20 photos: zip ", "20 photos: tar.gz ", "300 tiny images, 10 classes: tar of tars |",
                "300 tiny images, 10 classes: tar of tars, workers read headers |"):
        assert row in stdout, stdout


def test_the_startup_benchmark_reports_each_ratio_against_its_reference(tmp_path, capsys):
    out = tmp_path / "startup.json"
    # Run in this process (``main(argv)``, as ``python -m bench.startup`` runs it): what it times are the commands
    # it starts, each in a process of its own; a process for the harness itself only loaded its photos' libraries.
    assert startup.main(["--images", "30", "--rounds", "1", "--photos", "2", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    measured = json.loads(out.read_text())
    assert set(measured["ratio"]) == {"convert", "verify", "inspect", "convert, 2 workers"}
    assert measured["images"] == 30
    assert all(ratio > 0 for ratio in measured["ratio"].values())
    assert "x import apache_beam (target 1.5x" in stdout
    assert set(measured["large_photos"]["median_s"]) == {"default rule", "one process", "2 workers"}


def test_the_hub_benchmark_compares_parquet_with_class_folders(tmp_path, capsys):
    out = tmp_path / "hub.json"
    # In this process (``main(argv)``, as ``python -m bench.hub`` runs it): the conversions it times are processes.
    assert hub.main(["--photos", "30", "--tiny", "300,600", "--rounds", "1", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    measured = json.loads(out.read_text())
    assert measured["speed"]["ratio"] > 0 and set(measured["memory"]["growth_mb"]) == {"launcher_mb",
                                                                                         "largest_worker_mb"}
    assert "Hub Parquet" in stdout and "growth: launcher" in stdout


def test_the_objects_benchmark_runs_against_model_gardens_script(tmp_path):
    """bench.objects at a tiny size: both converters run on the same COCO demo, each layout's plan is measured
    twice, and YOLO label files are planned locally and from S3."""
    out = tmp_path / "objects.json"
    proc = subprocess.run([sys.executable, "-m", "bench.objects", "--images", "20", "--rounds", "1", "--sizes",
                           "100,200", "--label-files", "30", "--json", str(out)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [row["objects"] for row in results["memory"]["sizes"]] == [800, 1600]
    assert set(results["memory_by_layout"]) == {"coco", "yolo", "voc"}  # each planned at both sizes
    assert all(len(memory["sizes"]) == 2 for memory in results["memory_by_layout"].values())
    files = results["yolo_label_files"]  # planned from a folder and from moto's S3 on loopback
    assert files["files"] == 30 and files["local_s"] > 0 and files["s3_s"] > 0
    assert results["speed"]["ratio"] > 0 and set(results["speed"]["seconds"]) == {"ours", "model_garden"}


def test_the_detection_reading_benchmark_compares_with_the_bound_and_classification(tmp_path):
    """bench.read_objects at a tiny size: the same photos converted both ways, four pipelines measured; in one
    configuration (224 px), which --configs picks (the other, 384 px, is the same code at other sizes), in
    batches of 8 (each measurement decodes 3 batches). Run in this process (``main(argv)``, as ``python -m
    bench.read_objects`` runs it), its two conversions too (``--direct-running-mode in_memory``: the same
    shards as its default's worker processes, each of which would import Beam and TensorFlow first)."""
    out = tmp_path / "read_objects.json"
    assert read_objects.main(["--images", "32", "--rounds", "1", "--batches", "1", "--batch", "8", "--configs", "224",
                              "--direct-running-mode", "in_memory", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results["images_per_s"]) == {"detection_train", "classification_train", "detection_images_only",
                                            "decode_bound_in_memory"}
    assert results["detection_over_decode_bound"] > 0 and results["objects"] >= 32
    assert list(results["by_config"]) == ["224"] and results["image_size"] == 224 and results["batch"] == 8

"""What a run's pipeline costs to build, whatever its size: Beam's type inference off, no Reshuffle where one worker
takes every task, no combine with a default where its input is never empty (the output's bytes do not depend on
any of it: tests/converter/test_pinned_output.py runs both shapes)."""

from __future__ import annotations

import collections

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import TypeOptions

from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.options import ConvertOptions
from beam_jobs.runtime import runners
from beam_jobs.transforms import ConvertImages

SMALL = runners.Work(20, 700_000)  # 20 photos: the launcher's own process by the size rule


@pytest.mark.parametrize("args", [[], ["--direct_running_mode=in_memory"], ["--runner=PrismRunner"]])
def test_every_run_builds_its_pipeline_without_beams_type_inference(args):
    choice = runners.choose_runner(args)
    for chosen in (choice, runners.sized_for(choice, SMALL)):
        assert chosen.options.view_as(TypeOptions).pipeline_type_check is False


def test_tasks_are_spread_only_where_more_than_one_worker_may_take_them():
    default = runners.choose_runner([])
    assert runners.spreads_tasks(default)  # a worker per core
    assert not runners.spreads_tasks(runners.sized_for(default, SMALL))  # the launcher's process
    assert not runners.spreads_tasks(runners.choose_runner(["--direct_num_workers=1"]))
    assert runners.spreads_tasks(runners.choose_runner(["--direct_num_workers=2"]))
    assert runners.spreads_tasks(runners.choose_runner(["--runner=PrismRunner"]))  # not ours: its own workers


def _leaves(spread: bool, tmp_path) -> collections.Counter:
    """The pipeline's leaf transforms by kind, built (not run) as beam_run builds it."""
    layout = WorkLayout(work=str(tmp_path), num_parts=2, buckets={"train": 2}, hash_ranges=1, near_bands=4,
                        near_ranges=4)
    choice = runners.choose_runner(["--direct_running_mode=in_memory", "--direct_num_workers=1"])
    pipeline = beam.Pipeline(runner=choice.runner, options=choice.options)
    _ = (pipeline | beam.Create(range(2), reshuffle=spread)
         | ConvertImages(ConvertOptions(src=str(tmp_path)), str(tmp_path), ["a", "b"], ["a", "b"], None, layout,
                         spread=spread))
    kinds: collections.Counter = collections.Counter()

    class Leaves(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            kinds[type(node.transform).__name__] += 1
            kinds["Reshuffle"] += "Reshuffle" in node.full_label
            kinds["Default"] += "InjectDefault" in node.full_label

    pipeline.visit(Leaves())
    return kinds


def test_a_one_worker_pipeline_has_no_reshuffle_and_no_global_combine_builds_a_default(tmp_path):
    one, spread = _leaves(False, tmp_path), _leaves(True, tmp_path)
    assert one["Reshuffle"] == 0 and one["Default"] == 0 and spread["Default"] == 0
    assert spread["Reshuffle"] > 0
    # 70 leaves (55 ParDos) before this was measured; each costs Beam's set-up and its run, whatever the images.
    assert one["ParDo"] <= 25 and one["ParDo"] + one["GroupByKey"] + one["Impulse"] + one["Flatten"] <= 31, one

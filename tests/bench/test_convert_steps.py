"""``python -m bench.convert_bench steps``: the converter's CPU per image, step by step, in one process."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

from bench import convert_bench
from beam_jobs.stages import validate, write


def _photos(root, count: int = 12) -> None:
    rng = np.random.default_rng(0)
    for index in range(count):
        folder = root / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(48 + index, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:03d}.jpg", quality=90)


def test_every_step_is_timed_each_stage_holds_its_steps_and_the_modules_are_left_as_they_were(tmp_path):
    _photos(tmp_path / "src")
    costs = convert_bench.step_costs(str(tmp_path / "src"), part_size=5, shards=2)
    stages = [step.split(":")[0] for step in costs]
    assert stages == sorted(stages, key=["validate", "validate + order", "order", "search", "write"].index)  # data flow
    assert {"search: near, find_pairs", "search: near, group_near"} <= set(costs)  # the near search's stage
    assert {step for _, _, step in convert_bench._STEPS} | set(convert_bench._SHA_STEPS) <= set(costs)
    assert all(value >= 0 for value in costs.values())
    assert costs["validate: validate_part, all"] > costs["validate: encode_image (the check, the hash, headers)"] \
        >= costs["validate: libjpeg check (reduced-scale decode)"] > 0
    assert costs["write: write_shard, all"] > costs["write: Example serialized"] > 0
    assert write.hashlib is hashlib and validate.hashlib is hashlib
    assert not hasattr(write.build_example, "__wrapped__") and not hasattr(validate.read_stamped, "__wrapped__")


def test_a_src_that_is_not_a_folder_is_a_usage_error_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        convert_bench.main(["steps", str(tmp_path / "nowhere")])
    assert exit_.value.code == 2 and "nowhere is not a folder" in capsys.readouterr().err

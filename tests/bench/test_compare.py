"""bench.compare: its arithmetic, its arguments, and its worktree handling (with a stand-in for the converter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import compare


def _times(current: dict, rev: dict) -> dict:
    return {tool: {size: {"wall": list(walls), "cpu": [w * 2 for w in walls]} for size, walls in by_size.items()}
            for tool, by_size in (("current", current), ("rev", rev))}


def test_ratios_are_the_current_checkout_over_the_revision_end_to_end_and_per_image():
    # current: 2 s of start-up, 1 ms an image; rev: 1 s, 1 ms an image (one round a bit slower).
    times = _times({100: [2.1, 2.1, 2.1], 1100: [3.1, 3.1, 3.3]}, {100: [1.1, 1.1, 1.2], 1100: [2.1, 2.1, 2.2]})
    summary = compare.summarize(times)
    assert summary["end_to_end"][100]["ratio"] == pytest.approx(2.1 / 1.1)
    assert summary["end_to_end"][1100]["rounds"]["max"] == pytest.approx(3.3 / 2.2)
    assert summary["per_image"]["ms"] == {"current": pytest.approx(1.0), "rev": pytest.approx(1.0)}
    assert summary["per_image"]["ratio"] == pytest.approx(1.0)
    assert summary["per_image"]["cpu_ms"]["rev"] == pytest.approx(2.0)
    assert "1100 photos end to end: 3.10 s against 2.10 s = 1.48x" in compare.report("abc", summary)
    assert summary["fixed_s"]["current"] == {"wall": pytest.approx(2.0), "cpu": pytest.approx(4.0)}
    assert "fixed cost a run (at no image): 2.00 s against 1.00 s; CPU 4.00 against 2.00 s" in compare.report("abc", summary)


def test_one_size_reports_end_to_end_only():
    summary = compare.summarize(_times({50: [1.0]}, {50: [2.0]}))
    assert "per_image" not in summary and summary["end_to_end"][50]["ratio"] == 0.5


def test_rounds_alternate_which_tree_goes_first():
    calls = []
    compare.measure({"current": "A", "rev": "B"}, {10: "s", 20: "l"}, 3, "/nonexistent",
                    lambda tree, src, out: calls.append((tree, src)) or (1.0, 1.0))
    assert [tree for tree, _ in calls] == ["A", "A", "B", "B", "B", "B", "A", "A", "A", "A", "B", "B"]
    assert [src for _, src in calls[:2]] == ["s", "l"]  # the small size, then the large, back to back


def test_arguments_sizes_rounds_and_the_converter_flags_passed_on():
    args = compare.parse_args(["HEAD~1", "--sizes", "12000, 3000", "--rounds", "5", "--max-side", "256"])
    assert (args.rev, args.sizes, args.rounds, args.extra) == ("HEAD~1", [3000, 12000], 5, ["--max-side", "256"])
    assert args.current_flags == ""
    own = compare.parse_args(["HEAD~1", "--current-flags=--no-near-duplicates --near-distance 4"])
    assert (own.extra, compare.shlex.split(own.current_flags)) == ([], ["--no-near-duplicates", "--near-distance", "4"])
    for bad in (["X", "--sizes", "a,b"], ["X", "--rounds", "0"], ["X", "--sizes", "0"]):
        with pytest.raises(SystemExit):
            compare.parse_args(bad)


@pytest.mark.e2e  # git worktree add / remove
def test_the_revision_runs_from_its_own_worktree_which_is_removed_afterwards(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "photo_sets", lambda sizes, folder: {size: f"photos-{size}" for size in sizes})
    trees = []

    def timer(tree, src, out):
        trees.append(tree)
        assert os.path.isfile(os.path.join(tree, "bench", "__init__.py"))
        images = int(src.rsplit("-", 1)[1])
        return (2.0 if tree == compare.REPO else 1.0) + images / 10, 1.0

    assert compare.main(["HEAD", "--sizes", "10,20", "--rounds", "1", "--json", str(tmp_path / "c.json")], timer) == 0
    worktree = next(tree for tree in trees if tree != compare.REPO)
    assert not os.path.exists(worktree)
    assert "10 photos end to end: 3.00 s against 2.00 s = 1.50x" in capsys.readouterr().out
    assert (tmp_path / "c.json").exists()


_ORPHAN_CPU = """
import resource, subprocess, sys, time
from bench import compare
compare.adopt_orphans()
before = resource.getrusage(resource.RUSAGE_CHILDREN)
# The child starts a grandchild that burns CPU after the child has exited, as a forkserver outlives its launcher.
burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
subprocess.run([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {burn!r}])"],
               check=True)
print(compare.tree_cpu(before))
"""


@pytest.mark.e2e  # processes whose parent exits first
def test_the_cpu_of_a_run_counts_the_processes_it_leaves_behind():
    """Workers forked from a forkserver are not the launcher's children: adopted, their CPU is counted."""
    proc = subprocess.run([sys.executable, "-c", _ORPHAN_CPU], cwd=compare.REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": compare.REPO})
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) >= 0.4

"""The README's set-up commands are the ones CI runs."""

from __future__ import annotations

import os
import re

from tests.conftest import REPO


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as handle:
        return handle.read()


def test_readme_opens_with_exactly_two_setup_commands_and_ci_runs_the_test_one():
    readme = _read("README.md")
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)
    assert len(commands) == 2
    install_and_run, test = commands
    assert "pip install ." in install_and_run and "python -m converter " in install_and_run
    assert test == 'pip install ".[test]" && python -m pytest'
    ci = _read(".ci", "run")
    assert test in ci.splitlines()

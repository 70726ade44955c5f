"""``--update``: write what changed in SRC as a new version of OUT (issue #59).

:func:`run` is what ``python -m converter --update`` calls; the modules, in the order an update goes through
them: ``checks`` (what is refused before anything is converted; SRC's plan), then
:mod:`beam_jobs.planning.changes` (SRC compared with the latest version), ``launch`` (the lock, the conversion
of what changed, the publish: :func:`run`), ``compose`` (version N+1 in staging: compacted shards, manifest,
rejections, sources table), then :mod:`beam_jobs.files.version_store` (published by its pointer, written last).
docs/design.md maps them; docs/converter.md, "Updating a dataset", says what an update does.
"""

from beam_jobs.update.checks import UpdateRefusedError
from beam_jobs.update.launch import UpdateSummary, run

__all__ = ["UpdateRefusedError", "UpdateSummary", "run"]

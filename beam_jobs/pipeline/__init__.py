"""Launch a conversion: list and plan SRC, run the Beam pipeline, check what it wrote, publish.

:func:`run` is what ``python -m converter`` calls; the modules, in the order a run goes through them:
``launch`` (the lock, the resume, the publish: :func:`run`, :func:`convert_into`), ``run_plan`` (SRC listed and
planned, the work weighed), ``label_files`` (the labels and the card beside the shards), ``beam_run`` (the
pipeline on a runner, its failure judged), ``outcome`` (what it wrote read back into the manifest), with
``budgets`` (``--max-bad-fraction``) and ``run_notes`` (what the run tells the user). docs/design.md maps them.
"""

from beam_jobs.pipeline.beam_run import ConversionFailedError
from beam_jobs.pipeline.budgets import TooManyRejectedError
from beam_jobs.pipeline.label_files import label_map
from beam_jobs.pipeline.launch import convert_into, run

__all__ = ["ConversionFailedError", "TooManyRejectedError", "convert_into", "label_map", "run"]

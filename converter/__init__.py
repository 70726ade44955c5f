"""Command line of the image-folder to TFRecord converter: ``python -m converter``.

The conversion itself lives in :mod:`beam_jobs`; this package only parses
flags, builds :class:`beam_jobs.options.ConvertOptions` and calls
:func:`beam_jobs.pipeline.run`.
"""

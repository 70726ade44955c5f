"""The pipeline's stages, 1 to 6, wired in :mod:`beam_jobs.transforms` (its diagram is the flow), each
stating its data in and out at its top.

The modules, one line each: docs/design.md (the one module map).
"""

"""The dataset tools: the report, verify, inspect and contact sheets, and TFDS's metadata files.

``python -m converter report | verify | inspect | tfds-metadata`` run them. Nothing of the input pipeline imports
them (the frames they read are :mod:`reader.frames`'); docs/design.md maps the modules.
"""

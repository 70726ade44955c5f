"""Archives read as folders: tar, zip and compressed tars listed by offset, their members read without extracting.

The modules, in data-flow order, are in docs/design.md's module map.
"""

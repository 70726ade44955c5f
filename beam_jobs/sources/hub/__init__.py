"""Hugging Face datasets as the Hub ships them: Parquet and Arrow files, their splits, columns and rows.

The modules, in data-flow order, are in docs/design.md's module map.
"""

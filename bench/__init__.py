"""Benchmarks: ``python -m bench``. Not tests: ratios measured in one run on the same data.

Modules: ``data`` (photo-like dataset from the photographs scikit-image and
scikit-learn ship), ``plain_loop`` (the tutorial converter we compare with),
``convert_bench``, ``read_bench``, ``report`` (JSON, markdown, chart).
"""

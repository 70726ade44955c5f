"""Benchmarks: ratios measured in one run on the same data, never timed unit tests.

``python -m bench`` (the converter against a plain loop, the reader against the alternatives and the
decode bound: ``data``, ``plain_loop``, ``convert_bench``, ``read_bench``, ``report``); and on their
own: ``bench.scale`` (memory at two sizes, local and Dask), ``bench.archives``, ``bench.hub``
(Hugging Face Parquet against class folders), ``bench.resume``, ``bench.reader_stages``,
``bench.s3_read``, ``bench.index_check`` and ``bench.startup`` (a small job against one import).
"""

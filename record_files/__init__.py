"""The files a dataset is made of, one module per on-disk format, imported by the converter and the reader alike.

- :mod:`record_files.tfrecord`: TFRecord frames (written, read, CRCs checked) and ``tf.train.Example`` bytes;
- :mod:`record_files.idx`: the record index beside each shard (``<shard>.idx``, DALI's format);
- :mod:`record_files.staging`: where a conversion stages its work and what a stopped one keeps.

Neither TensorFlow nor Apache Beam is imported here: Beam workers stay light and the reader never imports Beam.
"""

"""What ``store_files.reading`` turns into a StoreError naming OUT, and what it leaves as it is (review F5)."""

import os

import pytest

from beam_jobs.files import store_files


def test_a_local_file_error_inside_a_remote_read_is_the_launchers_own_not_the_stores(tmp_path):
    """A staging file the launcher cannot write (its folder missing, a full disk) keeps its own message: "check
    the bucket and credentials" would send the user to the wrong place."""
    with pytest.raises(FileNotFoundError) as caught, store_files.reading("s3://bucket/out"):
        open(tmp_path / "missing" / "staged.parquet", "wb")
    assert "missing" in str(caught.value)
    if os.path.exists("/dev/full"):  # a real full device: ENOSPC without a file name
        with pytest.raises(OSError) as full, store_files.reading("gs://bucket/out"):
            with open("/dev/full", "wb", buffering=0) as handle:
                handle.write(b"x")
        assert not isinstance(full.value, store_files.StoreError)


def test_a_stores_refusal_names_out_and_what_to_check():
    with pytest.raises(store_files.StoreError, match=r"--out s3://bucket/out: the store refused .*credentials"):
        with store_files.reading("s3://bucket/out"):
            raise ConnectionRefusedError("connection refused")


def test_a_local_out_is_left_alone(tmp_path):
    with pytest.raises(ConnectionRefusedError), store_files.reading(str(tmp_path)):
        raise ConnectionRefusedError("connection refused")

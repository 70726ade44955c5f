"""A run stopped by its own file's failure (a full, read-only or forbidden disk) prints a line naming the file."""

import errno
import os

import pytest

from converter.cli import disk_error_line


def test_a_full_disk_is_named_with_its_file_and_what_to_do(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(OSError) as full:
        with open("/dev/full", "wb", buffering=0) as handle:
            handle.write(b"x")
    assert full.value.errno == errno.ENOSPC
    line = disk_error_line(full.value)
    assert "No space left on device" in line and "run the same command again" in line
    with pytest.raises(PermissionError) as forbidden:
        os.chmod(tmp_path, 0o500)
        try:
            open(tmp_path / "staging.parquet", "wb")
        finally:
            os.chmod(tmp_path, 0o700)
        if os.geteuid() == 0:  # root writes anyway: the message is still checked on a built error
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "staging.parquet"))
    assert disk_error_line(forbidden.value).startswith(f"{tmp_path / 'staging.parquet'}: Permission denied;")

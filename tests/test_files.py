"""read_capped: the one bounded read of a file a user or an operator names."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.files import read_capped

CODES = {"what": "test file", "unreadable": "TEST_UNREADABLE", "too_large": "TEST_TOO_LARGE"}


def test_a_file_up_to_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_capped(path, 10, **CODES) == b"x" * 10


def test_one_byte_over_the_limit_is_refused_with_the_callers_code(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 11)
    with pytest.raises(SchedulerError) as caught:
        read_capped(path, 10, **CODES)
    assert caught.value.code == "TEST_TOO_LARGE" and caught.value.details == {"path": str(path), "limit_bytes": 10}
    assert "test file" in caught.value.message and str(path) in caught.value.message


def test_a_missing_file_and_a_directory_are_unreadable(tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):
        with pytest.raises(SchedulerError) as caught:
            read_capped(path, 10, **CODES)
        assert caught.value.code == "TEST_UNREADABLE" and str(path) in caught.value.message


def test_an_endless_device_is_not_read_past_the_limit() -> None:
    with pytest.raises(SchedulerError) as caught:
        read_capped("/dev/zero", 1024, **CODES)  # never ends: the read stops one byte past the limit
    assert caught.value.code == "TEST_TOO_LARGE"

"""``store_patiently``: a read tried again while the store is unreachable, each
pause logged as a warning; a missing or corrupt file is not waited for."""

from __future__ import annotations

import logging

import pytest

from streaming.adapters.objects import store_patiently
from streaming.errors import SnapshotMissingError, StoreError


def _failing(times: int, error: Exception):
    calls = []

    def read() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "read"

    return read, calls


def test_an_unreachable_store_is_read_again_and_each_pause_logged(caplog):
    read, calls = _failing(1, StoreError("connection refused"))
    with caplog.at_level(logging.WARNING, logger="streaming.adapters.objects"):
        assert store_patiently(read, "reading the job", bound_s=30) == "read"
    assert len(calls) == 2
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("reading the job: connection refused; the store looks unreachable, trying again in 1 s")
    assert line.endswith("(for up to 30 s)")


def test_a_missing_file_is_not_waited_for(caplog):
    read, calls = _failing(1, SnapshotMissingError("no manifest"))
    with caplog.at_level(logging.WARNING, logger="streaming.adapters.objects"), pytest.raises(SnapshotMissingError):
        store_patiently(read, "reading checkpoint 3")
    assert len(calls) == 1 and caplog.records == []

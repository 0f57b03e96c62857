"""Fixtures of the adapters' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore


@pytest.fixture
def store(request, tmp_path: Path):
    """A snapshot store in a local directory, for the job its test module names (``JOB``)."""
    with SnapshotStore(open_store(str(tmp_path / "snapshots")), request.module.JOB, key=UNSIGNED) as snapshots:
        yield snapshots

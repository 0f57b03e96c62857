"""Fixtures of the sinks' tests."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

from streaming.adapters.objects import open_store


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.integration)])  # s3: the real runtime
def location(request, tmp_path, unique_name):
    """A sink's staging location on a local filesystem, and on the runtime's S3 server."""
    if request.param == "file":
        return open_store(str(tmp_path / "sink"))
    connection = request.getfixturevalue("connection")
    return open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)


@pytest.fixture
def epoch_rows() -> Callable[..., pa.Table]:
    """``(epoch, n=3)``: n rows of an epoch, keys and values naming it."""

    def rows(epoch: int, n: int = 3) -> pa.Table:
        return pa.table({"key": [f"e{epoch}-k{i}" for i in range(n)], "value": [f"{epoch}:{i}" for i in range(n)]})

    return rows

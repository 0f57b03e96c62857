"""Session fixtures: the local runtime (real Kafka broker and S3 server) and
one Spark session, each started once per test session; per-test names so
tests never share a topic or a bucket prefix."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from streaming.api.config import Connection, LocalRuntimeSettings


def _say(message: str) -> None:
    print(f"[spark-abs] {message}", flush=True)


@pytest.fixture(scope="session")
def runtime_settings() -> LocalRuntimeSettings:
    return LocalRuntimeSettings()


@pytest.fixture(scope="session")
def connection(runtime_settings: LocalRuntimeSettings) -> Iterator[Connection]:
    """The local runtime, brought up once; stopped at the end only if this
    session started it."""
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(runtime_settings, progress=_say)
    was_running = runtime.status().all_running
    conn = runtime.up()
    yield conn
    if not was_running:
        for line in runtime.down():
            _say(line)


@pytest.fixture(scope="session")
def spark(connection: Connection, runtime_settings: LocalRuntimeSettings):
    from streaming.adapters.spark import spark_session
    from streaming.api.config import SparkSettings

    session = spark_session(SparkSettings(master=connection.spark_master), runtime_settings, progress=_say)
    yield session
    session.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic / prefix name of this test's own: its name plus a random suffix."""
    base = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-").lower()[:40]
    return f"{base}-{uuid.uuid4().hex[:8]}"

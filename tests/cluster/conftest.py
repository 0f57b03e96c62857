"""The local cluster (``spark-abs local up --cluster``) for the tests of this
directory: brought up once per session (test_cluster.py and
test_cluster_drill.py share it), stopped at its end only if this session
started it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streaming.api.config import Connection, LocalRuntimeSettings


@pytest.fixture(scope="session")
def cluster(runtime_settings: LocalRuntimeSettings) -> Iterator[tuple[object, Connection]]:
    """The local cluster, brought up once; stopped at the end only if this session started it."""
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(
        LocalRuntimeSettings.cluster(runtime_settings.home), progress=lambda m: print(f"[cluster] {m}", flush=True)
    )
    was_running = runtime.status().all_running
    connection = runtime.up()
    yield runtime, connection
    if not was_running:
        runtime.down()

"""Session fixtures: the local runtime (real Kafka broker and S3 server) and
one Spark session, each started once per test session; per-test names so
tests never share a topic or a bucket prefix, and the topics a test made
deleted after it (a broker with thousands of partitions restarts slowly).

And the Hypothesis profile of the operator tests (``tests/operators`` and
the demo's operators in ``tests/streaming/tools``), ``operators``, applied by
the property tests themselves (``@settings(settings.get_profile("operators"))``)
so that registering it does not change other packages' Hypothesis tests.
Examples are capped to keep the operator tests well under 30 s; with ``CI``
set the profile is derandomized (the same examples every run, no example
database).

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml) and on the
``PYTHONPATH`` of every process the tests start, so worker processes load
the suite's own pipelines (``support.pipelines``) as the tests do."""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from streaming.api.config import Connection, LocalRuntimeSettings

_TESTS = os.path.dirname(os.path.abspath(__file__))

# a pytest-xdist worker's __main__ (execnet's) has neither __spec__ nor __file__, which
# pyspark.sql.connect (imported by great-expectations) takes for a doctest run, and exits
_main = sys.modules["__main__"]
if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
    _main.__file__ = "pytest-xdist-worker"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH")) if p)

_common = dict(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

if os.environ.get("CI"):
    settings.register_profile("operators", derandomize=True, database=None, print_blob=True, **_common)
else:
    settings.register_profile("operators", **_common)


def _say(message: str) -> None:
    print(f"[spark-abs] {message}", flush=True)


# fixtures of the real runtime: a test that takes one runs with the integration tests (one process, one
# runtime), never among the tests make test spreads over every core
_RUNTIME_FIXTURES = frozenset({"connection", "spark", "registry_connection", "cluster", "secure_connection"})


def pytest_collection_modifyitems(items):
    for item in items:
        if _RUNTIME_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def runtime_settings() -> LocalRuntimeSettings:
    return LocalRuntimeSettings()


@pytest.fixture(scope="session")
def connection(runtime_settings: LocalRuntimeSettings) -> Iterator[Connection]:
    """The local runtime, brought up once (without its schema registry, as
    ``spark-abs local up`` does: ``registry_connection`` starts that);
    stopped at the end only if this session started it."""
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(runtime_settings, progress=_say)
    was_running = runtime.status().all_running
    conn = runtime.up()
    # the test process's producers and references find Avro schemas in the runtime's registry, if it runs one
    from streaming.adapters.serde.schema_registry import use_connection_registry

    use_connection_registry(conn)
    yield conn
    if not was_running:
        for line in runtime.down():
            _say(line)


@pytest.fixture(scope="session")
def _topic_admin(connection: Connection) -> Iterator:
    """One admin client for the session's topic clean-up."""
    from streaming.adapters.kafka.admin import admin_client

    admin = admin_client(connection.kafka)
    yield admin
    admin.close()


@pytest.fixture(autouse=True)
def _topics_deleted_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """The topics a test on the local runtime made, deleted after it (the
    broker's own, ``__consumer_offsets`` and the like, are left; so are the
    topics of fixtures wider than the test, made before it)."""
    if "connection" not in request.fixturenames:
        yield
        return
    admin = request.getfixturevalue("_topic_admin")
    before = set(admin.list_topics())
    yield
    made = sorted(t for t in set(admin.list_topics()) - before if not t.startswith("_"))
    if made:
        try:
            admin.delete_topics(made, timeout_ms=30_000)
        except Exception as exc:  # a clean-up that failed must not fail the test
            _say(f"deleting the topics of {request.node.name} failed: {exc}")


@pytest.fixture(scope="session")
def registry_connection(connection: Connection, runtime_settings: LocalRuntimeSettings) -> Connection:
    """The local runtime with its schema registry started (built the first
    time), for the tests that read or write Avro through one: the
    connection names it, and the test process's producers and references
    find schemas in it.  Stopped with the runtime (``connection``)."""
    from streaming.adapters.serde.schema_registry import use_connection_registry
    from streaming.local import LocalRuntime

    conn = LocalRuntime(runtime_settings, progress=_say).up(registry=True)
    use_connection_registry(conn)
    return conn


@pytest.fixture(scope="session")
def secure_runtime_settings() -> LocalRuntimeSettings:
    """The secured runtime (``local up --secure``): ``<home>/secure``, sharing the cache."""
    return LocalRuntimeSettings.secure()


@pytest.fixture(scope="session")
def secure_connection(secure_runtime_settings: LocalRuntimeSettings) -> Iterator[Connection]:
    """The secured runtime (SASL_SSL, SCRAM, ACLs on) with its schema registry (its own user and
    password), brought up once, as the job's user ``spark-abs``; stopped at the end only if this
    session started it."""
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(secure_runtime_settings, progress=_say)
    was_running = runtime.status().all_running
    conn = runtime.up(registry=True)
    yield conn
    if not was_running:
        for line in runtime.down():
            _say(line)


@pytest.fixture(scope="session")
def spark(connection: Connection, runtime_settings: LocalRuntimeSettings):
    from streaming.adapters.spark.session import spark_session

    # with Spark's Delta reader: the examples' Delta table is read back through it
    session = spark_session(connection.spark_settings(delta=True), runtime_settings, progress=_say)
    yield session
    session.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic / prefix name of this test's own: its name plus a random suffix."""
    base = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-").lower()[:40]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def lines() -> Iterator[list[str]]:
    """What the library logged during the test (INFO and up, the ``streaming``
    loggers: the lines ``spark-abs run`` prints), one string a line."""
    from streaming.testing import LineCollector

    collector = LineCollector().attach()
    yield collector.lines
    collector.detach()

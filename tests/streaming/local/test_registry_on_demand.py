"""The schema registry is started on demand, without starting real services:
a plain ``up`` neither builds nor starts it (the demo's first run waits for
no Maven build) and its connection names none; ``up(registry=True)`` builds
and starts it, and later plain ``up``s keep it; ``status`` shows a registry
nothing asked for as such, not as a service that is down; ``spark-abs run``
(and ``worker``) ask for it when the pipeline reads or writes Avro through
one.  The builders and starters are stand-ins that record their calls."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from streaming.api.config import LocalRuntimeSettings
from streaming.local import artifacts, processes, s3_server, schema_registry
from streaming.local import runtime as runtime_module
from streaming.local.kafka_broker import KafkaStarter
from streaming.local.runtime import LocalRuntime, RuntimeStatus, ServiceStatus
from streaming.local.s3_server import S3Starter
from streaming.local.schema_registry import RegistryStarter, api_url

KAFKA, CONTROLLER, S3, REGISTRY = 39001, 39002, 39003, 39004


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """What was built and started: the artifacts fetched, the services started."""
    done: list[str] = []

    def built(name: str, result):
        def build(*args, **kwargs):
            done.append(f"build {name}")
            return result

        return build

    jars = artifacts.jars
    monkeypatch.setattr(jars, "require_tool", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(jars, "resolve_jars", built("kafka", [Path("kafka.jar")]))
    monkeypatch.setattr(jars, "connector_jars", built("spark-connector", [Path("connector.jar")]))
    monkeypatch.setattr(s3_server, "build_versitygw", built("s3-server", Path("versitygw")))
    monkeypatch.setattr(schema_registry, "build", built("schema-registry", Path("registry-runner.jar")))
    monkeypatch.setattr(artifacts.kafka_txn, "sender_classpath", built("kafka-sink", [Path("clients.jar")]))
    monkeypatch.setattr(runtime_module, "ensure_bucket", lambda connection: None)
    monkeypatch.setattr(
        KafkaStarter,
        "up",
        lambda self, java, ports: done.append("start kafka") or {"kafka": KAFKA, "kafka_controller": CONTROLLER},
    )
    monkeypatch.setattr(S3Starter, "up", lambda self, binary, ports, taken: done.append("start s3") or S3)

    def registry_up(self, java, runner, ports, taken):
        assert runner == Path("registry-runner.jar") and REGISTRY not in taken
        done.append("start registry")
        return REGISTRY

    monkeypatch.setattr(RegistryStarter, "up", registry_up)
    return done


def _runtime(tmp_path) -> LocalRuntime:
    return LocalRuntime(LocalRuntimeSettings(home=tmp_path), progress=lambda line: None)


def _ports(runtime: LocalRuntime) -> dict[str, int]:
    return json.loads(runtime.services.ports_file.read_text())


def test_a_plain_up_neither_builds_nor_starts_the_registry(tmp_path, calls):
    runtime = _runtime(tmp_path)
    connection = runtime.up()
    assert "build schema-registry" not in calls and "start registry" not in calls
    assert {"build kafka", "build s3-server", "build spark-connector", "start kafka", "start s3"} <= set(calls)
    assert connection.schema_registry == ""
    assert "registry" not in _ports(runtime)
    saved = json.loads(runtime.settings.connection_file.read_text())["connection"]
    assert saved["schema_registry"] == ""


def test_up_with_the_registry_builds_and_starts_it_and_later_ups_keep_it(tmp_path, calls):
    runtime = _runtime(tmp_path)
    runtime.up()
    calls.clear()
    connection = runtime.up(registry=True)
    assert calls.count("build schema-registry") == 1 and calls.count("start registry") == 1
    assert connection.schema_registry == api_url(REGISTRY)
    assert _ports(runtime)["registry"] == REGISTRY
    # a plain up after it (a drill bringing Kafka back, another command) keeps what the runtime has:
    # the connection file names the registry, so it is started again were it down
    calls.clear()
    again = runtime.up()
    assert "start registry" in calls and again.schema_registry == api_url(REGISTRY)
    # down forgets it: the next plain up is the runtime without it
    runtime.down()
    calls.clear()
    assert runtime.up().schema_registry == "" and "start registry" not in calls


def test_a_registry_that_runs_is_kept_by_a_plain_up(tmp_path, calls, monkeypatch):
    runtime = _runtime(tmp_path)
    runtime.up()
    registry = schema_registry.server_spec(runtime.services)
    # another `up --registry` started it meanwhile: its pid file and port are on record
    monkeypatch.setattr(
        processes, "running_pid", lambda pid_path, marker: 4242 if pid_path == registry.pid_path else None
    )
    runtime.services.ports_file.write_text(json.dumps({**_ports(runtime), "registry": REGISTRY}))
    calls.clear()
    connection = runtime.up()
    assert "start registry" not in calls and "build schema-registry" not in calls
    assert connection.schema_registry == api_url(REGISTRY) and _ports(runtime)["registry"] == REGISTRY


def test_status_shows_a_registry_nothing_asked_for_as_such_not_as_down(tmp_path, calls, monkeypatch):
    runtime = _runtime(tmp_path)
    runtime.up()
    monkeypatch.setattr(
        processes, "running_pid", lambda pid_path, marker: None if pid_path.name == "registry.pid" else 7
    )
    monkeypatch.setattr(processes, "port_open", lambda port: True)
    status = runtime.status()
    registry = next(s for s in status.services if s.name == "registry")
    assert (registry.state, registry.address) == ("not built", "-")
    assert status.all_running  # what the runtime runs, runs
    rendered = status.render()
    assert "not built" in rendered and "spark-abs local up --registry" in rendered
    # built, not started
    monkeypatch.setattr(schema_registry, "built", lambda version, cache: True)
    assert next(s for s in runtime.status().services if s.name == "registry").state == "not started"
    # once asked for, a registry that does not run is a service that is down
    runtime.up(registry=True)
    status = runtime.status()
    registry = next(s for s in status.services if s.name == "registry")
    assert registry.state == "stopped" and not status.all_running


def test_a_stopped_service_is_still_an_error_and_on_demand_is_not_running():
    log = Path("x.log")
    kafka = ServiceStatus("kafka", None, "-", False, log)
    registry = ServiceStatus("registry", None, "-", False, log, off="not started")
    assert not RuntimeStatus((kafka, registry), Path("c.json"), None).all_running
    running = ServiceStatus("kafka", 7, "127.0.0.1:1", True, log)
    assert RuntimeStatus((running, registry), Path("c.json"), None).all_running
    assert not registry.running and registry.state == "not started" and kafka.state == "stopped"


def test_fetch_builds_the_registry_as_the_other_artifacts(tmp_path, calls):
    _runtime(tmp_path).fetch()
    assert "build schema-registry" in calls


@pytest.mark.parametrize(("pipeline", "registry"), [("money", False), ("devices", True)])
def test_run_asks_the_local_runtime_for_the_registry_when_the_pipeline_uses_one(
    tmp_path, monkeypatch, pipeline, registry
):
    from streaming.local import LocalRuntime as Exported
    from streaming.tools.cli.options import connection_for

    monkeypatch.delenv("SPARK_ABS_KAFKA_BOOTSTRAP", raising=False)
    asked: list[bool] = []
    monkeypatch.setattr(Exported, "up", lambda self, registry=False: asked.append(registry) or "connection")
    args = argparse.Namespace(home=str(tmp_path))
    assert connection_for(args, pipeline) == "connection"
    assert asked == [registry]

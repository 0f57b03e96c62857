"""The local runtime on real services: idempotent up, status, and the errors
of a broker that cannot start."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from streaming.adapters.objects import open_store
from streaming.api.config import Connection, LocalRuntimeSettings
from streaming.errors import PortInUseError, ServiceStartError
from streaming.local import LocalRuntime

pytestmark = pytest.mark.integration


def test_up_is_idempotent_and_status_tells_what_runs(connection, runtime_settings):
    runtime = LocalRuntime(runtime_settings)
    before = runtime.status()
    assert before.all_running
    again = runtime.up()
    after = runtime.status()
    # the same runtime (its schema registry and its credentials too, when a test of this session started it
    # after the session's connection was made: it is kept)
    registry = dict(schema_registry="", schema_registry_user="", schema_registry_password_file="")
    assert dataclasses.replace(again, **registry) == dataclasses.replace(connection, **registry)
    assert [s.pid for s in after.services] == [s.pid for s in before.services]
    assert Connection.load(runtime_settings, environ={}) == again
    rendered = after.render()
    assert "kafka" in rendered and "s3" in rendered and "running" in rendered


def test_the_s3_server_stores_and_lists_objects_with_the_runtimes_own_keys_only(
    connection, runtime_settings, unique_name
):
    store = open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)
    with store.filesystem.open_output_stream(store.path("a.json")) as out:
        out.write(b'{"ok": true}')
    with store.filesystem.open_input_stream(store.path("a.json")) as src:
        assert src.read() == b'{"ok": true}'
    # the keys are the runtime's own, generated and kept its owner's; the fixed ones an
    # earlier version used (public, in its source) open nothing
    keys_file = runtime_settings.runtime_dir / "secrets" / "s3.keys"
    assert keys_file.stat().st_mode & 0o777 == 0o600
    assert connection.s3_secret_key in keys_file.read_text() and len(connection.s3_secret_key) >= 40
    public = dataclasses.replace(connection, s3_access_key="sparkabs", s3_secret_key="sparkabs-secret")
    with pytest.raises(OSError):
        open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", public).filesystem.open_input_stream(
            store.path("a.json")
        ).read()
    store.filesystem.delete_dir(store.root)


def _second_runtime(tmp_path, runtime_settings: LocalRuntimeSettings, **over) -> LocalRuntime:
    # Its own state dir, the shared artifact cache (nothing is downloaded again).
    return LocalRuntime(LocalRuntimeSettings(home=tmp_path, cache=runtime_settings.cache_dir, **over))


def test_a_kafka_port_in_use_is_a_clear_error(tmp_path, runtime_settings, connection):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        runtime = _second_runtime(tmp_path, runtime_settings, kafka_port=port)
        with pytest.raises(PortInUseError, match=f"port {port}.*Kafka broker"):
            runtime.up()


def test_a_broker_that_is_not_ready_in_time_fails_with_its_log(tmp_path, runtime_settings, connection):
    runtime = _second_runtime(tmp_path, runtime_settings, start_timeout_s=0.5)
    with pytest.raises(ServiceStartError, match=r"kafka did not become ready within 0 s(.|\n)*starting kafka"):
        runtime.up()
    report = runtime.down(purge=True)
    assert report[0] == "kafka: was not running"  # wait_ready already stopped it


def test_down_without_up_stops_nothing(tmp_path, runtime_settings):
    runtime = _second_runtime(tmp_path, runtime_settings)
    assert runtime.down() == ["kafka: was not running", "s3: was not running", "registry: was not running"]
    assert not runtime.status().all_running


def test_a_service_on_ports_not_on_record_is_stopped_one_on_record_kept(tmp_path, runtime_settings):
    """A start interrupted before it wrote ports.json leaves a service up
    on ports nobody knows: ``stop_unrecorded``, the first thing ``up`` does
    under its lock, stops it (and says so) so that ``up`` starts it again on
    ports it records; one whose ports are on record is kept."""
    import subprocess
    import sys
    import time

    from streaming.local import processes, s3_server

    runtime = _second_runtime(tmp_path, runtime_settings)
    services = runtime.services
    s3 = s3_server.server_spec(services)
    s3.pid_path.parent.mkdir(parents=True, exist_ok=True)
    # a process that passes for the S3 server: its command line holds the marker
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", s3.marker])
    try:
        s3.pid_path.write_text(f"{stand_in.pid}\n")
        # until it has exec'd, the child's command line is still pytest's
        deadline = time.monotonic() + 30
        while processes.running_pid(s3.pid_path, s3.marker) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes.running_pid(s3.pid_path, s3.marker) == stand_in.pid
        services.ports_file.write_text('{"s3": 1234}')
        assert services.stop_unrecorded(runtime.specs(), print) == []
        assert stand_in.poll() is None
        services.ports_file.unlink()
        said: list[str] = []
        assert services.stop_unrecorded(runtime.specs(), said.append) == ["s3"]
        assert stand_in.wait(20) is not None
        assert said and "s3 runs on ports not on record" in said[0]
        assert not s3.pid_path.exists()
    finally:
        stand_in.kill()

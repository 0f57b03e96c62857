"""Service processes: pid files are trusted only with their marker, readiness
waits fail with the log tail, ports in use are named."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from streaming.errors import PortInUseError, ServiceStartError
from streaming.local import processes
from streaming.local.processes import ServiceSpec
from streaming.testing import assert_eventually


def _spec(tmp_path, code: str, marker: str = "spark-abs-test-marker") -> ServiceSpec:
    return ServiceSpec(
        name="dummy",
        argv=[sys.executable, "-c", code, marker],
        log_path=tmp_path / "logs" / "dummy.out",
        pid_path=tmp_path / "pids" / "dummy.pid",
        marker=marker,
    )


def test_start_find_and_stop_a_service(tmp_path):
    spec = _spec(tmp_path, "import time; print('hello', flush=True); time.sleep(60)")
    proc = processes.start(spec)
    try:
        assert_eventually(lambda: "hello" in processes.tail(spec.log_path), True, timeout=20)
        assert processes.running_pid(spec.pid_path, spec.marker) == proc.pid
        assert processes.stop(spec.pid_path, spec.marker, grace_s=5) == proc.pid
        assert proc.wait(timeout=5) is not None
        assert not spec.pid_path.exists()
    finally:
        proc.kill()


def test_a_pid_without_the_marker_is_not_ours_and_is_left_alone(tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_path = tmp_path / "other.pid"
        pid_path.write_text(f"{bystander.pid}\n")
        assert processes.running_pid(pid_path, "spark-abs-test-marker") is None
        assert processes.stop(pid_path, "spark-abs-test-marker") is None
        time.sleep(0.2)
        assert bystander.poll() is None  # still alive
    finally:
        bystander.kill()
        bystander.wait()


def test_a_garbled_pid_file_means_not_running(tmp_path):
    pid_path = tmp_path / "x.pid"
    pid_path.write_text("not a pid")
    assert processes.running_pid(pid_path, "m") is None


def test_a_service_that_exits_while_starting_reports_its_log(tmp_path):
    spec = _spec(tmp_path, "import sys; print('bad config: port=banana', flush=True); sys.exit(3)")
    proc = processes.start(spec)
    with pytest.raises(ServiceStartError, match=r"exited with code 3(.|\n)*bad config: port=banana"):
        processes.wait_ready(spec, proc, lambda: False, timeout_s=30)


def test_a_service_not_ready_in_time_is_stopped_and_reports_its_log(tmp_path):
    spec = _spec(tmp_path, "import time; print('still warming up', flush=True); time.sleep(60)")
    proc = processes.start(spec)

    def probe() -> bool:
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(ServiceStartError, match=r"within 1 s(.|\n)*nobody home(.|\n)*still warming up"):
        processes.wait_ready(spec, proc, probe, timeout_s=1)
    assert proc.wait(timeout=10) is not None


def test_port_in_use_is_named():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert not processes.port_is_free(port)
        assert processes.port_open(port)
        with pytest.raises(PortInUseError, match=str(port)):
            processes.ensure_port_free(port, "the Kafka broker")
    assert processes.port_is_free(port)

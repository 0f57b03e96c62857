"""The job runner (which hosts the coordinator) SIGKILLed on the real
runtime: its workers notice that their pipe to it closed and stop, Spark
JVMs included, within a bounded time; a runner started again for the same
job restores from the latest checkpoint that verifies, and the committed
output is exactly that of a run without failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streaming.adapters.objects import open_store
from streaming.adapters.sinks import read_committed_output, sink_location
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.settings import JobSettings
from streaming.engine.runner import JobRunner
from streaming.tools import demo

pytestmark = pytest.mark.integration

ORPHAN_LIMIT_S = 60


def _job_processes(job: str) -> dict[int, int]:
    """pid -> process group of every process of ``job``'s workers: the
    worker processes (by their command line) and everything in their
    process groups (their Spark JVMs)."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        group = int(stat.rsplit(")", 1)[1].split()[2])
        table[int(entry.name)] = (group, command)
    workers = {pid for pid, (_, command) in table.items() if "streaming.engine.worker" in command and job in command}
    return {pid: group for pid, (group, _) in table.items() if pid in workers or group in workers}


def test_a_killed_runner_leaves_no_orphans_and_a_new_runner_restores_exactly_once(connection, tmp_path, unique_name):
    job = f"rd-{unique_name[-8:]}"
    store = f"file://{tmp_path}/store"
    transfers = demo.make_transfers(2400)
    env = {**os.environ, **connection.as_env(), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "runner.log"
    with open(log_path, "wb") as log:
        runner_process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streaming.tools.cli",
                "--home",
                str(tmp_path / "home"),
                "run",
                "streaming.tools.demo:pipeline",
                "--store",
                store,
                "--job",
                job,
                "--interval",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    reader = SnapshotStore(open_store(store, connection), job)
    try:
        deadline = time.monotonic() + 180
        topic = f"{job}.transfers"
        produced = False
        while not reader.completed():
            assert runner_process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            if not produced and "all tasks ready" in log_path.read_text():
                demo.produce_transfers(connection.kafka_bootstrap, topic, transfers[:1200], 2, end=False)
                produced = True
            time.sleep(0.5)
        assert produced, log_path.read_text()
        workers = _job_processes(job)
        assert workers, "no worker process found for the job"
        runner_process.send_signal(signal.SIGKILL)
        runner_process.wait()
        # the workers see their pipe to the runner close and stop, their Spark JVMs with them
        deadline = time.monotonic() + ORPHAN_LIMIT_S
        while _job_processes(job) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _job_processes(job)
        assert not left, f"still running {ORPHAN_LIMIT_S} s after the runner died: {left}\n{log_path.read_text()}"
        # a runner started again for the job restores from the latest checkpoint that verifies
        demo.produce_transfers(connection.kafka_bootstrap, topic, transfers[1200:], 2, end=True)
        lines: list[str] = []
        settings = JobSettings(store=store, interval_s=1)
        again = JobRunner("streaming.tools.demo:pipeline", settings, connection, job=job, say=lines.append)
        try:
            again.start()
            again.run_until_caught_up(240)
        finally:
            again.close()
        (restore,) = again.restores
        assert restore.checkpoint_id is not None and restore.generation == 1, "\n".join(lines)
        output = demo.normalise(read_committed_output(sink_location(settings, job, connection)))
        assert output == demo.expected_output(transfers)
    finally:
        if runner_process.poll() is None:
            runner_process.kill()
        reader.close()

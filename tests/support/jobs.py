"""Jobs the end-to-end tests drive: a money job whose every completed
checkpoint is counted, and a remote worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_abs_examples import money
from streaming.adapters.kafka.ranges import read_range
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.engine.job.runner import JobRunner, RunOptions
from streaming.testing import LineCollector

__all__ = ["MoneyJob", "money_job", "RemoteWorkerProcess"]


@dataclass
class MoneyJob:
    """A money-pipeline job whose every completed checkpoint is counted
    (``money``: balances plus legs in flight, which must add up to zero)."""

    runner: Any  # a streaming.engine.job.runner.JobRunner
    store: Any  # a SnapshotStore on the job's checkpoints
    money: list = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def count(self, checkpoint_id: int) -> None:
        """Count checkpoint ``checkpoint_id`` too (one the coordinator did not complete, e.g. a rescaled one)."""
        kafka = self.runner.connection.kafka
        self.money.append(money.money_in_checkpoint(self.store, checkpoint_id, _range_reader(kafka)))


def _range_reader(kafka: KafkaAccess):
    return lambda channel, start, end: read_range(kafka, channel, start, end)


def money_job(pipeline_ref: str, settings, connection, job: str, options: RunOptions | None = None) -> MoneyJob:
    """A ``JobRunner`` for ``pipeline_ref`` (a money pipeline) whose
    completed checkpoints are counted as they complete, its lines kept."""
    store = SnapshotStore(open_store(settings.store, connection), job, key=UNSIGNED)
    holder: list[MoneyJob] = []
    lines = LineCollector().attach().lines
    runner = JobRunner(
        pipeline_ref,
        settings,
        connection,
        job=job,
        options=options,
        on_complete=lambda cid: holder[0].count(cid),
    )
    holder.append(MoneyJob(runner, store, lines=lines))
    return holder[0]


class RemoteWorkerProcess:
    """A `spark-abs worker --job JOB --pipeline REF --group GROUP` process in a session of its
    own, as a host's process manager would start it, its output in ``log_path``."""

    def __init__(self, job: str, pipeline_ref: str, group: str, connection, log_path: Path):
        self.group, self.log_path = group, log_path
        command = [sys.executable, "-m", "streaming.tools.cli", "worker", "--job", job, "--pipeline", pipeline_ref]
        with open(log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [*command, "--group", group],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **connection.as_env(), "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )

    def said(self, text: str) -> bool:
        return text in self.log_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        """What spark-abs itself said (Spark's own log lines left out)."""
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if "[spark-abs]" in line]

    def kill(self) -> None:
        """SIGKILL the worker and its Spark driver JVM."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def terminate(self) -> None:
        """SIGTERM: the worker stops its tasks and its Spark application, then exits."""
        self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, and the exit status once it stopped (None: it did not, and was killed)."""
        self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

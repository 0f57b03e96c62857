"""The Prometheus metrics without services: the endpoint (served, scraped,
a port in use refused by name), the targets file, the ready event's
endpoint, and the values the coordinator service and a stage task record.
Each test uses a job name of its own, so the process's one registry is
read per job."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from task_cases import batch, make_task

from barriers.coordinator import CheckpointStatus
from barriers.failures import CheckpointFailure
from barriers.messages import ChannelId, CheckpointOptions
from operators import KeyedAggregate, count
from streaming.adapters.kafka.control.events import Ack, ControlEvent, Decline, Ready
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskCheckpointMetrics, TaskParts
from streaming.api.config import MetricsSettings
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.api.settings import JobSettings
from streaming.engine import metrics
from streaming.engine.job.coordinator import CoordinatorIO, CoordinatorService
from streaming.errors import ConfigError
from streaming.testing import scrape


@pytest.fixture
def job() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def _value(name: str, **labels: str) -> float:
    """The sample's value; a series never recorded fails (it is not a 0)."""
    value = metrics.REGISTRY.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return value


# ---- settings, endpoint, targets


def test_settings_give_workers_the_ports_after_the_runners():
    assert MetricsSettings(port=9400).for_worker(0) == MetricsSettings(port=9401)
    assert MetricsSettings(port=9400).for_worker(2).port == 9403
    assert MetricsSettings().for_worker(3).port == 0  # free ports all
    assert MetricsSettings.off().for_worker(1).port is None
    with pytest.raises(ConfigError, match="metrics port"):
        MetricsSettings(port=70000)


def test_the_endpoint_serves_the_registry_and_closes(job):
    metrics.restored(job, "worker_died")
    server = metrics.serve(MetricsSettings(port=0), "--metrics-port")
    try:
        host, port = server.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        samples = scrape(server.url)
        assert samples[("spark_abs_restores_total", (("cause", "worker_died"), ("job_name", job)))] == 1
        assert samples.total("spark_abs_restores_total", job_name=job) == 1
        assert samples.total("process_resident_memory_bytes") > 0
    finally:
        server.close()
    with pytest.raises(OSError):
        scrape(server.url, timeout=2)
    assert metrics.serve(MetricsSettings.off(), "--metrics-port") is None


def test_the_endpoint_answers_only_the_names_it_is_reached_by(job):
    """A web page that rebinds its own name to 127.0.0.1 reaches a loopback
    endpoint with its name in ``Host``: refused, as the web UI refuses it."""
    server = metrics.serve(MetricsSettings(port=0), "--metrics-port")
    try:
        for host, status in (("127.0.0.1", 200), ("localhost", 200), ("evil.example", 400), ("", 400)):
            request = urllib.request.Request(server.url, headers={"Host": f"{host}:1" if host else ""})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    got, body = answer.status, answer.read()
            except urllib.error.HTTPError as refused:
                got, body = refused.code, refused.read()
            assert got == status, (host, got, body[:200])
            if status == 400:
                assert b"answer to 127.0.0.1, ::1, localhost (any port)" in body and b"spark_abs" not in body
    finally:
        server.close()
    # off loopback: the address bound, this host's names and those the operator adds
    named = metrics.metric_hosts("0.0.0.0", {"SPARK_ABS_METRICS_ALLOW_HOST": "prometheus.lan, Scraper:9090"})
    assert {"localhost", socket.gethostname().lower(), "prometheus.lan", "scraper"} <= named
    assert "0.0.0.0" not in named and "evil.example" not in named
    assert metrics.metric_hosts("127.0.0.1", {"SPARK_ABS_METRICS_ALLOW_HOST": "prometheus.lan"}) == {
        "localhost",
        "127.0.0.1",
        "::1",
    }


def test_a_port_in_use_is_refused_naming_the_option():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"run --metrics-port {port}: cannot serve metrics on 127.0.0.1:{port}"):
            metrics.serve(MetricsSettings(port=port), "run --metrics-port")


def test_a_worker_its_runner_started_takes_a_free_port_when_its_own_is_in_use():
    from streaming.engine.worker.worker import _serve_metrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="--metrics-port"):  # a worker started by hand: the user's port
            _serve_metrics(MetricsSettings(port=port), runner_started=False)
        served = _serve_metrics(MetricsSettings(port=port), runner_started=True)
        try:
            assert served is not None and not served.address.endswith(f":{port}")
            assert any(name.startswith("process_") for name, _ in scrape(served.url))
        finally:
            served.close()


def test_workers_ports_past_65535_are_refused_before_anything_starts(tmp_path: Path):
    from streaming.engine.job.supervisor import WorkerSupervisor

    groups = {"a": ["s-0"], "b": ["s-1"]}
    with pytest.raises(ConfigError, match="run --metrics-port 65534: its 2 worker"):
        WorkerSupervisor(
            "x:p", "j", groups, JobSettings(store="file:///x"), tmp_path, metrics=MetricsSettings(port=65534)
        )
    WorkerSupervisor("x:p", "j", groups, JobSettings(store="file:///x"), tmp_path, metrics=MetricsSettings(port=65533))


def test_the_targets_file_lists_the_runner_and_each_worker(tmp_path: Path):
    path = tmp_path / metrics.TARGETS_FILE
    targets = metrics.Targets(path, "j", "127.0.0.1:9400")
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9400"], "labels": {"spark_abs_role": "runner", "spark_abs_job": "j"}}
    ]
    targets.update({"all": "127.0.0.1:41000", "other": ""})  # a worker serving none is left out
    targets.update({"all": "127.0.0.1:41001"})  # a restarted worker's new port replaces its old one
    entries = json.loads(path.read_text())
    assert [e["targets"] for e in entries] == [["127.0.0.1:9400"], ["127.0.0.1:41001"]]
    assert entries[1]["labels"] == {"spark_abs_role": "worker", "spark_abs_job": "j", "spark_abs_worker": "all"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [metrics.TARGETS_FILE]  # no temporary file left


def test_the_ready_event_carries_the_endpoint_and_older_ones_read_without():
    ready = Ready(task="a-0", generation=1, endpoint="host:9401")
    assert ControlEvent.decode(ready.encode()) == ready
    older = json.dumps({"kind": "ready", "checkpoint_id": 0, "task": "a-0", "payload": {"generation": 1}})
    assert ControlEvent.decode(older.encode()).endpoint == ""


def test_modes_are_named_as_the_job_settings_name_them():
    assert metrics.mode_of(CheckpointOptions.aligned()) == "aligned"
    assert metrics.mode_of(CheckpointOptions.aligned_with_timeout(10)) == "aligned-timeout"
    assert metrics.mode_of(CheckpointOptions.unaligned()) == "unaligned"
    assert metrics.mode_of(CheckpointOptions.at_least_once()) == "at-least-once"


# ---- what the coordinator service records


class _Control:
    def __init__(self):
        self.inbox: list[ControlEvent] = []

    def io(self) -> CoordinatorIO:
        return CoordinatorIO(
            inject=lambda markers: {c: 10 for c in markers},
            publish=lambda event: None,
            poll=self._poll,
        )

    def _poll(self, timeout_s):
        events, self.inbox = self.inbox, []
        return events


def _ack(store: SnapshotStore, task: str, checkpoint_id: int) -> Ack:
    measured = TaskCheckpointMetrics(kind="aligned", alignment_s=0.02, sync_snapshot_s=0.003, held_bytes_max=64)
    snapshot = store.write_task(
        checkpoint_id,
        0,
        task,
        TaskParts(
            state={"state": pa.table({"k": ["a"], "n": [1]})},
            positions={f"in:{task[-1]}": 7},
            metadata=measured.to_json(),
        ),
    )
    return Ack(
        checkpoint_id=checkpoint_id,
        task=task,
        generation=0,
        snapshot=snapshot,
        metrics=dataclasses.replace(measured, state_bytes=900, async_snapshot_s=0.4),
    )


def test_the_coordinator_counts_triggers_completions_aborts_and_times_them(job, tmp_path):
    pipeline = Pipeline(job, (Ingress("in", 2),), (Stage("count", ("in",), count_by_k, parallelism=2, sink=Sink()),))
    control = _Control()
    with SnapshotStore(open_store(str(tmp_path / "store")), job, key=UNSIGNED) as store:
        service = CoordinatorService(
            pipeline, control.io(), store, JobSettings(store=f"file://{tmp_path}/store"), job_key=UNSIGNED
        )
        service.trigger()
        service.poll()
        assert _value("spark_abs_checkpoints_triggered_total", job_name=job, mode="aligned") == 1
        assert _value("spark_abs_checkpoints_pending", job_name=job) == 1
        control.inbox = [_ack(store, "count-0", 1), _ack(store, "count-1", 1)]
        service.poll()
        assert _value("spark_abs_checkpoints_completed_total", job_name=job, mode="aligned") == 1
        assert _value("spark_abs_checkpoints_pending", job_name=job) == 0
        assert _value("spark_abs_checkpoint_duration_seconds_count", job_name=job, mode="aligned") == 1
        assert _value("spark_abs_last_checkpoint_id", job_name=job) == 1
        for phase, seconds in (("alignment", 0.02), ("sync", 0.003), ("async", 0.4)):
            labels = {"job_name": job, "task": "count-1", "phase": phase}
            assert _value("spark_abs_task_checkpoint_seconds_count", **labels) == 1
            assert _value("spark_abs_task_checkpoint_seconds_sum", **labels) == pytest.approx(seconds)
        assert _value("spark_abs_checkpoint_state_bytes", job_name=job, task="count-0") == 900
        assert _value("spark_abs_checkpoint_held_bytes_max", job_name=job, task="count-0") == 64

        service.trigger()
        control.inbox = [
            Decline(checkpoint_id=2, task="count-0", generation=0, reason=CheckpointFailure.STORE_FAILURE, detail="x")
        ]
        service.poll()
        assert _value("spark_abs_checkpoints_aborted_total", job_name=job, reason="store_failure") == 1
        assert _value("spark_abs_checkpoints_completed_total", job_name=job, mode="aligned") == 1

        # a restore abandons what is pending: counted aborted, so triggered = completed + aborted again
        service.trigger()
        service.poll()
        assert _value("spark_abs_checkpoints_pending", job_name=job) == 1
        service.abandon(CheckpointFailure.RESTORED, "generation 1 starts")
        assert _value("spark_abs_checkpoints_aborted_total", job_name=job, reason="restored") == 1
        assert _value("spark_abs_checkpoints_pending", job_name=job) == 0
        assert service.records[3].status is CheckpointStatus.ABORTED

    metrics.forget_tasks(job, ["count-0"])
    assert (
        metrics.REGISTRY.get_sample_value("spark_abs_checkpoint_state_bytes", {"job_name": job, "task": "count-0"})
        is None
    )
    assert _value("spark_abs_checkpoint_state_bytes", job_name=job, task="count-1") == 900


def count_by_k():
    return KeyedAggregate("k", {"n": count()})


# ---- what a task records


def test_a_task_counts_records_per_channel_dead_letters_by_reason_and_batches(job):
    pipeline = Pipeline(
        job,
        (Ingress("in", 2),),
        (
            Stage("count", ("in",), count_by_k),
            Stage("sums", ("count",), count_by_k, sink=Sink()),
        ),
    )
    task, recorded = make_task(pipeline)
    task.process_batch(batch(("in", 0, 0, {"k": "a"}), ("in", 0, 1, b"not json"), ("in", 1, 0, {"k": "b"})))
    labels = {"job_name": job, "task": "count-0"}
    assert _value("spark_abs_records_in_total", channel="in:0", **labels) == 2
    assert _value("spark_abs_records_in_total", channel="in:1", **labels) == 1
    assert _value("spark_abs_dead_letters_total", reason="malformed", **labels) == 1 == len(recorded.dead)
    out = str(pipeline.task("count-0").outputs[0])
    assert out == str(ChannelId(pipeline.topic_of("count"), 0))
    assert _value("spark_abs_records_out_total", channel=out, **labels) == len(recorded.sent) > 0
    assert _value("spark_abs_task_batch_seconds_count", **labels) == 1
    assert _value("spark_abs_task_held_bytes", **labels) == 0
    task.metrics.lag(ChannelId("in", 0), 5)
    assert _value("spark_abs_channel_lag_records", channel="in:0", **labels) == 5


def test_a_task_reports_its_watermark_and_its_idle_inputs(job):
    schema = pa.schema([("k", pa.string()), ("ts", pa.int64())])
    pipeline = Pipeline(
        job,
        (Ingress("in", 2, schema, event_time="ts", idle_after_event_time=100),),
        (Stage("count", ("in",), count_by_k, sink=Sink()),),
    )
    task, _ = make_task(pipeline, sink=True)
    labels = {"job_name": job, "task": "count-0"}
    task.process_batch(batch(("in", 0, 0, {"k": "a", "ts": 10}), ("in", 1, 0, {"k": "b", "ts": 20})))
    assert _value("spark_abs_task_watermark_ms", **labels) == 10
    assert _value("spark_abs_task_idle_inputs", **labels) == 0
    task.process_batch(batch(("in", 0, 1, {"k": "a", "ts": 500})))  # partition 1 left behind
    assert _value("spark_abs_task_watermark_ms", **labels) == 500
    assert _value("spark_abs_task_idle_inputs", **labels) == 1


def test_the_metrics_page_lists_every_metric_and_no_other():
    page = (Path(__file__).resolve().parents[3] / "docs" / "operations" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(spark_abs_\w+)` \|", page, re.M))
    kinds = {"counter": "{}_total", "histogram": "{}", "gauge": "{}"}
    defined = {
        kinds[family.type].format(family.name)
        for family in metrics.REGISTRY.collect()
        if family.name.startswith("spark_abs_")
    }
    assert listed == defined

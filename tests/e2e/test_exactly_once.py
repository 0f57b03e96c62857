"""End to end on real Kafka, the S3 server and Spark: the three-stage money
pipeline (keyed balances, event-time windows) is killed with SIGKILL at
chosen points, one per generation, restored each time, and must commit
exactly the output of a run without failures while every completed
checkpoint conserves money.  The runner's and the worker's Prometheus
endpoints are scraped on the way: the checkpoint counters and durations
move, and every restore is counted."""

from __future__ import annotations

import json
import time
import urllib.error

import pyarrow.compute as pc
import pytest

from barriers.handler import CheckpointKind
from spark_abs_examples import money as money_example
from streaming.adapters.kafka.admin import end_offsets
from streaming.adapters.kafka.ranges import read_range
from streaming.adapters.objects import ensure_bucket, open_store
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.settings import JobSettings
from streaming.api.topics import dead_letter_topic
from streaming.engine import metrics
from streaming.engine.faults import ENV as faults_env
from streaming.engine.job.operations import run_until_caught_up
from streaming.engine.job.runner import JobRunner, RunOptions
from streaming.testing import Scrape, scrape
from streaming.tools.checkpoints.inspection import Checkpoints

pytestmark = pytest.mark.integration


def _scrape(runner: JobRunner) -> tuple[Scrape, dict[str, Scrape]]:
    """The runner's metrics, and those of each worker its targets file lists
    that answers (one may be dying just now)."""
    targets = json.loads((runner.log_dir / metrics.TARGETS_FILE).read_text())
    assert targets[0]["targets"] == [runner.endpoints.server.address]
    workers = {}
    for entry in targets[1:]:
        try:
            workers[entry["labels"]["spark_abs_worker"]] = scrape(f"http://{entry['targets'][0]}/metrics")
        except (urllib.error.URLError, OSError):
            pass
    return scrape(runner.endpoints.server.url), workers


# one fault per generation: each restore arms the next
# each point once where it depends on the mode: a kill during a restore in the unaligned mode (it
# replays channel state), before a sink's commit in the aligned one (the commit is the same in both)
FAULTS = [
    ("accounts-0", "mid_batch"),
    ("accounts-1", "during_alignment"),
    ("windows-0", "during_upload"),
    ("windows-0", "before_sink_commit"),
]


def _run(
    connection,
    job: str,
    store: str,
    faults: list[tuple[str, str]],
    *,
    transfers: int,
    chunk: int,
    timeout_s: float,
    lines: list[str],
    **settings,
):
    settings = JobSettings(store=store, interval_s=0.7, timeout_s=60, max_records_per_batch=200, **settings)
    reader = SnapshotStore(open_store(store, connection), job, key=UNSIGNED)
    money = []

    def in_flight(channel, start, end):
        return read_range(connection.kafka, channel, start, end)

    inspector = Checkpoints(reader, kafka=connection.kafka)
    scrapes = []  # at the first completed checkpoint, and at the end

    def on_complete(cid: int) -> None:
        if not scrapes:
            scrapes.append(_scrape(runner))
        money.append(money_example.money_in_checkpoint(reader, cid, in_flight))
        if money[-1].in_flight:  # what `spark-abs state --channels` shows of it, while Kafka holds the ranges
            channels = inspector.channel_state(cid)
            inspected.append((money[-1], channels))

    inspected: list = []
    runner = JobRunner(
        "spark_abs_examples.money:pipeline",
        settings,
        connection,
        job=job,
        options=RunOptions(
            worker_env={faults_env: ",".join(f"{task}:{point}:*:{g}" for g, (task, point) in enumerate(faults))}
        ),
        on_complete=on_complete,
    )
    data = money_example.make_transfers(transfers)
    topic, partitions = runner.pipeline.ingress[0].topic, runner.pipeline.ingress[0].partitions
    deadline = time.monotonic() + timeout_s
    sent = after = 0
    try:
        runner.prepare()
        # feed chunks until every fault fired, then two more
        while sent < len(data) and after < 2 and time.monotonic() < deadline:
            after += len(runner.restores) >= len(faults)
            money_example.produce_transfers(connection.kafka, topic, data[sent : sent + chunk], partitions, end=False)
            sent += chunk
            if runner.coordinator is None:
                runner.start()
            seen, restores = len(money), len(runner.restores)
            while len(money) == seen and len(runner.restores) == restores and time.monotonic() < deadline:
                runner.step()
        money_example.produce_transfers(connection.kafka, topic, [], partitions, end=True)
        run_until_caught_up(runner, max(1.0, deadline - time.monotonic()))
        scrapes.append(_scrape(runner))
    finally:
        runner.close()
    output = money_example.normalise(read_committed_output(sink_location(settings, job, connection)))
    reader.close()
    return runner, data[:sent], money, output, inspected, scrapes


MODES = {
    "aligned": ({}, FAULTS),
    "unaligned-ranges": (
        {"mode": "unaligned"},
        [
            ("accounts-0", "mid_batch"),
            ("windows-0", "during_upload"),
            ("accounts-1", "during_restore"),
        ],
    ),
    "unaligned-copies": (
        {"mode": "unaligned", "in_flight": "records"},
        [("accounts-1", "during_copy"), ("accounts-0", "mid_batch"), ("accounts-0", "during_copy")],
    ),
    # a zero timeout switches every alignment that outlasts one micro-batch
    "aligned-timeout": (
        # (a kill during an upload: the aligned and unaligned modes have it)
        {"mode": "aligned-timeout", "alignment_timeout_ms": 0},
        [("accounts-1", "during_alignment")],
    ),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_kills_at_chosen_points_then_output_equals_a_failure_free_run(connection, unique_name, mode, lines):
    ensure_bucket(connection)
    settings, faults = MODES[mode]
    job = f"e2e-{unique_name[-8:]}"
    store = f"s3://{connection.s3_bucket}/{unique_name}"
    runner, sent, money, output, inspected, scrapes = _run(
        connection, job, store, faults, transfers=6000, chunk=300, timeout_s=420, lines=lines, **settings
    )
    log = "\n".join(lines)
    fired = [r.reason for r in runner.restores]
    assert len(runner.restores) == len(faults), f"restores: {fired}\n{log}"
    assert [r.generation for r in runner.restores] == list(range(1, len(faults) + 1))
    assert money and all(m.total == 0 for m in money), money
    assert any(m.accounts > 0 for m in money)  # an unaligned snapshot may come before any leg arrived
    expected = money_example.expected_output(sent)
    assert len(output) == len(expected)
    assert output == expected
    dead = sum(end_offsets(connection.kafka, dead_letter_topic(job), 1).values())
    assert dead == 0
    kinds = {kind for record in runner.checkpoints() for kind in record.kinds}
    if mode.startswith("unaligned"):
        assert CheckpointKind.UNALIGNED in kinds
        assert any(m.in_flight for m in money) or any(r.in_flight for r in runner.checkpoints()), (
            "no checkpoint had channel state: the unaligned path was not exercised"
        )
        # channel state as `spark-abs state --channels` reads it: held as its mode keeps it, the same money
        for checked, channels in inspected:
            assert not channels.problems, channels.problems
            held = set(channels.records["held"].to_pylist())
            assert held == ({"copied"} if mode == "unaligned-copies" else {"kafka"}), (checked, held)
            legs = channels.rows.filter(pc.starts_with(channels.rows["task"], "accounts-"))
            assert (pc.sum(legs["amount"]).as_py() or 0) == checked.in_flight, checked
    if mode == "aligned-timeout":
        assert CheckpointKind.TIMED_OUT_TO_UNALIGNED in kinds, kinds
    _check_metrics(job, scrapes, runner, len(faults), settings.get("mode", "aligned"))


def _check_metrics(job: str, scrapes, runner: JobRunner, restores: int, mode: str) -> None:
    """Between the first completed checkpoint and the end, the runner's
    checkpoint counters and duration histograms moved and every restore was
    counted; the last generation's worker counted its records and is listed."""
    (first, _), (last, workers) = scrapes
    for name in (
        "spark_abs_checkpoints_triggered_total",
        "spark_abs_checkpoints_completed_total",
        "spark_abs_checkpoint_duration_seconds_count",
        "spark_abs_checkpoint_duration_seconds_sum",
    ):
        assert last.total(name, job_name=job) > first.total(name, job_name=job) > 0, name
    completed = sum(r.status == "completed" for r in runner.checkpoints())
    assert last.total("spark_abs_checkpoints_completed_total", job_name=job) == completed
    # the job's mode; the drain's last checkpoint is aligned whatever the mode
    assert last.total("spark_abs_checkpoints_completed_total", job_name=job, mode=mode) > 0
    for phase in ("alignment", "sync", "async"):
        moved = last.total("spark_abs_task_checkpoint_seconds_count", job_name=job, task="accounts-0", phase=phase)
        assert moved > first.total(
            "spark_abs_task_checkpoint_seconds_count", job_name=job, task="accounts-0", phase=phase
        )
    assert last.total("spark_abs_restores_total", job_name=job, cause="worker_died") == restores
    assert last.total("spark_abs_restores_total", job_name=job) == restores
    assert last.total("spark_abs_generation", job_name=job) == runner.restores[-1].generation == restores
    assert last.total("spark_abs_checkpoint_state_bytes", job_name=job, task="accounts-0") > 0
    (worker,) = workers.values()
    assert worker.total("spark_abs_records_in_total", job_name=job, task="legs-0") > 0
    assert worker.total("spark_abs_records_out_total", job_name=job, task="accounts-0") > 0
    assert worker.total("spark_abs_task_batch_seconds_count", job_name=job) > 0

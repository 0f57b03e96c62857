"""The job runner's decisions that need no running job
(``streaming.engine.job.runner``): a failure that repeats at one place
stops the job with where and what to do, and records to skip are refused
on a channel no task reads or one Spark code prepares."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from barriers.coordinator import CheckpointStatus
from spark_abs_examples import devices, money
from streaming.api.settings import JobSettings
from streaming.engine.job.runner import SAME_FAILURES, JobRunner, check_skip_records
from streaming.errors import ConfigError, JobFailed

DIED = "worker w0 died: task legs-0 failed on money.transfers:1 offsets {}..{}: ZeroDivisionError: division by zero"


def runner(completed: list[int]):
    checkpoints = [SimpleNamespace(checkpoint_id=c, status=CheckpointStatus.COMPLETED) for c in completed]
    return SimpleNamespace(job="money", _failures=[], checkpoints=lambda: checkpoints)


def test_a_task_failing_at_one_place_restore_after_restore_stops_the_job_saying_how_to_skip_the_records():
    job = runner([4])
    for attempt in range(SAME_FAILURES - 1):
        JobRunner._stop_a_repeated_failure(job, DIED.format(40 + attempt, 199))  # micro-batches cut elsewhere
    with pytest.raises(JobFailed) as stopped:
        JobRunner._stop_a_repeated_failure(job, DIED.format(42, 180))
    said = str(stopped.value)
    assert f"task legs-0 failed {SAME_FAILURES} times in a row on money.transfers:1" in said
    assert "restored from checkpoint 4 each time, with: ZeroDivisionError: division by zero" in said
    assert "--restore 4 --skip-records money.transfers:1:42-180" in said


def test_failures_between_which_a_checkpoint_completed_or_elsewhere_or_unsaid_go_on_restoring():
    completed = [4]
    job = runner(completed)
    job.checkpoints = lambda: [SimpleNamespace(checkpoint_id=c, status=CheckpointStatus.COMPLETED) for c in completed]
    JobRunner._stop_a_repeated_failure(job, DIED.format(40, 199))
    JobRunner._stop_a_repeated_failure(job, DIED.format(40, 199))
    completed.append(5)  # the job got further: not the same place
    JobRunner._stop_a_repeated_failure(job, DIED.format(40, 199))
    JobRunner._stop_a_repeated_failure(job, "worker w0 died")
    JobRunner._stop_a_repeated_failure(job, "worker w0 died")
    JobRunner._stop_a_repeated_failure(job, "worker w0 died")  # nothing said where: a kill, a crash elsewhere


def test_records_to_skip_must_be_on_a_channel_a_task_of_python_reads():
    check_skip_records(money.pipeline("m"), JobSettings(store="file:///s", skip_records=["m.transfers:1:0-9"]))
    with pytest.raises(ConfigError, match="no task reads m.transfers:7"):
        check_skip_records(money.pipeline("m"), JobSettings(store="file:///s", skip_records=["m.transfers:7:0-9"]))
    with pytest.raises(ConfigError, match="stage events-by-id reads d.events:0 with Spark code"):
        check_skip_records(devices.pipeline("d"), JobSettings(store="file:///s", skip_records=["d.events:0:0-9"]))

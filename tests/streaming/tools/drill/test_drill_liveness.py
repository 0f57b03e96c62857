"""The drill's liveness kinds, without services: a worker frozen (SIGSTOP)
until the runner kills it, or continued (SIGCONT) when it did not; a send
stuck by the fault armed in the running worker; the delivery timeout the
drilled job runs with; the time a stuck send has to be noticed before the
recovery limit counts."""

from __future__ import annotations

import random
import subprocess
import threading
import time
import types
from pathlib import Path

import pytest

from spark_abs_examples import money
from streaming.api.settings import Mode
from streaming.engine import faults
from streaming.tools.drill import run as drill
from streaming.tools.drill.failures import FailureInjector
from streaming.tools.drill.job import DrilledJob, is_running
from streaming.tools.drill.plan import Failure, FailureKind, FailureOutcome, LivenessBounds
from streaming.tools.drill.settings import DrillSettings


def _poll(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _injector(job, problems: list[str], wait=_poll, recover_timeout_s: float = 1.0) -> FailureInjector:
    return FailureInjector(
        job,
        types.SimpleNamespace(before=lambda generation: {}),
        runtime=None,
        wait=wait,
        log=print,
        problems=problems,
        started=0.0,
        recover_timeout_s=recover_timeout_s,
    )


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def worker():
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_a_frozen_worker_the_runner_kills_is_gone_and_one_it_does_not_is_continued(worker):
    job = types.SimpleNamespace(worker_pids=lambda: [worker.pid])
    injector = _injector(job, [])
    frozen = Failure(0, FailureKind.WORKER_FROZEN, 1.0, outage_s=0.3)
    outcome = FailureOutcome(frozen, 0.0)
    seen = []
    sampler = threading.Timer(0.1, lambda: seen.append(_state(worker.pid)))
    sampler.start()
    injector._freeze(outcome, random.Random(1))
    sampler.join()
    assert seen == ["T"]  # stopped while frozen
    assert _state(worker.pid) in ("S", "R") and is_running(worker.pid)  # continued: the runner did not kill it
    assert outcome.note == f"worker {worker.pid} still there after 0 s frozen: continued"

    # the runner kills it (SIGKILL ends a stopped process): the drill stops waiting, nothing to continue
    killer = threading.Timer(0.2, worker.kill)
    killer.start()
    outcome = FailureOutcome(Failure(1, FailureKind.WORKER_FROZEN, 1.0, outage_s=30.0), 0.0)
    began = time.monotonic()
    injector._freeze(outcome, random.Random(1))
    assert time.monotonic() - began < 5.0 and not is_running(worker.pid)  # a zombie until reaped counts as gone
    assert outcome.note.startswith(f"worker {worker.pid} frozen, gone ")

    outcome = FailureOutcome(frozen, 0.0)
    assert not _injector(types.SimpleNamespace(worker_pids=lambda: []), [])._freeze(outcome, random.Random(1))
    assert outcome.note == "no worker process to freeze"


def test_a_worker_frozen_when_the_drill_stops_is_continued(worker):
    def stopping(condition, timeout_s):  # the runner exited: the drill's poll raises
        raise RuntimeError("the job runner exited")

    injector = _injector(types.SimpleNamespace(worker_pids=lambda: [worker.pid]), [], wait=stopping)
    outcome = FailureOutcome(Failure(0, FailureKind.WORKER_FROZEN, 1.0, outage_s=30.0), 0.0)
    with pytest.raises(RuntimeError):
        injector._freeze(outcome, random.Random(1))
    assert _state(worker.pid) in ("S", "R")


def test_a_stuck_send_is_armed_for_the_tasks_next_checkpoint_and_noticed_within_its_time(tmp_path, monkeypatch):
    fault_file = tmp_path / "faults"
    job = types.SimpleNamespace(
        fault_file=fault_file,
        completed=lambda: [4],
        generation=lambda: 2,
        restores=lambda: [],
        quietly=lambda read: None,
    )
    waits: list[float] = []

    def wait(condition, timeout_s):
        waits.append(timeout_s)
        return False

    problems: list[str] = []
    injector = _injector(job, problems, wait=wait, recover_timeout_s=180.0)
    bounds = LivenessBounds.of(20.0)
    failure = Failure(0, FailureKind.STUCK_SEND, 1.0, task="accounts-1", notice_s=bounds.stuck_notice_s())
    armed = []
    monkeypatch.setattr(faults, "arm", lambda path, entries: armed.append((path, list(entries))))
    outcome = injector.inject(failure, random.Random(1))
    # armed in the running generation for any checkpoint, disarmed once the wait ended
    assert armed == [(str(fault_file), ["accounts-1:stuck_send:*:2"]), (str(fault_file), [])]
    assert faults.parse(armed[0][1][0]) == [("accounts-1", "stuck_send", None, 2)]
    # the limit counts once the job had the failed checkpoints it tolerates to notice: 180 + 4 * 60
    assert waits == [420.0] and not outcome.recovered
    assert problems == [
        "failure 1 (accounts-1 stuck for good in a send (stuck_send)): no checkpoint completed within 420 s"
    ]


def test_the_drilled_job_runs_with_the_drills_delivery_timeout(tmp_path):
    settings = DrillSettings(
        pipeline="spark_abs_examples.money:pipeline",
        mode=Mode.ALIGNED,
        store_uri=f"file://{tmp_path / 'store'}",
        report_dir=tmp_path / "report",
    )
    command = DrilledJob(None, "drill-d", settings, max_restores=10).runner_command()
    assert "--delivery-timeout" not in command  # a job's own
    shortened = DrillSettings(**{**settings.__dict__, "delivery_timeout_s": 20.0})
    command = DrilledJob(None, "drill-d", shortened, max_restores=10).runner_command()
    assert command[command.index("--delivery-timeout") + 1] == "20"


def test_long_outages_need_the_local_runtime_and_a_long_store_outage_an_s3_store():
    from streaming.errors import ConfigError

    runtime = types.SimpleNamespace(settings=types.SimpleNamespace(is_cluster=False))
    for kind in (FailureKind.BROKER_LONG, FailureKind.STORE_LONG):
        with pytest.raises(ConfigError, match="stop services of the local runtime"):
            drill._check_kinds([kind], None, "s3://b/drills")
    with pytest.raises(ConfigError, match="failure kind store-long stops the S3 server"):
        drill._check_kinds([FailureKind.STORE_LONG], runtime, "file:///tmp/x")
    drill._check_kinds([FailureKind.WORKER_FROZEN, FailureKind.STUCK_SEND], None, "file:///tmp/x")
    with pytest.raises(ConfigError, match="delivery timeout must be positive"):
        drill.run_drill(DrillSettings(delivery_timeout_s=-1.0))
    # every task can be stuck in a send: each flushes what it sent before its snapshot
    pipeline = money.pipeline("plan")
    assert drill.fault_pools(pipeline, Mode.UNALIGNED)["stuck_send"] == [t.name for t in pipeline.tasks()]


def test_a_kind_that_must_restore_and_did_not_is_named_so_when_checkpoints_went_on(worker):
    """The engine before liveness: a frozen worker is continued and the job
    goes on in its generation; the drill says it did not restore."""
    completed = [4]
    job = types.SimpleNamespace(
        worker_pids=lambda: [worker.pid],
        completed=lambda: list(completed),
        generation=lambda: 0,
        generation_of=lambda checkpoint_id: 0,
        restores=lambda: [],
    )

    def wait(condition, timeout_s):
        completed.append(completed[-1] + 1)  # the job goes on, in generation 0
        return _poll(condition, min(timeout_s, 0.3))

    problems: list[str] = []
    outcome = _injector(job, problems, wait=wait).inject(
        Failure(0, FailureKind.WORKER_FROZEN, 1.0, outage_s=20.4), random.Random(1)
    )
    assert not outcome.recovered and outcome.restored_from == []
    assert outcome.note == f"worker {worker.pid} still there after 20 s frozen: continued"
    assert problems == [
        "failure 1 (worker frozen (SIGSTOP) for up to 20 s, past the heartbeat timeout): checkpoints completed, but "
        "the job did not restore within 1 s, and it must"
    ]

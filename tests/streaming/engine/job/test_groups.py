"""Which worker runs which tasks: one Spark application per job by default,
one per stage on request, and a kill by stage or task name finds its worker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_abs_examples.money import pipeline
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.job.groups import worker_groups
from streaming.engine.job.supervisor import WorkerProcess, WorkerSupervisor
from streaming.errors import ConfigError, SparkAbsError


def test_a_job_is_one_worker_by_default_and_one_per_stage_on_request():
    demo = pipeline("j")
    everything = [t.name for t in demo.tasks()]
    assert worker_groups(demo, None) == worker_groups(demo, "one") == {"all": everything}
    assert worker_groups(demo, "per-stage") == {
        "legs": ["legs-0", "legs-1"],
        "accounts": ["accounts-0", "accounts-1"],
        "windows": ["windows-0"],
    }
    assert worker_groups(demo, {"a": everything}) == {"a": everything}
    with pytest.raises(ConfigError, match="per-stage"):
        worker_groups(demo, "two")


def test_a_worker_is_found_by_its_name_or_a_task_or_stage_it_runs(tmp_path: Path):
    supervisor = WorkerSupervisor("m:p", "j", {}, JobSettings(store="file:///x"), tmp_path)
    process = subprocess.Popen(["true"])
    process.wait()
    supervisor.workers = {
        "all": WorkerProcess("all", ["legs-0", "accounts-0", "accounts-1"], process, tmp_path / "a.log"),
        "w": WorkerProcess("w", ["windows-0"], process, tmp_path / "w.log"),
    }
    assert supervisor.worker_of("all").name == "all"
    assert supervisor.worker_of("accounts").name == "all"
    assert supervisor.worker_of("accounts-1").name == "all"
    assert supervisor.worker_of("windows").name == "w"
    with pytest.raises(SparkAbsError, match="no worker, task or stage called 'sums'"):
        supervisor.worker_of("sums")


def test_remote_groups_are_the_jobs_own_and_are_not_started_or_killed_here(tmp_path: Path):
    from streaming.api.config import Connection
    from streaming.engine.job.operations import kill_worker
    from streaming.engine.job.runner import JobRunner, RunOptions

    connection = Connection(KafkaAccess("127.0.0.1:9"), "http://127.0.0.1:9", "a", "b", "bucket", job_secret="s" * 32)
    settings = JobSettings(store=f"file://{tmp_path}/store")
    with pytest.raises(ConfigError, match="remote worker groups sums: the job's groups are accounts, legs, windows"):
        JobRunner(
            "spark_abs_examples.money:pipeline",
            settings,
            connection,
            options=RunOptions(workers="per-stage", remote={"sums"}),
        )
    runner = JobRunner(
        "spark_abs_examples.money:pipeline",
        settings,
        connection,
        options=RunOptions(workers="per-stage", remote={"windows"}, log_dir=tmp_path / "logs"),
    )
    try:
        assert runner.layout.remote_names == {"windows"}
        assert sorted(runner.supervisor.groups) == ["accounts", "legs"]  # started here
        assert runner.remote.groups.groups == {"windows": ["windows-0"]}
        assert runner.remote.groups.missing() == ["windows"]
        with pytest.raises(SparkAbsError, match="remote worker group windows: kill its process on its host"):
            kill_worker(runner, "windows-0")
    finally:
        runner.store.close()


def test_a_worker_of_the_runner_before_is_told_to_pause_and_waited_for_until_it_answers_this_runner(tmp_path: Path):
    from streaming.api.config import Connection
    from streaming.engine.job.runner import JobRunner, RunOptions
    from streaming.engine.remote.membership import ActionKind, Heartbeat, Membership

    class Leases:  # what the runner would publish
        def __init__(self):
            self.published = []

        def renew(self, lease):
            self.published.append(lease)

    connection = Connection(KafkaAccess("127.0.0.1:9"), "http://127.0.0.1:9", "a", "b", "bucket", job_secret="s" * 32)
    settings = JobSettings(store=f"file://{tmp_path}/store")
    runner = JobRunner(
        "spark_abs_examples.money:pipeline",
        settings,
        connection,
        options=RunOptions(remote=True, log_dir=tmp_path / "logs"),
    )
    try:
        runner.remote._renewal = leases = Leases()
        # a worker of the runner before this one, still running generation 3's tasks
        worker = Membership(runner.job, "all", "h:1:abc", running=3, started=3)
        runner.remote.paused = (4, "checkpoint 7 is being rescaled to accounts=3")
        runner.remote.renew()
        # its heartbeat answers the runner before: it joins nothing, and the pause waits for it
        runner.remote.observe([Heartbeat("all", "h:1:abc", "h", 3, 41, runner="old:1:xyz")])
        assert runner.remote.groups.members == {} and runner.remote.groups.still_running() == ["all"]
        pause = leases.published[-1]
        assert (pause.generation, pause.checkpoint, pause.members) == (4, None, {})
        action = worker.on_lease(pause)
        assert action is not None and action.kind is ActionKind.STOP and "being rescaled" in action.reason
        # stopped, it answers this runner: it joins, and says its tasks stopped
        runner.remote.observe([Heartbeat("all", "h:1:abc", "h", None, 42, runner=pause.runner)])
        assert runner.remote.groups.members == {"all": "h:1:abc"} and runner.remote.groups.still_running() == []
        runner.remote.paused = None
        assert runner.remote.lease().members == {"all": "h:1:abc"}  # the next generation names it again
    finally:
        runner.store.close()


def test_job_groups_split_local_from_remote_and_know_the_scale_they_run_at():
    from streaming.api.pipeline import Scale
    from streaming.engine.job.groups import JobGroups

    declared = pipeline("j")
    groups = JobGroups(declared, declared, "per-stage", {"windows"})
    assert sorted(groups.local) == ["accounts", "legs"] and groups.remote == {"windows": ["windows-0"]}
    assert groups.scale is None  # as the code declares
    rescaled = declared.rescaled(Scale({"accounts": 3}))
    groups.at(rescaled)
    assert groups.local["accounts"] == ["accounts-0", "accounts-1", "accounts-2"]
    assert groups.scale == rescaled.scale and groups.pipeline is rescaled
    with pytest.raises(SparkAbsError, match="workers must run every task exactly once"):
        JobGroups(declared, declared, {"a": ["legs-0"]}, False)
    assert JobGroups(declared, declared, None, True).remote_names == {"all"}
    # a mapping of the tasks at the job's scale, not the declared one's
    everything = [t.name for t in rescaled.tasks()]
    assert JobGroups(declared, rescaled, {"w": everything}, False).local == {"w": everything}

"""The drill's cluster kinds (``spark-abs drill --cluster``), without
services: which kinds each deployment draws, the plan's targets, whether a
kind must restore or must not, the lease and heartbeats the drill watches,
the remote workers it runs as a process manager would (``sleep`` processes
stand in for them), and each cluster kind struck and checked with the
runner, the runtime and the control topic stood in for."""

from __future__ import annotations

import collections
import dataclasses
import random
import subprocess
import threading
import time
import types

import pytest

from spark_abs_examples import money
from streaming.adapters.kafka.admin import lagging_replicas, watched
from streaming.adapters.kafka.control.events import Heartbeat, Lease
from streaming.api.config import Connection, KafkaAccess, LocalRuntimeSettings
from streaming.api.job_key import JobKey
from streaming.api.settings import Mode
from streaming.engine import faults
from streaming.errors import ConfigError, KafkaUnavailableError, SparkAbsError
from streaming.tools.drill import cluster as drill_cluster
from streaming.tools.drill import run as drill
from streaming.tools.drill.failures import FailureInjector
from streaming.tools.drill.feed import ProgressWatch
from streaming.tools.drill.job import MAX_RESTARTS, DrilledJob, WorkerHosts, pid_of
from streaming.tools.drill.plan import (
    RUNNER_RESTARTS,
    Failure,
    check_kinds,
    cluster_targets,
    restore_problem,
    side_wait_s,
)
from streaming.tools.drill.run import CLUSTER_KINDS, CLUSTER_ONLY, KINDS, FailureKind, FailureOutcome
from streaming.tools.drill.settings import DrillSettings

NODES = ["kafka-1", "kafka-2", "kafka-3"]
SPARK_WORKERS = ["spark-worker-1", "spark-worker-2"]


def _pools():
    pipeline = money.pipeline("plan")
    return drill.fault_pools(pipeline, Mode.ALIGNED) | cluster_targets(pipeline, NODES, SPARK_WORKERS)


def test_the_cluster_draws_its_own_kinds_and_the_local_runtime_keeps_its_own():
    assert tuple(FailureKind(k) for k in ("worker", "runner", "broker", "store", "damage", "worker-frozen")) == KINDS
    assert set(CLUSTER_KINDS) == {*CLUSTER_ONLY, FailureKind.WORKER, FailureKind.STORE, FailureKind.DAMAGE}
    check_kinds(KINDS, cluster=False)
    check_kinds(CLUSTER_KINDS, cluster=True)
    check_kinds([FailureKind.RETENTION], cluster=True)
    with pytest.raises(ConfigError, match="group, runner-remote strike the local cluster: drill with --cluster"):
        check_kinds([FailureKind.WORKER, FailureKind.GROUP, FailureKind.RUNNER_REMOTE], cluster=False)
    with pytest.raises(ConfigError, match="runner, broker are the local runtime's; on the cluster use runner-remote, "):
        check_kinds([FailureKind.RUNNER, FailureKind.BROKER], cluster=True)
    with pytest.raises(ConfigError, match="worker-frozen, stuck-send are drilled on the local runtime only"):
        check_kinds([FailureKind.WORKER_FROZEN, FailureKind.STUCK_SEND], cluster=True)
    # refused before any runtime starts
    with pytest.raises(ConfigError, match="drill with --cluster"):
        drill.run_drill(DrillSettings(kinds=["spark-worker"]))
    with pytest.raises(ConfigError, match="on the cluster use broker-node"):
        drill.run_drill(DrillSettings(kinds=["broker"], cluster=True))
    embedded = types.SimpleNamespace(settings=LocalRuntimeSettings())
    with pytest.raises(ConfigError, match=r"runs on the local cluster \(spark-abs local up --cluster\)"):
        drill._check_kinds([FailureKind.GROUP], embedded, "s3://b/drills", cluster=True)


def test_a_cluster_plan_strikes_every_kind_in_rounds_each_at_a_target_of_its_pool():
    plan = drill.plan_failures(16, 3, CLUSTER_KINDS, _pools(), 1.0)
    assert collections.Counter(f.kind for f in plan) == {kind: 2 for kind in CLUSTER_KINDS}
    assert plan == drill.plan_failures(16, 3, CLUSTER_KINDS, _pools(), 1.0)
    stages = {"legs", "accounts", "windows"}
    for failure in plan:
        if failure.kind is FailureKind.BROKER_NODE:
            assert failure.target in NODES and 5.0 <= failure.outage_s <= 15.0
        elif failure.kind is FailureKind.SPARK_WORKER:
            assert failure.target in SPARK_WORKERS and 5.0 <= failure.outage_s <= 15.0
        elif failure.kind in (FailureKind.GROUP, FailureKind.GROUP_STANDBY):
            assert failure.target in stages
        elif failure.kind is FailureKind.RUNNER_REMOTE:
            assert failure.moment in RUNNER_RESTARTS
        else:
            assert failure.target == ""
    described = {
        Failure(0, FailureKind.BROKER_NODE, 1.0, outage_s=7.0, target="kafka-2").describe(),
        Failure(0, FailureKind.GROUP_STANDBY, 1.0, target="windows").describe(),
        Failure(0, FailureKind.RUNNER_REMOTE, 1.0, RUNNER_RESTARTS[0]).describe(),
    }
    assert described == {
        "Kafka node kafka-2 SIGKILLed, down for 7 s or more",
        "the member of worker group windows SIGKILLed, a standby waiting",
        "job runner of remote members SIGKILLed, started again after its lease lapsed",
    }
    with pytest.raises(ConfigError, match="spark-worker has nothing to strike here: a Spark worker"):
        drill.plan_failures(1, 1, [FailureKind.SPARK_WORKER], drill.fault_pools(money.pipeline("p"), Mode.ALIGNED), 1)


def test_a_broker_node_or_spark_worker_must_not_restore_and_a_group_or_the_runner_must():
    def problem(kind, restored, recovered=5.0):
        return restore_problem(FailureOutcome(Failure(2, kind, 1.0, target="x"), 0.0, restored, recovered_s=recovered))

    for kind in (FailureKind.BROKER_NODE, FailureKind.SPARK_WORKER):
        assert problem(kind, []) is None
        assert "the job restored (from checkpoint 4), and it must go on without one" in problem(kind, [4])
    for kind in (FailureKind.GROUP, FailureKind.GROUP_STANDBY, FailureKind.RUNNER_REMOTE):
        assert problem(kind, [4]) is None and problem(kind, [None]) is None
        assert problem(kind, []).startswith("failure 3 (") and "without a restore" in problem(kind, [])
    # the local kinds may or may not restore; a failure not recovered is a problem of its own
    assert problem(FailureKind.STORE, [4]) is None and problem(FailureKind.WORKER, []) is None
    assert problem(FailureKind.GROUP, [], recovered=None) is None


def _lease(members: dict[str, str], generation: int = 1) -> Lease:
    return Lease(
        runner="host:1:abc",
        generation=generation,
        checkpoint=4,
        pipeline="spark_abs_examples.money:pipeline",
        job="drill-x",
        settings="{}",
        scale=None,
        groups={"legs": ["legs-0"], "windows": ["windows-0"]},
        members=members,
        timeout_s=8.0,
    )


def test_the_watch_keeps_the_latest_lease_and_each_workers_latest_heartbeat():
    now = [10.0]
    watch = ProgressWatch(
        KafkaAccess("b:9092"),
        money.pipeline("w"),
        JobKey.derive("s" * 32, "w", cluster="test-cluster"),
        threading.Event(),
        clock=lambda: now[0],
    )
    assert watch.members() == {}
    watch.take([_lease({"legs": "h:11:a"}), Heartbeat("legs", "h:11:a", "h", 1)])
    now[0] = 12.0
    watch.take([_lease({"legs": "h:11:a", "windows": "h:12:b"}, 2), Heartbeat("windows", "h:12:b", "h", None)])
    assert watch.members() == {"legs": "h:11:a", "windows": "h:12:b"}
    assert watch.heartbeats(since=0.0) == {
        "h:11:a": Heartbeat("legs", "h:11:a", "h", 1),
        "h:12:b": Heartbeat("windows", "h:12:b", "h", None),
    }
    assert set(watch.heartbeats(since=11.0)) == {"h:12:b"}
    assert pid_of("host-a:4242:9f3c1e") == 4242 and pid_of("nonsense") is None


@pytest.fixture
def hosts(tmp_path):
    """Remote workers stood in for by ``sleep`` processes in sessions of their own (killed as the real ones are)."""
    commands = []

    def spawn(command, log_path, env):
        commands.append((command, log_path, env))
        return subprocess.Popen(["sleep", "120"], start_new_session=True)

    hosts = WorkerHosts("drill-x", "money", ["legs", "windows"], {"SPARK_ABS_X": "1"}, tmp_path / "workers", spawn)
    hosts.commands = commands
    hosts.runners = []  # the stand-ins for the runner
    yield hosts
    hosts.stop(timeout_s=5.0)
    for runner in hosts.runners:
        runner.kill()
        runner.wait()


def test_the_drill_starts_a_worker_for_a_group_left_with_none_as_a_process_manager_would(hosts, tmp_path):
    for group in hosts.groups:
        hosts.start(group)
    command, log_path, env = hosts.commands[0]
    assert command[-8:] == [
        "streaming.tools.cli",
        "worker",
        "--job",
        "drill-x",
        "--pipeline",
        "money",
        "--group",
        "legs",
    ]
    assert log_path == tmp_path / "workers" / "legs-1.log" and env["SPARK_ABS_X"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert hosts.supervise() == []
    legs = hosts.alive("legs")[0]
    assert hosts.process(f"host:{legs.pid}:ab12cd") is legs and hosts.process("host:1:ab12cd") is None
    standby = hosts.start("legs")  # a second worker of a group waits as its standby
    hosts.kill(legs)
    assert hosts.supervise() == [] and hosts.alive("legs") == [standby]  # the standby is left: nothing started
    hosts.kill(standby)
    assert hosts.supervise() == ["legs"] and len(hosts.alive("legs")) == 1
    assert hosts.commands[-1][1] == tmp_path / "workers" / "legs-3.log"
    assert sorted(hosts.pids()) == sorted(p.pid for p in hosts.alive())


def test_with_remote_groups_the_runner_starts_no_worker_and_the_workers_see_the_fault_file(tmp_path):
    connection = Connection(KafkaAccess("b:9092"), "http://127.0.0.1:9000", "k", "s", "bucket", job_secret="s" * 32)
    settings = DrillSettings(
        pipeline="spark_abs_examples.money:pipeline",
        mode=Mode.ALIGNED,
        interval_s=1.0,
        store_uri=f"file://{tmp_path / 'store'}",
        report_dir=tmp_path / "report",
    )
    local = DrilledJob(connection, "drill-r", settings, max_restores=10)
    assert local.hosts is None and "--remote-workers" not in local.runner_command()
    remote = DrilledJob(connection, "drill-r", settings, max_restores=10, remote_groups=["legs", "accounts", "windows"])
    command = remote.runner_command()
    assert command[command.index("--workers") :] == [
        "--workers",
        "per-stage",
        "--remote-workers",
        "--heartbeat-timeout",
        "8",
    ]
    assert remote.hosts.groups == ["legs", "accounts", "windows"]
    assert remote.hosts.env[faults.FILE_ENV] == str(tmp_path / "report" / "faults")
    assert remote.hosts.env["SPARK_ABS_KAFKA_BOOTSTRAP"] == "b:9092"
    one = DrilledJob(
        connection, "drill-r", dataclasses.replace(settings, workers="one"), max_restores=10, remote_groups=["all"]
    )
    assert one.runner_command()[one.runner_command().index("--workers") + 1] == "one"
    assert one.hosts.groups == ["all"]


def test_with_one_group_for_the_job_the_group_kinds_strike_it_and_workers_needs_the_cluster():
    pipeline = money.pipeline("plan")
    per_stage = cluster_targets(pipeline, NODES, SPARK_WORKERS)
    assert (
        per_stage[FailureKind.GROUP.value]
        == per_stage[FailureKind.GROUP_STANDBY.value]
        == [
            "legs",
            "accounts",
            "windows",
        ]
    )
    one = cluster_targets(pipeline, NODES, SPARK_WORKERS, "one")
    assert one[FailureKind.GROUP.value] == one[FailureKind.GROUP_STANDBY.value] == ["all"]
    assert one[FailureKind.SPARK_WORKER.value] == SPARK_WORKERS
    # refused before any runtime starts: any layout named without --cluster (the local drill's runner
    # starts one worker, as `spark-abs run` does), an unknown one with it
    for layout in ("one", "per-stage"):
        with pytest.raises(ConfigError, match="--workers lays out the remote worker groups of a drill with --cluster"):
            drill.run_drill(DrillSettings(workers=layout))
    with pytest.raises(ConfigError, match="'pairs' is not one of one, per-stage"):
        drill.run_drill(DrillSettings(cluster=True, workers="pairs"))


def test_a_partition_is_out_of_sync_while_one_of_its_replicas_is_not_in_sync():
    described = [
        {
            "name": "drill-x.legs",
            "partitions": [
                {"partition_index": 0, "replica_nodes": [1, 2, 3], "isr_nodes": [1, 2, 3]},
                {"partition_index": 1, "replica_nodes": [1, 2, 3], "isr_nodes": [1, 3]},
            ],
        },
        {
            "name": "spark-abs.drill-x.control",
            "partitions": [{"partition_index": 0, "replica_nodes": [2], "isr_nodes": []}],
        },
    ]
    assert lagging_replicas(described) == ["drill-x.legs:1", "spark-abs.drill-x.control:0"]
    assert lagging_replicas([]) == []


def test_the_in_sync_wait_asks_for_kafkas_own_topics_too():
    topics = ["drill-x.legs", "other.legs", "__consumer_offsets", "__transaction_state", "__other"]
    assert watched(topics, "drill-x") == ["__consumer_offsets", "__transaction_state", "drill-x.legs"]
    assert watched(["drill-x.legs"], "drill-x") == ["drill-x.legs"]  # Kafka's own only when they exist


# ---- the cluster kinds struck, with stand-ins


def _runner(hosts) -> subprocess.Popen:
    hosts.runners.append(subprocess.Popen(["sleep", "120"], start_new_session=True))
    return hosts.runners[-1]


def _cluster(hosts, *, runtime=None, heartbeat_timeout_s=8.0, wait=None):
    watch = ProgressWatch(
        KafkaAccess("b:9092"),
        money.pipeline("w"),
        JobKey.derive("s" * 32, "w", cluster="test-cluster"),
        threading.Event(),
    )
    job = types.SimpleNamespace(
        job="drill-x",
        hosts=hosts,
        completed=lambda: [3],
        runner=_runner(hosts),
        heartbeat_timeout_s=heartbeat_timeout_s,
        connection=types.SimpleNamespace(kafka=KafkaAccess("b:9092")),
        started=[],
        generation=lambda: 1,
        restores=lambda: [],
    )
    job.start_runner = lambda: job.started.append(time.monotonic())

    def poll(condition, timeout_s):  # the drill's poll: it tends the workers, and here the heartbeats come
        hosts.supervise()
        beats = [Heartbeat(g, f"h:{p.pid}:x", "h", None) for g in hosts.groups for p in hosts.alive(g)]
        watch.take(beats)
        return condition()

    problems: list[str] = []
    injector = FailureInjector(
        job, watch, runtime=runtime, wait=wait or poll, log=print, problems=problems, started=0.0, recover_timeout_s=1
    )
    return injector.cluster, watch, job, problems


def _incarnation(process) -> str:
    return f"h:{process.pid}:x"


@pytest.mark.parametrize("standby", [False, True])
def test_a_groups_member_is_killed_and_a_new_worker_or_its_standby_runs_the_group(hosts, monkeypatch, standby):
    monkeypatch.setattr(drill_cluster, "HEARTBEAT_INTERVAL_S", 0.0)
    for group in hosts.groups:
        hosts.start(group)
    cluster, watch, job, problems = _cluster(hosts)
    member = hosts.alive("windows")[0]
    watch.take([_lease({"legs": _incarnation(hosts.alive("legs")[0]), "windows": _incarnation(member)})])
    kind = FailureKind.GROUP_STANDBY if standby else FailureKind.GROUP
    outcome = FailureOutcome(Failure(0, kind, 1.0, target="windows"), 0.0)
    hit = cluster.strike(outcome)
    recovered = hit.check
    assert hit.newest == 3 and hit.struck and member.poll() is not None  # the member SIGKILLed
    if not standby:  # none left: the drill's next poll starts a worker for the group
        assert hosts.alive("windows") == [] and hosts.supervise() == ["windows"]
    (left,) = hosts.alive("windows")  # the standby, or the worker started
    watch.take([_lease({"windows": _incarnation(left)}, 2)])
    recovered()
    assert problems == []
    assert outcome.note == f"{_incarnation(member)} killed, {'the standby' if standby else 'a new worker'} " + (
        f"{_incarnation(left)} runs windows"
    )
    watch.take([_lease({"windows": _incarnation(member)}, 3)])  # the lease still names the dead member
    recovered()
    assert problems and "windows" in problems[-1]


def test_a_group_without_a_member_running_here_is_a_problem_not_a_kill(hosts):
    hosts.start("windows")
    cluster, watch, _, problems = _cluster(hosts)
    outcome = FailureOutcome(Failure(1, FailureKind.GROUP, 1.0, target="windows"), 0.0)
    cluster.strike(outcome)
    assert problems == [
        "failure 2 (the member of worker group windows SIGKILLed, no standby (a new worker started)): no lease "
        "named a member of group windows running here within 30 s (the lease names None): nothing killed"
    ]
    assert len(hosts.alive("windows")) == 1


def test_the_runner_of_remote_members_is_killed_and_the_same_members_run_every_group_after(hosts, monkeypatch):
    monkeypatch.setattr(drill_cluster, "LAPSE_MARGIN_S", 0.5)
    for group in hosts.groups:
        hosts.start(group)
    cluster, watch, job, problems = _cluster(hosts, heartbeat_timeout_s=0.5)
    members = {g: _incarnation(hosts.alive(g)[0]) for g in hosts.groups}
    watch.take([_lease(members)])
    runner = job.runner
    # the members stop their tasks once the lease lapsed: their heartbeats say so, after the runner died
    idle = threading.Timer(0.3, lambda: watch.take([Heartbeat(g, i, "h", None) for g, i in members.items()]))
    idle.start()
    outcome = FailureOutcome(Failure(0, FailureKind.RUNNER_REMOTE, 1.0, RUNNER_RESTARTS[0]), 0.0)
    recovered = cluster.strike(outcome).check
    idle.join()
    assert runner.poll() is not None and len(job.started) == 1 and problems == []
    assert outcome.note.startswith("every member stopped its tasks ")
    watch.take([_lease(members, 2)])
    recovered()
    assert problems == [] and outcome.note.endswith("; the 2 members kept")
    # a member that still runs its tasks after the lease lapsed, and a group that moved, are problems
    job.runner = _runner(hosts)
    watch.take([Heartbeat("legs", members["legs"], "h", 2)])
    outcome = FailureOutcome(Failure(1, FailureKind.RUNNER_REMOTE, 1.0, RUNNER_RESTARTS[0]), 0.0)
    recovered = cluster.strike(outcome).check
    assert "the members of legs, windows still ran their tasks 1 s after the runner died" in problems[-1]
    hosts.kill(hosts.alive("windows")[0])
    hosts.supervise()
    watch.take([_lease({**members, "windows": _incarnation(hosts.alive("windows")[0])}, 3)])
    recovered()
    assert "group(s) windows did not run on the members the killed runner had" in problems[-1]


def test_a_kafka_node_stays_down_until_the_job_went_on_then_its_replicas_catch_up(hosts, monkeypatch):
    calls = []
    runtime = types.SimpleNamespace(
        stop_service=lambda name, kill: calls.append(("stop", name, kill)) or 4242,
        up=lambda: calls.append(("up",)),
    )
    lagging = [KafkaUnavailableError("no broker answers"), ["drill-x.legs:1"], []]  # settling, catching up, in sync

    def out_of_sync(kafka, job):
        answer = lagging.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(drill_cluster, "out_of_sync", out_of_sync)
    cluster, _, _, problems = _cluster(hosts, runtime=runtime)
    outcome = FailureOutcome(Failure(0, FailureKind.BROKER_NODE, 1.0, outage_s=0.2, target="kafka-2"), 0.0)
    hit = cluster.strike(outcome)
    assert calls == [("stop", "kafka-2", True)] and cluster.down == "kafka-2"
    hit.check()
    assert calls[-1] == ("up",) and time.monotonic() - hit.at >= 0.2 and problems == [] and cluster.down is None
    assert outcome.note.startswith("kafka-2 down 0 s, its replicas in sync ") and lagging == []
    spark = FailureOutcome(Failure(1, FailureKind.SPARK_WORKER, 1.0, outage_s=0.0, target="spark-worker-1"), 0.0)
    cluster.strike(spark).check()
    assert calls[-2:] == [("stop", "spark-worker-1", True), ("up",)] and "ALIVE again" in spark.note


def test_a_kind_that_must_restore_recovers_only_with_a_checkpoint_of_a_later_generation(hosts):
    generations = {3: 1, 4: 1, 5: 2}  # 4: acked by the killed member, completed before the runner noticed

    def run(restores: bool) -> list[int]:
        done: list[int] = []

        def wait(condition, timeout_s):
            for state in ([3], [3, 4], [3, 4, 5]):
                done[:] = state
                if condition():
                    return True
            return False

        cluster, _, job, problems = _cluster(hosts, wait=wait)
        job.completed = lambda: list(done)
        job.generation_of = generations.get
        outcome = FailureOutcome(Failure(0, FailureKind.GROUP, 1.0, target="legs"), 0.0)
        cluster.injector._recover(outcome, time.monotonic(), 3, 1, restores=restores)
        assert outcome.recovered and problems == []
        return done

    assert run(restores=True) == [3, 4, 5] and run(restores=False) == [3, 4]


def test_a_node_killed_starts_again_when_the_drill_fails_before_it_recovered(hosts):
    calls = []
    runtime = types.SimpleNamespace(
        stop_service=lambda name, kill: calls.append(("stop", name)) or 4242, up=lambda: calls.append(("up",))
    )

    def wait(condition, timeout_s):
        raise SparkAbsError("the job runner exited")

    cluster, _, _, _ = _cluster(hosts, runtime=runtime, wait=wait)
    failure = Failure(0, FailureKind.SPARK_WORKER, 1.0, outage_s=30.0, target="spark-worker-1")
    with pytest.raises(SparkAbsError, match="runner exited"):
        cluster.injector.inject(failure, random.Random(1))
    assert calls == [("stop", "spark-worker-1"), ("up",)] and cluster.down is None
    cluster.bring_back()  # the drill's own end: nothing left down
    assert calls[-1] == ("up",) and len(calls) == 2


def test_a_node_not_running_is_a_problem_and_no_replicas_are_said_in_sync(hosts, monkeypatch):
    calls = []
    runtime = types.SimpleNamespace(stop_service=lambda name, kill: None, up=lambda: calls.append("up"))
    monkeypatch.setattr(drill_cluster, "out_of_sync", lambda kafka, job: [])
    cluster, _, _, problems = _cluster(hosts, runtime=runtime)
    outcome = FailureOutcome(Failure(0, FailureKind.BROKER_NODE, 1.0, outage_s=0.0, target="kafka-3"), 0.0)
    hit = cluster.strike(outcome)
    assert not hit.struck and problems[-1].endswith("kafka-3 was not running: nothing killed")
    hit.check()
    assert calls == ["up"] and "in sync" not in outcome.note


def test_a_standby_that_never_joins_is_killed_and_the_member_is_not(hosts, monkeypatch):
    monkeypatch.setattr(drill_cluster, "pid_of", lambda incarnation: None)  # no heartbeat is the standby's
    for group in hosts.groups:
        hosts.start(group)
    cluster, watch, _, problems = _cluster(hosts)
    member = hosts.alive("windows")[0]
    watch.take([_lease({"windows": _incarnation(member)})])
    outcome = FailureOutcome(Failure(0, FailureKind.GROUP_STANDBY, 1.0, target="windows"), 0.0)
    hit = cluster.strike(outcome)
    assert not hit.struck and hosts.alive("windows") == [member] and len(hosts.processes["windows"]) == 2
    assert problems[-1].endswith(
        "the standby of group windows sent no heartbeat within 180 s: it was killed, the member was not"
    )
    assert hosts.supervise() == [] and len(problems) == 1  # the standby killed is the drill's: no report, no restart


def test_the_member_is_looked_up_again_once_the_standby_joined_and_never_the_standby(hosts, monkeypatch):
    for group in hosts.groups:
        hosts.start(group)
    cluster, watch, _, problems = _cluster(hosts)
    member = hosts.alive("windows")[0]
    watch.take([_lease({"windows": _incarnation(member)})])

    def standby(outcome, group):  # it joins, and the lease names it already
        incarnation = _incarnation(hosts.start(group))
        watch.take([_lease({"windows": incarnation}, 2)])
        return incarnation

    monkeypatch.setattr(cluster, "_standby", standby)
    outcome = FailureOutcome(Failure(0, FailureKind.GROUP_STANDBY, 1.0, target="windows"), 0.0)
    hit = cluster.strike(outcome)
    assert not hit.struck and len(hosts.alive("windows")) == 2  # nothing killed
    assert "other than its standby h:" in problems[-1] and problems[-1].endswith("nothing killed")


def test_the_runner_of_remote_members_must_have_a_member_for_every_group(hosts):
    for group in hosts.groups:
        hosts.start(group)
    cluster, watch, _, problems = _cluster(hosts)
    watch.take([_lease({"legs": _incarnation(hosts.alive("legs")[0])})])  # windows: no member named
    outcome = FailureOutcome(Failure(0, FailureKind.RUNNER_REMOTE, 1.0, RUNNER_RESTARTS[1]), 0.0)
    cluster.strike(outcome).check()
    assert problems == [
        "failure 1 (job runner of remote members SIGKILLed, started again at once): before the runner was killed "
        "no lease named a member running here of group(s) windows"
    ]
    assert "kept" not in outcome.note


def test_a_worker_killed_on_the_cluster_is_a_member_the_lease_names_never_a_standby(hosts):
    for group in hosts.groups:
        hosts.start(group)
    standby = hosts.start("legs")
    cluster, watch, _, _ = _cluster(hosts)
    member = hosts.alive("legs")[0]
    watch.take([_lease({"legs": _incarnation(member)})])
    cluster.injector._kill_a_worker(random.Random(3))
    assert member.poll() is not None and standby.poll() is None and len(hosts.alive("windows")) == 1


def test_damage_keeps_the_note_the_runners_kill_wrote(hosts):
    cluster, _, job, _ = _cluster(hosts)
    job.store, job.completed = None, lambda: []
    outcome = FailureOutcome(Failure(0, FailureKind.DAMAGE, 1.0, "flip a byte"), 0.0, note="every member stopped")
    cluster.injector._damage(outcome, random.Random(1))
    assert outcome.note == "every member stopped; no complete checkpoint to damage"


def test_only_a_group_the_drill_left_empty_is_started_again_and_other_exits_are_reported(tmp_path):
    scripts = iter(["exit 3", "echo '[fault] legs: killed at mid_batch' >&2; kill -9 $$", "sleep 120"])

    def spawn(command, log_path, env):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            return subprocess.Popen(["sh", "-c", next(scripts)], stdout=log, stderr=log, start_new_session=True)

    problems: list[str] = []
    hosts = WorkerHosts("drill-x", "money", ["legs"], {}, tmp_path / "workers", spawn, problems=problems)
    try:
        hosts.start("legs").wait()  # exits by itself: reported with its log, not started again
        assert hosts.supervise() == [] and len(problems) == 1
        assert "exited (status 3) and the drill did not kill it; the end of " in problems[0]
        hosts.start("legs").wait()  # killed by the fault the drill armed: started again
        assert hosts.supervise() == ["legs"] and len(problems) == 1
        assert hosts.supervise() == []  # an exit is taken in once
        hosts.kill(hosts.alive("legs")[0])
        hosts.restarts["legs"] = [time.monotonic()] * MAX_RESTARTS  # as often as it may within the window
        assert hosts.supervise() == [] and "started again 3 times within 120 s already" in problems[-1]
    finally:
        hosts.stop(timeout_s=5.0)


def test_the_budget_counts_a_cluster_kinds_own_waits():
    assert side_wait_s(Failure(0, FailureKind.BROKER_NODE, 1.0, outage_s=10.0, target="kafka-1")) == 50.0
    assert side_wait_s(Failure(0, FailureKind.GROUP_STANDBY, 1.0, target="legs")) == 60.0
    assert side_wait_s(Failure(0, FailureKind.RUNNER_REMOTE, 1.0, RUNNER_RESTARTS[0])) == 15.0
    assert side_wait_s(Failure(0, FailureKind.RUNNER_REMOTE, 1.0, RUNNER_RESTARTS[1])) == 0.0
    assert side_wait_s(Failure(0, FailureKind.WORKER, 1.0, "random")) == 0.0


def test_a_drill_off_the_cluster_runs_the_job_as_spark_abs_run_does_and_on_it_as_its_grouping_says(tmp_path):
    """run_drill resolves the layout (none given: a group per stage) and
    hands it to each phase's Drill, which lays out remote groups only on
    the cluster: off it, the runner starts its one worker as `spark-abs
    run` does."""
    connection = Connection(KafkaAccess("127.0.0.1:9"), "http://127.0.0.1:9", "a", "b", "bucket", job_secret="s" * 32)
    options = dict(
        pipeline="spark_abs_examples.money:pipeline",
        workload=drill.workload_for("spark_abs_examples.money:pipeline"),
        failures=1,
        seed=1,
        kinds=[FailureKind.WORKER],
        mode="aligned",
        interval_s=1.0,
        rate=10.0,
        store_uri=f"file://{tmp_path / 'store'}",
        report_dir=tmp_path / "report",
    )
    for workers in ("per-stage", "one"):
        local = drill.Drill(connection, DrillSettings(**options, workers=workers))
        assert local.drilled.hosts is None and "--workers" not in local.drilled.runner_command()

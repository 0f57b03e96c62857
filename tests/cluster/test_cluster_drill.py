"""A short ``spark-abs drill --cluster`` on the local cluster: the money
pipeline's job with its worker group remote (``--workers one``: a
``spark-abs worker`` process the drill runs, one Spark application on the
master), one failure of each cluster kind (a Kafka node of three, a Spark
worker, the group's member without and with a standby, the runner of a
remote member), each recovered as its kind must (no restore for a node, a
restore for the group or the runner, the standby or a new worker running the
group, the same member after the runner, in the same process), the output
equal to the reference for every window, each once, and the runner's last
lease stopping the member's tasks when the job ends.

The layout with a group per stage (the drill's default) runs three Spark
applications and takes about twice as long on a 2-core machine
(docs/operations/drills.md has a run of it)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from streaming.tools import drill
from streaming.tools.drill import CLUSTER_ONLY, FailureKind

pytestmark = pytest.mark.integration


def _applications(runtime) -> list[dict]:
    """The Spark applications the cluster's master ran and runs."""
    ports = json.loads((runtime.settings.runtime_dir / "ports.json").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['spark_web']}/json/", timeout=5) as response:
        state = json.loads(response.read())
    return state["activeapps"] + state["completedapps"]


def test_a_short_cluster_drill_strikes_each_cluster_kind_once_and_passes(cluster, spark, tmp_path):
    runtime, connection = cluster
    run = drill.run_drill(
        connection,
        runtime=runtime,
        spark=spark,  # the reference in batch, on the session's Spark rather than an application on the cluster
        cluster=True,
        workers="one",
        kinds=CLUSTER_ONLY,
        failures=len(CLUSTER_ONLY),
        seed=5,
        rate=100.0,
        report_dir=tmp_path / "report",
        store_uri=f"s3://{connection.s3_bucket}/drills-{tmp_path.name}",
    )
    (report,) = run.phases
    runner_log = (tmp_path / "report" / "runner.log").read_text(errors="replace")
    said = "\n".join(runner_log.splitlines()[-60:])
    outcomes = {o.failure.kind: o for o in report.outcomes}
    assert set(outcomes) == set(CLUSTER_ONLY), report.plan
    assert report.problems == [] and all(o.recovered for o in report.outcomes), (report.problems, said)
    # a node of the cluster lost restores nothing; the group's member or the runner lost restores
    for kind in (FailureKind.BROKER_NODE, FailureKind.SPARK_WORKER):
        assert outcomes[kind].restored_from == [], outcomes[kind]
    for kind in (FailureKind.GROUP, FailureKind.GROUP_STANDBY, FailureKind.RUNNER_REMOTE):
        assert outcomes[kind].restored_from, outcomes[kind]
    assert "its replicas in sync" in outcomes[FailureKind.BROKER_NODE].note
    assert "the standby" in outcomes[FailureKind.GROUP_STANDBY].note
    assert "a new worker" in outcomes[FailureKind.GROUP].note
    assert "the member kept" in outcomes[FailureKind.RUNNER_REMOTE].note
    assert "waits as standby" in runner_log and "went silent" in runner_log
    failed = {o.expectation for suite in report.checks for o in suite.outcomes if not o.success}
    assert failed == set() and run.passed, said
    # the group's first worker, the standby, and the worker started for the group left with none
    logs = {p.name: p.read_text(errors="replace") for p in (tmp_path / "report" / "workers").glob("*.log")}
    assert sorted(logs) == ["all-1.log", "all-2.log", "all-3.log"]
    # the member the runner kept ran the tasks again, in the new runner's generation, in the same process;
    # when the job ended, the runner's last lease stopped its tasks
    assert logs["all-3.log"].count("started from checkpoint") >= 2, logs["all-3.log"][-3000:]
    assert "stopped: the job runner stopped" in logs["all-3.log"], logs["all-3.log"][-3000:]
    # the tasks ran on the cluster: an application of the job's for each of its three workers, with executors
    applications = [a for a in _applications(runtime) if a["name"] == f"spark-abs-{report.job}"]
    assert len(applications) == 3 and all(a["cores"] >= 1 for a in applications), applications

"""A short ``spark-abs drill --cluster`` on the local cluster: the money
pipeline's job with a remote worker group per stage (``spark-abs worker``
processes the drill runs), one failure of each cluster kind (a Kafka node
of three, a Spark worker, a group's member without and with a standby, the
runner of remote members), each recovered as its kind must (no restore for
a node, a restore for a group or the runner, the standby or a new worker
running the group, the same members after the runner), and the output
equal to the reference for every window, each once.

It runs only when asked (``RUN_CLUSTER_DRILL=1``): about 8 minutes on
a 2-core machine, more than the suite's time budget has left."""

from __future__ import annotations

import os

import pytest

from streaming.tools import drill
from streaming.tools.drill import CLUSTER_ONLY, FailureKind

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not os.environ.get("RUN_CLUSTER_DRILL"),
        reason="about 8 minutes: run with RUN_CLUSTER_DRILL=1",
    ),
]


def test_a_short_cluster_drill_strikes_each_cluster_kind_once_and_passes(cluster, tmp_path):
    runtime, connection = cluster
    run = drill.run_drill(
        connection,
        runtime=runtime,
        cluster=True,
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
    # a node of the cluster lost restores nothing; a group's member or the runner lost restores
    for kind in (FailureKind.BROKER_NODE, FailureKind.SPARK_WORKER):
        assert outcomes[kind].restored_from == [], outcomes[kind]
    for kind in (FailureKind.GROUP, FailureKind.GROUP_STANDBY, FailureKind.RUNNER_REMOTE):
        assert outcomes[kind].restored_from, outcomes[kind]
    assert "its replicas in sync" in outcomes[FailureKind.BROKER_NODE].note
    assert "the standby" in outcomes[FailureKind.GROUP_STANDBY].note
    assert "a new worker" in outcomes[FailureKind.GROUP].note
    assert "members kept" in outcomes[FailureKind.RUNNER_REMOTE].note
    assert "waits as standby" in runner_log and "went silent" in runner_log
    failed = {o.expectation for suite in report.checks for o in suite.outcomes if not o.success}
    assert failed == set() and run.passed, said
    # a worker per stage, the standby, and the worker started for the group left with none
    assert len(list((tmp_path / "report" / "workers").glob("*.log"))) == 3 + 2

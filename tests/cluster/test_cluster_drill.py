"""A short ``spark-abs drill --cluster`` on the local cluster: the money
pipeline's job with its worker group remote (``--workers one``: a
``spark-abs worker`` process the drill runs, one Spark application on the
master), one failure of each cluster kind (a Kafka node of three, a Spark
worker, the group's member without and with a standby, the runner of a
remote member), each recovered as its kind must (no restore for a node, a
restore for the group or the runner, the standby or a new worker running the
group, the same member after the runner, in the same process, though every old
heartbeat was appended to the control topic again after the runner
restarted: a dead worker's ones make it no member), the output
equal to the reference for every window, each once, and the runner's last
lease stopping the member's tasks when the job ends.

The grouping with a group per stage (the drill's default: three Spark
applications) takes about twice as long on a 2-core machine, more than the
suite's time budget has left: it runs only when asked
(``RUN_CLUSTER_DRILL=1``; docs/operations/drills.md has runs of it)."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest

from streaming.tools.drill import run as drill
from streaming.tools.drill.run import CLUSTER_ONLY, FailureKind
from streaming.tools.drill.settings import DrillSettings

pytestmark = pytest.mark.integration


def _applications(runtime) -> list[dict]:
    """The Spark applications the cluster's master ran and runs."""
    ports = json.loads((runtime.settings.runtime_dir / "ports.json").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['spark_web']}/json/", timeout=5) as response:
        state = json.loads(response.read())
    return state["activeapps"] + state["completedapps"]


@pytest.mark.parametrize(
    "workers",
    [
        "one",
        pytest.param(
            "per-stage",
            marks=pytest.mark.skipif(
                not os.environ.get("RUN_CLUSTER_DRILL"), reason="about 8 minutes: run with RUN_CLUSTER_DRILL=1"
            ),
        ),
    ],
)
def test_a_short_cluster_drill_strikes_each_cluster_kind_once_and_passes(cluster, spark, tmp_path, workers):
    runtime, connection = cluster
    groups = ["all"] if workers == "one" else ["legs", "accounts", "windows"]
    run = drill.run_drill(
        DrillSettings(
            cluster=True,
            workers=workers,
            kinds=CLUSTER_ONLY,
            failures=len(CLUSTER_ONLY),
            seed=5,
            rate=100.0,
            report_dir=tmp_path / "report",
            store_uri=f"s3://{connection.s3_bucket}/drills-{tmp_path.name}",
        ),
        connection,
        runtime=runtime,
        spark=spark,  # the reference in batch, on the session's Spark rather than an application on the cluster
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
    kept = "the member kept" if len(groups) == 1 else f"the {len(groups)} members kept"
    assert kept in outcomes[FailureKind.RUNNER_REMOTE].note
    # the latest heartbeats of the member and of the workers killed before, appended again after the restart
    copies = re.search(r"(\d+) old heartbeats of (\d+) worker", outcomes[FailureKind.RUNNER_REMOTE].note)
    assert copies and int(copies[2]) >= 2, outcomes[FailureKind.RUNNER_REMOTE].note
    assert "waits as standby" in runner_log and "went silent" in runner_log
    failed = {o.expectation for suite in report.checks for o in suite.outcomes if not o.success}
    assert failed == set() and run.passed, said
    # a worker per group, the standby, and the worker started for the group left with none (the same group,
    # drawn from the seed)
    logs = {p.name: p.read_text(errors="replace") for p in (tmp_path / "report" / "workers").glob("*.log")}
    assert len(logs) == len(groups) + 2 and {f"{g}-1.log" for g in groups} <= set(logs), sorted(logs)
    # each group's last worker ran until the end: the runner's last lease stopped its tasks
    for group in groups:
        last = max((name for name in logs if name.startswith(f"{group}-")), key=lambda n: int(n.split("-")[-1][:-4]))
        assert "stopped: the job runner stopped" in logs[last], logs[last][-3000:]
    if workers == "one":  # the member the runner kept ran the tasks again, in the new runner's generation
        assert logs["all-3.log"].count("started from checkpoint") >= 2, logs["all-3.log"][-3000:]
    # the tasks ran on the cluster: an application of the job's for each of its workers, with executors
    applications = [a for a in _applications(runtime) if a["name"] == f"spark-abs-{report.job}"]
    assert len(applications) == len(logs) and all(a["cores"] >= 1 for a in applications), applications

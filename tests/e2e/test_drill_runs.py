"""Restore drills on the real runtime (``spark-abs drill``'s API): one
failure of every kind drilled by default, and a broker outage past the
job's delivery timeout, against a real ``spark-abs run`` process of an
example pipeline (orders, its workload and reference from its module's
``drill_workload()``), each recovered, the killed runner's workers and JVMs
gone within the bound, the damaged checkpoint skipped, a frozen worker
SIGKILLed by its runner and restored, the job recovered by itself after the
long outage, and the output equal to the example's Spark SQL reference for
every window, each once (read as a consumer that skips the epochs the Kafka
sink marked superseded when the damage fallback went back past them); then
a drill of the money pipeline broken to lose a record (every 300th, no
failure needed) fails, naming the expectation that caught it (the output
suite on a duplicated row, and the rest of its expectations, is tested on
tables in ``tests/streaming/tools/drill/test_drill_checks.py``; a drill run
of the pipeline broken to duplicate, ``broken=duplicate``, fails the same way).

The orders drill runs once for the module (``orders_drill``); each test
reads what it is about from its report.  The job runs with a delivery
timeout of ``DELIVERY_TIMEOUT_S`` (a job's default is 120 s), so its long
outage lasts 1.25 to 1.75 times that, not minutes; a short ``broker``
outage (3 to 8 s, and Kafka's restart) stays well within it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from streaming.local import LocalRuntime
from streaming.testing import LineCollector
from streaming.tools.drill import run as drill
from streaming.tools.drill.run import FailureKind
from streaming.tools.drill.settings import DrillSettings

pytestmark = pytest.mark.integration

# the orders drill's delivery timeout: a broker-long outage past it, a short one well within it
DELIVERY_TIMEOUT_S = 30.0
# every kind drilled by default (a frozen worker among them), a broker outage past the delivery timeout, and
# records no schema expected on the ingress topics
ORDERS_KINDS = (*drill.KINDS, FailureKind.BROKER_LONG, FailureKind.POISON)


def _run(connection, runtime_settings, spark, report_dir, lines, **options):
    run = drill.run_drill(
        DrillSettings(
            report_dir=report_dir, store_uri=f"s3://{connection.s3_bucket}/drills-{report_dir.parent.name}", **options
        ),
        connection,
        runtime=LocalRuntime(runtime_settings, progress=lines.append),
        spark=spark,
    )
    return run, lines


@pytest.fixture(scope="module")
def orders_drill(connection, runtime_settings, spark, tmp_path_factory, _topic_admin) -> Iterator[tuple]:
    """The orders drill, one failure of each of ``ORDERS_KINDS``: (the run, its report directory, the lines
    logged).  The topics it made are deleted after the module, as a test's are after the test (conftest)."""
    before = set(_topic_admin.list_topics())
    collector = LineCollector().attach()
    report_dir = tmp_path_factory.mktemp("orders-drill") / "report"
    try:
        run, lines = _run(
            connection,
            runtime_settings,
            spark,
            report_dir,
            collector.lines,
            pipeline="orders",
            failures=len(ORDERS_KINDS),
            kinds=ORDERS_KINDS,
            seed=13,
            delivery_timeout_s=DELIVERY_TIMEOUT_S,
        )
    finally:
        collector.detach()
    yield run, report_dir, lines
    made = sorted(t for t in set(_topic_admin.list_topics()) - before if not t.startswith("_"))
    if made:
        _topic_admin.delete_topics(made, timeout_ms=30_000)


def _outcomes(run) -> dict:
    (report,) = run.phases
    return {o.failure.kind: o for o in report.outcomes}


def _exact(run, lines) -> None:
    """Every window the reference has, none it lacks, each equal to it and once: the epochs the damage fallback
    went back past are marked superseded by the Kafka sink, and left out (docs/operations/drills.md)."""
    (report,) = run.phases
    failed = {o.expectation for suite in report.checks for o in suite.outcomes if not o.success}
    assert report.checks and failed == set() and run.passed, "\n".join(lines[-40:])


def test_a_drill_of_an_example_with_a_failure_of_every_kind_recovers_and_writes_its_report(orders_drill):
    run, report_dir, lines = orders_drill
    (report,) = run.phases
    outcomes = _outcomes(run)
    assert set(outcomes) == set(ORDERS_KINDS), report.plan
    assert report.problems == [] and report.checks, "\n".join(lines[-40:])
    assert report.pipeline == "spark_abs_examples.orders:pipeline" and all(o.recovered for o in report.outcomes)
    _exact(run, lines)
    # the runner's death left no worker or JVM behind, and the runner that came back restored
    for kind in (FailureKind.RUNNER, FailureKind.DAMAGE):
        assert outcomes[kind].orphans_gone_s is not None and outcomes[kind].orphans_gone_s < drill.ORPHAN_BOUND_S
        assert outcomes[kind].restored_from, outcomes[kind]
    damage = outcomes[FailureKind.DAMAGE]
    assert damage.damaged is not None and damage.restored_from[-1] < damage.damaged  # the fallback
    # a short broker or store outage needs no restore: the job waits and goes on
    assert outcomes[FailureKind.BROKER].restored_from == [] and outcomes[FailureKind.STORE].restored_from == []
    # records no schema expected: each a dead letter with its reason (the dead_letters suite), no restore
    assert outcomes[FailureKind.POISON].restored_from == []
    letters = report.frames["dead_letters"]
    poisoned = letters[letters["made_malformed"]]
    assert len(poisoned) == 7 + 8 and (poisoned["letters"] >= 1).all(), (
        poisoned.to_string()
    )  # JSON orders, Avro customers
    assert outcomes[FailureKind.WORKER].restored_from
    states = set(report.frames["checkpoints"]["state"])
    assert states == {"verifies", "damaged by the drill"}, states
    # the output was checked against the example's reference, every column of it, on more than a few windows
    observed = {o.expectation: o.observed for suite in report.checks for o in suite.outcomes}
    assert {"orders equal to the reference for every key", "revenue equal to the reference for every key"} <= set(
        observed
    )
    assert int(observed["as many output rows as the reference"]) > 20, observed
    written = {p.name for p in report_dir.iterdir()}
    assert {"report.md", "report.json", "recoveries.png", "gx-output.json", "gx-checkpoints.json"} <= written
    summary = json.loads((report_dir / "report.json").read_text())
    assert summary["passed"] is run.passed and len(summary["phases"][0]["failures"]) == len(ORDERS_KINDS)
    assert summary["recoveries"][0]["failures"] == "all" and summary["recoveries"][0]["not recovered"] == 0
    # the report names the delivery timeout the drill shortened
    assert summary["phases"][0]["bounds"]["delivery_timeout_s"] == DELIVERY_TIMEOUT_S
    assert "delivery timeout 30 s (shortened by the drill" in (report_dir / "report.md").read_text()


def test_a_broker_outage_past_the_delivery_timeout_is_recovered_by_the_job_itself_and_the_output_is_exact(
    orders_drill,
):
    """Kafka away longer than the producers' delivery timeout, mid-stream:
    the runner goes on supervising; a worker's send pending through the
    outage gives up at the delivery timeout, the worker exits and the job
    restores once Kafka is back (a worker with none pending goes on); a
    checkpoint completes again, and the output is exact: nothing a failed
    send carried was counted."""
    run, _, lines = orders_drill
    long = _outcomes(run)[FailureKind.BROKER_LONG]
    assert long.failure.outage_s > DELIVERY_TIMEOUT_S
    assert long.recovered, (long, "\n".join(lines[-40:]))
    assert long.recovered_s is not None and long.recovered_s > long.failure.outage_s
    _exact(run, lines)


def test_a_frozen_worker_is_killed_by_its_runner_and_restored_and_the_output_is_exact(orders_drill):
    """A worker stopped (SIGSTOP) past the heartbeat timeout: its runner
    finds its tasks silent while Kafka answers, SIGKILLs it and restores
    (cause ``worker_stuck``) before the drill would continue it."""
    run, _, lines = orders_drill
    frozen = _outcomes(run)[FailureKind.WORKER_FROZEN]
    assert frozen.recovered and frozen.restored_from, (frozen, "\n".join(lines[-40:]))
    assert frozen.causes[0] == "worker_stuck" and " frozen, gone " in frozen.note, frozen
    _exact(run, lines)


def test_a_drill_fails_on_a_pipeline_that_loses_a_record(connection, runtime_settings, spark, tmp_path, lines):
    run, lines = _run(
        connection,
        runtime_settings,
        spark,
        tmp_path / "report",
        lines,
        pipeline="spark_abs_examples.broken_money:pipeline?broken=lose&every=300",
        failures=0,  # the stage breaks records whatever happens: the checks alone must catch it
        seed=5,
    )
    (report,) = run.phases
    assert report.outcomes == [] and report.problems == [], "\n".join(lines[-30:])
    assert not report.passed
    failed = {o.expectation: o.observed for suite in report.checks for o in suite.outcomes if not o.success}
    # a transfer lost changes its accounts' windows: their sums and leg counts differ
    assert set(failed) == {"net equal to the reference for every key", "legs equal to the reference for every key"}
    assert all("unexpected, e.g. account=" in observed for observed in failed.values()), failed
    # what holds still holds: checkpoints are consistent cuts of what the broken stage wrote
    assert all(o.success for suite in report.checks if suite.name != "output" for o in suite.outcomes)
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "**FAILED: output: net equal to the reference for every key (observed " in markdown, markdown[:800]

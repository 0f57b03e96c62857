"""Restore drills on the real runtime (``spark-abs drill``'s API): one
failure of every kind against a real ``spark-abs run`` process of an example
pipeline (orders, its workload and reference from its module's
``drill_workload()``), each recovered, the killed runner's workers and JVMs
gone within the bound, the damaged checkpoint skipped, and the output equal
to the example's Spark SQL reference for every window, each once (read as a
consumer that skips the epochs the Kafka sink marked superseded when the
damage fallback went back past them); then a drill of the money pipeline
broken to lose and to duplicate a record (every 300th, no failure needed)
fails, naming the expectation that caught it."""

from __future__ import annotations

import json

import pytest

from streaming.local import LocalRuntime
from streaming.tools.drill import run as drill
from streaming.tools.drill.run import FailureKind
from streaming.tools.drill.settings import DrillSettings

pytestmark = pytest.mark.integration


def _run(connection, runtime_settings, spark, tmp_path, lines, **options):
    run = drill.run_drill(
        DrillSettings(
            report_dir=tmp_path / "report", store_uri=f"s3://{connection.s3_bucket}/drills-{tmp_path.name}", **options
        ),
        connection,
        runtime=LocalRuntime(runtime_settings, progress=lines.append),
        spark=spark,
    )
    return run, lines


def test_a_drill_of_an_example_with_a_failure_of_every_kind_recovers_and_writes_its_report(
    connection, runtime_settings, spark, tmp_path, lines
):
    run, lines = _run(
        connection, runtime_settings, spark, tmp_path, lines, pipeline="orders", failures=len(drill.KINDS), seed=11
    )
    (report,) = run.phases
    outcomes = {o.failure.kind: o for o in report.outcomes}
    assert set(outcomes) == set(drill.KINDS), report.plan
    assert report.problems == [] and report.checks, "\n".join(lines[-40:])
    assert report.pipeline == "spark_abs_examples.orders:pipeline" and all(o.recovered for o in report.outcomes)
    # every window the reference has, none it lacks, each equal to it and once: the epochs the damage
    # fallback went back past are marked superseded by the Kafka sink, and left out (docs/operations/drills.md)
    failed = {o.expectation for suite in report.checks for o in suite.outcomes if not o.success}
    assert failed == set() and run.passed, "\n".join(lines[-40:])
    # the runner's death left no worker or JVM behind, and the runner that came back restored
    for kind in (FailureKind.RUNNER, FailureKind.DAMAGE):
        assert outcomes[kind].orphans_gone_s is not None and outcomes[kind].orphans_gone_s < drill.ORPHAN_BOUND_S
        assert outcomes[kind].restored_from, outcomes[kind]
    damage = outcomes[FailureKind.DAMAGE]
    assert damage.damaged is not None and damage.restored_from[-1] < damage.damaged  # the fallback
    # a broker or store outage needs no restore: the job waits and goes on
    assert outcomes[FailureKind.BROKER].restored_from == [] and outcomes[FailureKind.STORE].restored_from == []
    assert outcomes[FailureKind.WORKER].restored_from
    states = set(report.frames["checkpoints"]["state"])
    assert states == {"verifies", "damaged by the drill"}, states
    # the output was checked against the example's reference, every column of it, on more than a few windows
    observed = {o.expectation: o.observed for suite in report.checks for o in suite.outcomes}
    assert {"orders equal to the reference for every key", "revenue equal to the reference for every key"} <= set(
        observed
    )
    assert int(observed["as many output rows as the reference"]) > 20, observed
    written = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"report.md", "report.json", "recoveries.png", "gx-output.json", "gx-checkpoints.json"} <= written
    summary = json.loads((tmp_path / "report" / "report.json").read_text())
    assert summary["passed"] is run.passed and len(summary["phases"][0]["failures"]) == len(drill.KINDS)
    assert summary["recoveries"][0]["failures"] == "all" and summary["recoveries"][0]["not recovered"] == 0


@pytest.mark.parametrize("broken", ["lose", "duplicate"])
def test_a_drill_fails_on_a_pipeline_that_loses_or_duplicates_a_record(
    connection, runtime_settings, spark, tmp_path, lines, broken
):
    run, lines = _run(
        connection,
        runtime_settings,
        spark,
        tmp_path,
        lines,
        pipeline=f"spark_abs_examples.broken_money:pipeline?broken={broken}&every=300",
        failures=0,  # the stage breaks records whatever happens: the checks alone must catch it
        seed=5,
    )
    (report,) = run.phases
    assert report.outcomes == [] and report.problems == [], "\n".join(lines[-30:])
    assert not report.passed
    failed = {o.expectation: o.observed for suite in report.checks for o in suite.outcomes if not o.success}
    # a transfer lost or doubled changes its accounts' windows: their sums and leg counts differ
    assert set(failed) == {"net equal to the reference for every key", "legs equal to the reference for every key"}
    assert all("unexpected, e.g. account=" in observed for observed in failed.values()), failed
    # what holds still holds: checkpoints are consistent cuts of what the broken stage wrote
    assert all(o.success for suite in report.checks if suite.name != "output" for o in suite.outcomes)
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "**FAILED: output: net equal to the reference for every key (observed " in markdown, markdown[:800]

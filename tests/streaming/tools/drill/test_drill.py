"""The drill's plan, budget and report, without services: the failures a
seed draws, where fault points may strike, how long a drill may take (a
duration, a recovery limit, percentiles of the recoveries so far), the
Markdown, JSON and chart a report writes."""

from __future__ import annotations

import collections
import json

import pandas as pd
import pytest

from spark_abs_examples import money
from streaming.api.settings import Mode
from streaming.errors import ConfigError
from streaming.tools.drill import checks as drill_checks
from streaming.tools.drill import report as drill_report
from streaming.tools.drill import run as drill
from streaming.tools.drill.plan import (
    LIVENESS_KINDS,
    NAMED_ONLY,
    Failure,
    LivenessBounds,
    must_restore,
    parse_duration,
    percentile,
    side_wait_s,
)
from streaming.tools.drill.run import DrillBudget, DrillRun, FailureKind, FailureOutcome
from streaming.tools.drill.settings import DrillSettings


def _pools(mode: Mode = Mode.ALIGNED):
    return drill.fault_pools(money.pipeline("plan"), mode)


def test_twelve_failures_give_every_kind_twice_and_a_seed_draws_the_same_plan_again():
    assert DrillSettings().failures == 12 == 2 * len(drill.KINDS)
    plan = drill.plan_failures(12, 7, drill.KINDS, _pools(), 1.0)
    assert collections.Counter(f.kind for f in plan) == {kind: 2 for kind in drill.KINDS}
    assert FailureKind.RETENTION not in drill.KINDS  # it deletes records: drilled when named
    assert plan == drill.plan_failures(12, 7, drill.KINDS, _pools(), 1.0)
    assert plan != drill.plan_failures(12, 8, drill.KINDS, _pools(), 1.0)
    assert all(0.2 <= f.delay_s <= 2.0 for f in plan)
    outages = [f for f in plan if f.kind in (FailureKind.BROKER, FailureKind.STORE)]
    assert all(3.0 <= f.outage_s <= 8.0 for f in outages)
    assert all(f.moment in drill.DAMAGES for f in plan if f.kind is FailureKind.DAMAGE)


def test_worker_failures_start_with_a_plain_kill_then_walk_the_fault_points_where_they_can_strike():
    plan = drill.plan_failures(12, 3, [FailureKind.WORKER], _pools(), 1.0)
    moments = [f.moment for f in plan]
    assert moments[0] == "random" and plan[0].task == ""
    assert set(moments[1:6]) == {
        "mid_batch",
        "during_alignment",
        "during_upload",
        "before_sink_commit",
        "during_restore",
    }
    for failure in plan:
        assert failure.task in (_pools()[failure.moment] if failure.moment != "random" else [""])
    # legs tasks read one partition each: they never align; only the windows task is a sink
    assert set(_pools()["during_alignment"]) == {"accounts-0", "accounts-1", "windows-0"}
    assert _pools()["before_sink_commit"] == ["windows-0"]
    # no alignment in unaligned checkpoints, so that fault point is not drawn
    unaligned = drill.plan_failures(12, 3, [FailureKind.WORKER], _pools(Mode.UNALIGNED), 1.0)
    assert "during_alignment" not in {f.moment for f in unaligned}


def test_the_liveness_kinds_outlast_the_jobs_bounds_and_only_a_frozen_worker_is_drilled_by_default():
    """A long broker outage outlasts the delivery timeout the drill runs the
    job with, a long store outage the store's retries, a freeze the
    heartbeat timeout; a stuck send strikes any task and has the failed
    checkpoints the job tolerates, each at the checkpoint timeout, and a
    heartbeat timeout to be noticed.  Those that take minutes are drilled
    when named."""
    assert FailureKind.WORKER_FROZEN in drill.KINDS
    assert set(NAMED_ONLY) == {
        FailureKind.RETENTION,
        FailureKind.BROKER_LONG,
        FailureKind.STORE_LONG,
        FailureKind.STUCK_SEND,
        FailureKind.POISON,  # not minutes: it needs a workload whose reference leaves its records out
    }
    bounds = LivenessBounds.of(20.0)
    assert bounds.shortened and not LivenessBounds().shortened and LivenessBounds().delivery_timeout_s == 120.0
    assert "delivery timeout 20 s (shortened by the drill, --delivery-timeout" in bounds.describe()
    assert bounds.stuck_notice_s() == 4 * 60.0  # 3 failed checkpoints tolerated, a restore at the 4th
    with pytest.raises(ConfigError, match="delivery timeout must be positive"):
        LivenessBounds.of(0.0)
    plan = drill.plan_failures(8, 4, LIVENESS_KINDS, _pools(), 1.0, bounds)
    assert collections.Counter(f.kind for f in plan) == {kind: 2 for kind in LIVENESS_KINDS}
    every = {t.name for t in money.pipeline("plan").tasks()}
    for failure in plan:
        if failure.kind is FailureKind.BROKER_LONG:
            assert 25.0 <= failure.outage_s <= 35.0
        elif failure.kind is FailureKind.STORE_LONG:
            assert 132.0 <= failure.outage_s <= 168.0
        elif failure.kind is FailureKind.WORKER_FROZEN:
            assert 20.0 <= failure.outage_s <= 30.0
        else:
            assert failure.task in every and failure.notice_s == 240.0 and failure.outage_s == 0.0
        # a long outage may end in a restore (a send pending through it fails) or not; the others must restore
        long_outage = failure.kind in (FailureKind.BROKER_LONG, FailureKind.STORE_LONG)
        assert must_restore(failure.kind) is (None if long_outage else True)
        # the budget counts what comes before the recovery: the outage, the freeze, the time to notice
        assert side_wait_s(failure) == failure.outage_s + failure.notice_s > 0
    # a job's own delivery timeout: minutes of broker outage
    (long,) = drill.plan_failures(1, 4, [FailureKind.BROKER_LONG], _pools(), 1.0)
    assert 150.0 <= long.outage_s <= 210.0
    assert long.describe() == f"Kafka broker down for {long.outage_s:.0f} s, past the delivery timeout"
    stuck = Failure(0, FailureKind.STUCK_SEND, 1.0, task="accounts-1", notice_s=255.0)
    assert stuck.describe() == "accounts-1 stuck for good in a send (stuck_send)"


def test_a_restore_is_named_with_its_cause():
    (failure,) = drill.plan_failures(1, 1, [FailureKind.WORKER_FROZEN], _pools(), 1.0)
    outcome = FailureOutcome(failure, 3.0, [7, None], causes=["worker_stuck", None], recovered_s=30.0)
    assert outcome.restores() == ["7 (worker_stuck)", "start"]
    assert drill_report.failure_rows(_one_phase_run(failure, outcome))[0][4] == "7 (worker_stuck), then start"
    assert FailureOutcome(failure, 3.0, [5]).restores("the beginning", "checkpoint ") == ["checkpoint 5"]


def _one_phase_run(failure, outcome):
    return drill.DrillReport(
        "drill-1-x", 1, Mode.ALIGNED, "m:p", [failure], [outcome], [], {}, 10, 0, 3, 40.0, [], None
    )


def test_a_plan_needs_kinds_and_a_count_of_zero_or_more():
    with pytest.raises(ConfigError, match="at least one failure kind"):
        drill.plan_failures(3, 1, [], _pools(), 1.0)
    with pytest.raises(ConfigError, match="0 or more"):
        drill.plan_failures(-1, 1, drill.KINDS, _pools(), 1.0)
    assert drill.plan_failures(0, 1, drill.KINDS, _pools(), 1.0) == []


def _report(tmp_path, *, lost: bool):
    plan = drill.plan_failures(2, 1, [FailureKind.RUNNER, FailureKind.BROKER], _pools(), 1.0)
    outcomes = [
        FailureOutcome(plan[0], 12.5, [4], recovered_s=18.2, restore_s=6.1, replayed=830, orphans_gone_s=1.4),
        FailureOutcome(plan[1], 40.0, [], recovered_s=None),
    ]
    reference = pd.DataFrame({"account": ["a"], "window_start": [0], "net": [3], "legs": [2]})
    output = reference.assign(legs=[1] if lost else [2])
    frame = drill_checks.output_frame(output, reference, ["account", "window_start"])
    import functools

    checks = drill_checks.validate(
        {
            "output": (
                functools.partial(
                    drill_checks.output_suite, expected_rows=1, keys=["account", "window_start"], sums=["net", "legs"]
                ),
                frame,
            )
        }
    )
    problems = [] if outcomes[1].recovered else ["failure 2 (Kafka broker down): no checkpoint completed within 180 s"]
    return DrillRun(
        "spark_abs_examples.money:pipeline",
        1,
        [_phase(plan, outcomes, checks, frame, problems, tmp_path)],
        80.0,
        DrillBudget(),
        2,
    )


def _phase(plan, outcomes, checks, frame, problems, tmp_path, mode=Mode.ALIGNED):
    return drill.DrillReport(
        "drill-1-x",
        1,
        mode,
        "spark_abs_examples.money:pipeline",
        plan,
        outcomes,
        checks,
        {"output": frame},
        900,
        1,
        6,
        75.0,
        problems,
        tmp_path,
    )


def plan_kind(run) -> str:
    return run.phases[0].plan[0].kind.value


def test_a_report_names_the_failed_expectation_and_the_failure_not_recovered(tmp_path):
    report = _report(tmp_path, lost=True)
    assert not report.passed
    text = drill_report.render(report)
    assert "FAILED: output: legs equal to the reference for every key" in text
    assert "NOT RECOVERED" in text and "processes gone 1.4 s after the runner" in text
    written = {p.name for p in drill_report.write(report, tmp_path)}
    assert written == {"gx-output.json", "output.csv", "report.json", "report.md", "recoveries.png"}
    summary = json.loads((tmp_path / "report.json").read_text())
    (phase,) = summary["phases"]
    assert summary["passed"] is False and phase["failures"][0]["restored_from"] == [4]
    assert phase["failures"][0]["failure"]["kind"] == plan_kind(report)
    assert summary["recoveries"][0] == {
        "failures": "all",
        "n": 2,
        "p50 s": "18.2",
        "p90 s": "18.2",
        "p99 s": "18.2",
        "max s": "18.2",
        "restore p50 s": "6.1",
        "restores": 1,
        "replayed": 830,
        "not recovered": 1,
    }
    assert json.loads((tmp_path / "gx-output.json").read_text())["success"] is False
    markdown = (tmp_path / "report.md").read_text()
    assert (
        f"| 1 | {plan_kind(report)} |" in markdown
        and "| output | legs equal to the reference for every key |" in markdown
    )
    assert "## Problems" in markdown


def test_a_report_passes_only_when_every_expectation_holds_and_every_failure_recovered(tmp_path):
    report = _report(tmp_path, lost=False)
    assert not report.passed  # the broker failure did not recover
    report.outcomes[1].recovered_s = 9.0
    report.phases[0].problems.clear()
    assert report.passed
    assert drill_report.verdict(report).startswith("PASSED: 2 failures (broker, runner; aligned)")


def test_recovery_percentiles_per_kind_and_mode_and_a_run_of_two_modes_written_apart(tmp_path):
    run = _report(tmp_path, lost=False)
    aligned = run.phases[0]
    aligned.outcomes[1].recovered_s = 40.0
    aligned.problems.clear()
    plan = drill.plan_failures(3, 2, [FailureKind.WORKER], _pools(Mode.UNALIGNED), 1.0)
    outcomes = [
        FailureOutcome(f, 10.0 * i, [i], recovered_s=float(10 + i), restore_s=float(i), replayed=5)
        for i, f in enumerate(plan)
    ]
    run.phases.append(_phase(plan, outcomes, aligned.checks, aligned.frames["output"], [], tmp_path, Mode.UNALIGNED))
    rows = {row[0]: row for row in drill_report.recovery_rows([(str(p.mode), p.outcomes) for p in run.phases])}
    assert set(rows) == {"all", "mode aligned", "mode unaligned", "runner", "broker", "worker"}
    # all: 10, 11, 12, 18.2, 40 -> p50 12, p90 and p99 between the two highest (31.3, 39.1), max 40
    assert rows["all"][1:6] == (5, "12.0", "31.3", "39.1", "40.0")
    assert rows["worker"] == ("worker", 3, "11.0", "11.8", "12.0", "12.0", "1.0", 3, 15, 0)
    assert rows["mode aligned"][1] == 2 and rows["mode unaligned"][1] == 3
    assert run.passed and drill_report.verdict(run).startswith(
        "PASSED: 5 failures (broker, runner, worker; aligned, unaligned)"
    )
    drill_report.write(run, tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "aligned",
        "unaligned",
        "report.json",
        "report.md",
        "recoveries.png",
    }
    assert {p.name for p in (tmp_path / "out" / "unaligned").iterdir()} == {"gx-output.json", "output.csv"}
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## aligned: job drill-1-x" in markdown and "## unaligned: job drill-1-x" in markdown
    assert "| mode unaligned | 3 | 11.0 | 11.8 | 12.0 | 12.0 | 1.0 | 3 | 15 | 0 |" in markdown
    text = drill_report.render(run)
    assert "recoveries (failure to the next completed checkpoint)" in text and text.rstrip().endswith("min)")


def test_percentiles_interpolate_between_ranks_as_numpy_does():
    import numpy as np

    values = [7.2, 18.0, 25.1, 9.9, 55.0, 12.4, 30.3]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_a_duration_reads_as_hours_minutes_and_seconds():
    assert parse_duration("45m") == 2700 and parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90 and parse_duration("90") == 90 and parse_duration("1.5h") == 5400
    for bad in ("", "soon", "5q", "0"):
        with pytest.raises(ConfigError, match="duration"):
            parse_duration(bad)


def test_a_budget_shares_the_duration_between_modes_and_keeps_time_to_drain_and_check():
    budget = DrillBudget(3600.0, reserve_s=150.0)
    # two modes from t=0: the first stops failures at 1800 - 150, the second gets what is left
    assert budget.phase_end(0.0, 3600.0, 2) == 1650.0
    assert budget.phase_end(2000.0, 3600.0, 1) == 3450.0
    assert DrillBudget().phase_end(0.0, None, 2) is None
    # the next failure fits when the 90th percentile of those so far ends before the phase does
    assert budget.estimate([]) == budget.first_estimate_s
    recoveries = [10.0] * 9 + [60.0]
    assert budget.estimate(recoveries) == pytest.approx(15.0)
    assert budget.fits(1000.0, 1015.0, recoveries) and not budget.fits(1000.1, 1015.0, recoveries)
    assert DrillBudget().fits(1e9, None, recoveries)
    with pytest.raises(ConfigError, match="leaves no time for failures"):
        DrillBudget(120.0)
    with pytest.raises(ConfigError, match="recovery limit"):
        DrillBudget(recovery_limit_s=0)


def test_failures_are_shared_between_modes_and_every_first_round_holds_every_kind():
    assert drill.split_failures(100, 2) == [50, 50] and drill.split_failures(7, 2) == [4, 3]
    assert drill.split_failures(None, 2)[0] > 10_000  # bounded by the duration alone
    plan = drill.plan_failures(100, 5, drill.KINDS, _pools(), 1.0)
    rounds = len(drill.KINDS)
    for start in range(0, 100 - rounds + 1, rounds):  # every whole round
        assert {f.kind for f in plan[start : start + rounds]} == set(drill.KINDS)


def _stub_drill(plan, recovered, phase_end=None):
    """A Drill of which only the failure loop runs: each injection recovers in ``recovered[i]`` s (None: never)."""
    stub = drill.Drill.__new__(drill.Drill)
    stub.plan, stub.outcomes, stub.stopped = plan, [], ""
    stub.budget = DrillBudget(recovery_limit_s=60.0)
    stub.failures_end, stub.recover_timeout_s = phase_end, 60.0
    heard = []
    stub.on_failure = heard.append
    stub._log = lambda line: None

    def inject(failure, rng):
        outcome = FailureOutcome(failure, 0.0, recovered_s=recovered[failure.index])
        stub.outcomes.append(outcome)
        return outcome

    stub._inject = inject
    return stub, heard


def test_the_failure_loop_stops_at_a_recovery_over_the_limit_and_at_the_duration():
    import random
    import time

    plan = drill.plan_failures(4, 1, [FailureKind.WORKER], _pools(), 1.0)
    stub, heard = _stub_drill(plan, [5.0, None, 5.0, 5.0])
    assert stub._inject_all(random.Random(1)) is False
    assert len(stub.outcomes) == 2 and len(heard) == 2
    assert (
        stub.stopped.startswith("failure 2 (worker SIGKILLed")
        and "not recovered within the limit of 60 s" in stub.stopped
    )
    stub, heard = _stub_drill(plan, [5.0] * 4)
    assert stub._inject_all(random.Random(1)) is True and len(stub.outcomes) == 4 and stub.stopped == ""
    # the phase ends before the first failure's estimate: none starts, and the report says why
    stub, heard = _stub_drill(plan, [5.0] * 4, phase_end=time.monotonic() + 10.0)
    assert stub._inject_all(random.Random(1)) is True and stub.outcomes == []
    assert stub.stopped == "the duration allowed 0 of the 4 failures planned"


def test_the_drilled_job_finds_new_complete_checkpoints_looking_only_past_the_newest_it_knows(tmp_path):
    from streaming.tools.drill.job import DrilledJob
    from streaming.tools.drill.settings import DrillSettings

    settings = DrillSettings(
        pipeline="spark_abs_examples.money:pipeline",
        mode=Mode.ALIGNED,
        interval_s=1.0,
        store_uri=f"file://{tmp_path / 'store'}",
        report_dir=tmp_path / "report",
    )
    job = DrilledJob(None, "drill-c", settings, max_restores=10)
    fs, layout = job.store.location.filesystem, job.store.layout

    def checkpoint(c: int, complete: bool) -> None:
        fs.create_dir(layout.manifest(c).rsplit("/", 1)[0])
        if complete:
            with fs.open_output_stream(layout.manifest(c)) as f:
                f.write(b"{}")

    assert job.completed() == []
    for c, complete in ((1, True), (2, True), (3, False)):
        checkpoint(c, complete)
    assert job.completed() == [1, 2] == job.store.completed()
    checkpoint(3, True)
    checkpoint(4, False)
    assert job.completed() == [1, 2, 3]
    # what it saw complete it does not look at again: a manifest gone later is not noticed (the drill deletes none)
    fs.delete_file(layout.manifest(1))
    assert job.completed() == [1, 2, 3] and job.store.completed() == [2, 3]

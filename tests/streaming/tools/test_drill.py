"""The drill's plan and report, without services: the failures a seed
draws, where fault points may strike, the Markdown and JSON a report
writes, and a workload named by the user."""

from __future__ import annotations

import collections
import json

import pandas as pd
import pytest

from streaming.api.settings import Mode
from streaming.errors import ConfigError
from streaming.tools import demo, drill, drill_checks, drill_report
from streaming.tools.drill import FailureKind, FailureOutcome


def _pools(mode: Mode = Mode.ALIGNED):
    return drill.fault_pools(demo.pipeline("plan"), mode)


def test_ten_failures_give_every_kind_twice_and_a_seed_draws_the_same_plan_again():
    plan = drill.plan_failures(10, 7, drill.KINDS, _pools(), 1.0)
    assert collections.Counter(f.kind for f in plan) == {kind: 2 for kind in FailureKind}
    assert plan == drill.plan_failures(10, 7, drill.KINDS, _pools(), 1.0)
    assert plan != drill.plan_failures(10, 8, drill.KINDS, _pools(), 1.0)
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


def test_a_plan_needs_kinds_and_a_count_of_zero_or_more():
    with pytest.raises(ConfigError, match="at least one failure kind"):
        drill.plan_failures(3, 1, [], _pools(), 1.0)
    with pytest.raises(ConfigError, match="0 or more"):
        drill.plan_failures(-1, 1, drill.KINDS, _pools(), 1.0)
    assert drill.plan_failures(0, 1, drill.KINDS, _pools(), 1.0) == []


def test_a_workload_is_named_module_colon_function_and_must_be_a_drill_workload():
    assert drill.load_workload(None).keys == ("account", "window_start")
    assert drill.load_workload("streaming.tools.drill:money_workload").sums == ("net", "legs")
    with pytest.raises(ConfigError, match="expected module:function"):
        drill.load_workload("nocolon")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        drill.load_workload("streaming.tools.drill:no_such_workload")
    with pytest.raises(ConfigError, match="not a DrillWorkload"):
        drill.load_workload("streaming.tools.demo:pipeline")


def test_the_money_workload_makes_transfers_and_a_few_malformed_records():
    import random

    records = drill.money_workload(malformed_every=50).records(demo.pipeline("w"), random.Random(1))
    first = [next(records) for _ in range(2000)]
    malformed = [r for r in first if r.malformed]
    assert 20 <= len(malformed) <= 70 and all(not r.value.startswith(b'{"') for r in malformed)
    transfers = [json.loads(r.value) for r in first if not r.malformed]
    assert [t["id"] for t in transfers] == list(range(len(transfers)))
    assert all(r.partition == json.loads(r.value)["id"] % 2 for r in first if not r.malformed)


def _report(tmp_path, *, lost: bool):
    plan = drill.plan_failures(2, 1, [FailureKind.RUNNER, FailureKind.BROKER], _pools(), 1.0)
    outcomes = [
        FailureOutcome(plan[0], 12.5, [4], recovered_s=18.2, replayed=830, orphans_gone_s=1.4),
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
    return drill.DrillReport(
        "drill-1-x",
        1,
        Mode.ALIGNED,
        "streaming.tools.demo:pipeline",
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


def plan_kind(report) -> str:
    return report.plan[0].kind.value


def test_a_report_names_the_failed_expectation_and_the_failure_not_recovered(tmp_path):
    report = _report(tmp_path, lost=True)
    assert not report.passed
    text = drill_report.render(report)
    assert "FAILED: output: legs equal to the reference for every key" in text
    assert "NOT RECOVERED" in text and "processes gone 1.4 s after the runner" in text
    written = {p.name for p in drill_report.write(report, tmp_path)}
    assert written == {"gx-output.json", "output.csv", "report.json", "report.md"}
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["passed"] is False and summary["failures"][0]["restored_from"] == [4]
    assert summary["failures"][0]["failure"]["kind"] == plan_kind(report)
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
    report.problems.clear()
    assert report.passed
    assert drill_report.verdict(report).startswith("PASSED: 2 failures (broker, runner)")

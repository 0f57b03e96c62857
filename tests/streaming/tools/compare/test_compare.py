"""The comparison's bookkeeping (pure): percentiles with checkpoints still
running at the end counted as lower bounds, ratios to the baseline at the
same point, the tables, the JSON, the charts, and options checked before
anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from barriers.coordinator import CheckpointStatus
from streaming.api.pipeline import pipeline_reference
from streaming.errors import ConfigError
from streaming.tools.compare import report as compare_report
from streaming.tools.compare.model import Comparison, Restore, Run, Sample
from streaming.tools.compare.run import check_variants
from streaming.tools.compare.workloads import Workload


def _sample(
    checkpoint_id: int, seconds: float, status: CheckpointStatus = CheckpointStatus.COMPLETED, **fields
) -> Sample:
    return Sample(checkpoint_id, at_s=float(checkpoint_id), status=status, duration_s=seconds, **fields)


def _comparison() -> Comparison:
    c = Comparison(Workload(costs=(1.0, 10.0)), ["aligned", "unaligned", "aligned-timeout"])
    c.runs = [
        Run("aligned", 1.0, "a1", 1250, [_sample(i, 2.0 * i, alignment_s=1.0) for i in range(1, 6)]),
        Run(
            "unaligned", 1.0, "u1", 1250, [_sample(i, 0.2, in_flight_records=100, state_bytes=500) for i in range(1, 6)]
        ),
        Run("aligned-timeout", 1.0, "t1", 1250, [_sample(i, 0.4) for i in range(1, 6)]),
        Run(
            "aligned",
            10.0,
            "a10",
            125,
            [
                _sample(1, 5.0),
                _sample(2, 9.0),
                _sample(3, 12.0, status=CheckpointStatus.PENDING),
                _sample(4, 0.1, CheckpointStatus.ABORTED),
            ],
        ),
        Run("unaligned", 10.0, "u10", 125, [_sample(i, 0.3, in_flight_records=40) for i in range(1, 4)]),
        Run(
            "aligned-timeout",
            10.0,
            "t10",
            125,
            [_sample(i, 0.5, switches=("slow-0: timeout_while_announced after 201 ms",)) for i in range(1, 4)],
        ),
    ]
    for run in c.runs:
        run.mean_record_bytes = 30.0
    c.runs[1].restore = Restore(5, ready_s=3.5, replayed_s=7.25, replay_records=900)
    c.runs[0].restore = Restore(5, ready_s=3.0, replayed_s=None, replay_records=0)
    return c


def test_percentiles_count_checkpoints_still_running_as_lower_bounds_and_leave_out_aborted_ones():
    run = _comparison().run("aligned", 10.0)
    assert run.durations() == [5.0, 9.0, 12.0]
    assert run.percentile(50) == 9.0 and run.percentile(99) == pytest.approx(11.94)
    assert run.count(CheckpointStatus.COMPLETED) == 2
    assert run.count(CheckpointStatus.PENDING) == 1 and run.count(CheckpointStatus.ABORTED) == 1


def test_ratios_are_taken_against_the_baseline_at_the_same_point():
    c = _comparison()
    assert c.ratio("aligned", 1.0) == 1.0
    assert c.ratio("unaligned", 1.0) == pytest.approx(0.2 / 6.0)
    assert c.ratio("unaligned", 10.0) == pytest.approx(0.3 / 9.0)
    assert c.ratio_to("aligned-timeout", "unaligned", 10.0) == pytest.approx(0.5 / 0.3)
    assert c.ratio("unaligned", 3.0) is None


def test_channel_state_bytes_are_its_records_times_the_mean_record_size():
    run = _comparison().run("unaligned", 10.0)
    assert run.in_flight_bytes_referenced == 40 * 30.0
    assert _comparison().run("aligned-timeout", 10.0).switch_reasons == {"timeout_while_announced": 3}


def test_the_tables_show_every_run_with_its_ratio_and_the_summary_says_the_ratios():
    text = compare_report.render_tables(_comparison())
    rows = {tuple(line.split()[:4]): line.split() for line in text.splitlines() if "ms/record" in line}
    # point, variant, done, pending, aborted, p50, p90, p99, ÷ aligned, first barrier, align
    aligned_10 = rows[("10", "ms/record", "aligned", "2")]
    assert aligned_10[3:11] == ["2", "1", "1", "9.00", "11.40", "11.94", "1", "0.00"]
    unaligned_1 = rows[("1", "ms/record", "unaligned", "5")]
    assert unaligned_1[6:10] == ["0.20", "0.20", "0.20", "0.0333"]
    assert "1× timeout_while_announced" not in text and "3× timeout_while_announced" in text
    assert "not in time" in text  # aligned at 1 ms: its restore's channel state was not replayed in time
    assert "10 ms/record: aligned-timeout took 1.67 × the time of unaligned (p50)" in text
    assert "10 ms/record: unaligned took 0.0333 × the time of aligned (p50)" in text


def test_the_json_holds_every_checkpoint_and_reads_back():
    c = _comparison()
    again = Comparison.from_json(c.to_json())
    assert again.workload == c.workload and again.variants == c.variants
    assert [(r.variant, r.point, r.samples, r.restore) for r in again.runs] == [
        (r.variant, r.point, r.samples, r.restore) for r in c.runs
    ]


def test_the_charts_are_written_as_non_empty_pngs(tmp_path):
    written = compare_report.write(_comparison(), tmp_path / "out")
    names = [p.name for p in written]
    assert names == ["comparison.json", "tables.txt", *compare_report.CHARTS]
    for path in written:
        assert path.stat().st_size > 0
    for name in compare_report.CHARTS:
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_one_point_workload_draws_its_variants_side_by_side(tmp_path):
    c = Comparison(Workload(kind="money", keys=10), ["aligned", "unaligned"])
    c.runs = [Run("aligned", 0.0, "a", 300, [_sample(1, 1.5)]), Run("unaligned", 0.0, "u", 300, [_sample(1, 0.5)])]
    assert compare_report.chart(c, "checkpoint-times.png", tmp_path).stat().st_size > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "nope"}, "--workload nope"),
        ({"costs": ()}, "--costs"),
        ({"costs": (1.0, 1.0)}, "each at most once"),
        ({"duration_s": 0}, "--duration must be positive"),
        ({"rate": -1.0}, "--rate must be positive"),
        ({"backlogs": (0,)}, "--backlogs"),
        ({"kind": "money", "keys": 1}, "two"),
    ],
)
def test_bad_workload_options_name_the_option(options, message):
    with pytest.raises(ConfigError, match=message):
        Workload(**options)


def test_the_workload_decides_points_rates_and_pipelines():
    w = Workload(costs=(1.0, 10.0), load=1.5)
    assert w.points == (1.0, 10.0) and w.rate_of(10.0) == 150.0
    assert w.pipeline_ref(10.0) == "streaming.tools.compare.slow:slow_pipeline?ms_per_record=10"
    backlog = Workload(kind="backlog", backlogs=(100, 200))
    assert backlog.points == (100.0, 200.0) and backlog.job_points == (0.0,) and not backlog.continuous
    # the money workload names its pipeline (the library does not import the examples)
    money = Workload(kind="money", rate=50.0).pipeline_ref(0.0)
    assert money == "money" and pipeline_reference(money) == "spark_abs_examples.money:pipeline"


def test_bad_variants_fail_before_anything_starts():
    with pytest.raises(ConfigError, match="--variants bogus"):
        check_variants(["aligned", "bogus"])
    with pytest.raises(ConfigError, match="each at most once"):
        check_variants(["aligned", "aligned"])


def test_cli_help_and_bad_options_before_anything_starts(tmp_path):
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "streaming.tools.cli", "--home", str(tmp_path), *a],
        capture_output=True,
        text=True,
        timeout=60,
    )
    help_text = run("compare", "--help")
    assert help_text.returncode == 0 and "--workload" in help_text.stdout and "side by side" in help_text.stdout
    bad = run("compare", "--variants", "aligned,sideways")
    assert bad.returncode == 2 and "sideways" in bad.stderr and "Traceback" not in bad.stderr
    not_numbers = run("compare", "--costs", "1,many")
    assert not_numbers.returncode == 2 and "--costs 1,many" in not_numbers.stderr
    zero = run("compare", "--duration", "0")
    assert zero.returncode == 2 and "--duration must be positive" in zero.stderr
    # nothing was started for any: no runtime in the home
    assert not (tmp_path / "runtime").exists()


def _job_with(records, positions=None):
    """A comparison job as ``_read`` and ``_records_per_s`` see it: its
    coordinator's checkpoint records and the tasks' progress positions."""
    from types import SimpleNamespace

    from barriers.messages import ChannelId
    from streaming.tools.compare.run import _Job

    coordinator = SimpleNamespace(records={r.checkpoint_id: r for r in records}, positions=positions or {})
    pipeline = SimpleNamespace(ingress_channels=lambda: [ChannelId("t", 0), ChannelId("t", 1)])
    runner = SimpleNamespace(coordinator=coordinator, pipeline=pipeline)
    return _Job("unaligned", 10.0, runner, Run("unaligned", 10.0, "j", 100), "t", 2, counted_from=2)


def _record(checkpoint_id, triggered_at, barriers, tasks, status="completed"):
    """A coordinator's record of a checkpoint whose ``tasks`` wrote these
    positions and ranges (``in_flight``) and measured ``first_barrier_s``."""
    from types import SimpleNamespace

    from streaming.adapters.snapshots import TaskCheckpointMetrics, TaskSnapshot

    return SimpleNamespace(
        checkpoint_id=checkpoint_id,
        triggered_at=triggered_at,
        ingress_offsets=barriers,
        tasks={
            name: TaskCheckpointMetrics(first_barrier_s=task.get("first_barrier_s")) for name, task in tasks.items()
        },
        snapshots={
            name: TaskSnapshot(
                name,
                checkpoint_id,
                0,
                positions=task.get("positions", {}),
                in_flight={c: tuple(r) for c, r in task.get("in_flight", {}).items()},
            )
            for name, task in tasks.items()
        },
        status=CheckpointStatus(status),
    )


def test_records_read_count_data_records_only_between_two_checkpoints():
    from streaming.tools.compare.run import _read, _records_per_s

    records = [
        _record(1, 0.0, {"t:0": 10, "t:1": 10}, {}),  # the warm-up's: not counted
        # aligned in t:0 (resumes after barrier 2 at 30), unaligned in t:1 (read up to 25 at its snapshot)
        _record(
            2,
            10.0,
            {"t:0": 30, "t:1": 40},
            {"slow-0": {"positions": {"t:0": 31, "t:1": 41}, "in_flight": {"t:1": [25, 40]}, "first_barrier_s": 1.0}},
        ),
        _record(
            3,
            20.0,
            {"t:0": 60, "t:1": 70},
            {"slow-0": {"positions": {"t:0": 61, "t:1": 71}, "first_barrier_s": 1.0}},
        ),
    ]
    job = _job_with(records, positions={"slow-0": {"t:0": 61, "t:1": 45}})
    # checkpoint 2: t:0 read 31 offsets, 2 of them barriers (10, 30); t:1 read 25, 1 barrier (10)
    # checkpoint 3: t:0 61 - 3 barriers, t:1 71 - 3 barriers; ten seconds later
    assert _records_per_s(job) == ((58 + 68) - (29 + 24)) / 10.0
    # progress: positions less the barriers in front of them
    assert _read(job) == {0: 58, 1: 43}

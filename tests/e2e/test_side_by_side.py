"""`spark-abs compare` on the real runtime, a tiny run: aligned, unaligned
and aligned-timeout jobs side by side under a continuous source into a slow
stage, judged by what their checkpoints recorded (which kind, why a task
switched, what is channel state), never by wall time; the report's charts
and JSON are written; the restore at the end is measured."""

from __future__ import annotations

import pytest

from streaming.tools.checkpoints.inspection import Checkpoints
from streaming.tools.compare import report as compare_report
from streaming.tools.compare.model import Comparison
from streaming.tools.compare.run import run_compare
from streaming.tools.compare.workloads import Workload

pytestmark = pytest.mark.integration

# the timeout passes before the barrier is read: the barrier is announced (the trigger event) at
# once, and the backlog in front of it takes the slow stage far longer than 200 ms to read
SWITCHED_BEFORE_READING = {"timeout_while_announced", "late_announcement"}


def test_aligned_unaligned_and_the_timeout_from_the_trigger_side_by_side(connection, tmp_path, lines):
    store = f"file://{tmp_path}/store"
    workload = Workload(costs=(10.0,), load=1.5, duration_s=8, warmup_s=2, interval_s=1, timeout_ms=200)
    comparison = run_compare(
        connection,
        store_uri=store,
        workload=workload,
        variants=("aligned", "unaligned", "aligned-timeout"),
    )
    log = "\n".join(lines)
    aligned, unaligned, timeout = (comparison.run(v, 10.0) for v in comparison.variants)
    for run in (aligned, unaligned, timeout):
        assert run.samples, log
        assert run.restore is not None and run.restore.ready_s is not None, log
    for sample in aligned.samples:
        if sample.status == "completed":  # the snapshot waited for the backlog: nothing of it is channel state
            assert sample.kinds == ("aligned",) and sample.in_flight_records == 0 and not sample.switches
    completed = [s for s in unaligned.samples if s.status == "completed"]
    assert completed and all(s.kinds == ("unaligned",) for s in completed), log
    assert any(s.in_flight_records > 0 for s in completed), log
    switched = [s for s in timeout.samples if s.status == "completed"]
    assert switched, log
    for sample in switched:
        assert sample.kinds == ("timed_out_to_unaligned",), sample  # stored by name
        (entry,) = sample.switches
        assert entry.split(": ")[1].split(" after ")[0] in SWITCHED_BEFORE_READING, entry
    # what the manifest itself says of the aligned-timeout job's latest checkpoint
    checkpoints = Checkpoints.open(store, timeout.job, connection)
    try:
        latest = max(r.checkpoint_id for r in checkpoints.rows() if r.usable)
        (task,) = checkpoints.detail(latest).tasks
    finally:
        checkpoints.close()
    assert task.switch_reason in {
        "the alignment timeout passed while its announced barriers were still unread",
        "its first barrier was announced after the alignment timeout had passed since the trigger",
    }
    assert task.switched_after_ms >= 200 and sum(b - a for a, b in task.in_flight.values()) > 0
    # the report: JSON that reads back, the tables, and non-empty charts
    written = compare_report.write(comparison, tmp_path / "report")
    assert all(p.stat().st_size > 0 for p in written)
    again = Comparison.from_json((tmp_path / "report" / "comparison.json").read_text())
    assert [len(r.samples) for r in again.runs] == [len(r.samples) for r in comparison.runs]
    assert "aligned-timeout took" in (tmp_path / "report" / "tables.txt").read_text()

"""The demo's summary: a table of its checkpoints (as the other tools print
theirs), then its restores, output check and dead letters."""

from __future__ import annotations

from types import SimpleNamespace

from barriers.coordinator import CheckpointStatus
from spark_abs_examples.money import Money
from streaming.api.settings import Mode
from streaming.tools.demo.report import DemoReport


def _record(checkpoint_id, status, duration_s=None, reason=""):
    return SimpleNamespace(checkpoint_id=checkpoint_id, status=status, duration_s=duration_s, reason=reason)


def test_the_summary_tables_each_checkpoint_with_its_money_and_says_what_the_run_gave():
    report = DemoReport(
        mode=Mode.ALIGNED,
        job="money-demo-x",
        transfers=2000,
        money=[Money(1, 0, 0, 10), Money(2, 5, -3, 10)],
        restores=[SimpleNamespace(checkpoint_id=1, generation=1, reason="worker all died")],
        output_rows=200,
        expected_rows=200,
        output_matches=True,
        dead_letters=0,
        checkpoints=[
            _record(1, CheckpointStatus.COMPLETED, 11.97),
            _record(2, CheckpointStatus.COMPLETED, 10.5),
            _record(3, CheckpointStatus.PENDING),
        ],
    )
    lines = report.render().splitlines()
    assert lines[0] == "job money-demo-x: 2000 transfers"
    header = next(line for line in lines if "money conserved" in line).split()
    assert header == ["checkpoint", "status", "seconds", "balances", "in", "flight", "accounts", "money", "conserved"]
    rows = {line.split()[0]: line.split() for line in lines if line.strip()[:1].isdigit()}
    assert rows["1"] == ["1", "completed", "11.97", "0", "0", "10", "yes"]
    assert rows["2"] == ["2", "completed", "10.50", "5", "-3", "10", "NO:", "2"]
    assert rows["3"][:3] == ["3", "stopped", "-"] and "the job stopped before it completed" in " ".join(rows["3"])
    assert "restore: generation 1 from checkpoint 1 (worker all died)" in lines
    assert "output: 200 window rows committed, 200 expected from a run without failures: identical" in lines
    assert lines[-1] == "dead letters: 0"
    assert not report.passed  # checkpoint 2 lost money

"""`spark-abs compare` on the real runtime: aligned and unaligned jobs side by
side on the same backlog, judged by what their checkpoints recorded (which
kind, what was held, what is channel state), never by wall time."""

from __future__ import annotations

import pytest

from streaming.tools.compare import run_compare

pytestmark = pytest.mark.integration


def test_aligned_and_unaligned_side_by_side(connection, tmp_path):
    lines: list[str] = []
    comparison = run_compare(
        connection,
        store_uri=f"file://{tmp_path}/store",
        variants=("aligned", "unaligned"),
        backlogs=(400, 800),
        say=lines.append,
    )
    assert [(r.variant, r.round) for r in comparison.rounds] == [
        ("aligned", 1),
        ("unaligned", 1),
        ("aligned", 2),
        ("unaligned", 2),
    ], "\n".join(lines)
    for r in comparison.of("aligned"):
        # the aligned snapshot waited for the backlog: nothing of it is channel state
        assert r.kind == "aligned" and r.in_flight_records == 0
    for r in comparison.of("unaligned"):
        # the unaligned one started at the announcement: the unread backlog is channel state, nothing was held
        assert r.kind == "unaligned" and r.held_bytes_max == 0
        assert r.in_flight_records > 0
    assert [r.backlog for r in comparison.of("aligned")] == [400, 800]
    assert len(comparison.ratios("unaligned")) == 2
    assert "unaligned" in comparison.render() and "round 2: unaligned checkpoint" in "\n".join(lines)

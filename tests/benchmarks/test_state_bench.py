"""The keyed-state benchmark's figures, on a state small enough for a unit test."""

from __future__ import annotations

from benchmarks.state import _markdown, measure


def test_the_state_benchmark_rebuilds_the_state_from_its_chain_and_keeps_within_a_memory_budget():
    budget = 20_000
    row = measure(5_000, batches=10, batch=1_000, checkpoint_every=5, memory_bytes=budget)
    assert row["chain_links"] == 2 and row["changed_keys"] > 0
    assert row["rows_in_memory_mb"] * 1e6 <= budget < row["rows_mb"] * 1e6  # the rest spilled
    assert row["spilled_mb"] > 0
    assert "Under a budget of 0 MB of rows in memory" in _markdown([row], 1_000, 5)
    plain = measure(5_000, batches=5, batch=1_000, checkpoint_every=5)
    assert plain["rows_in_memory_mb"] is None and "rows held MB" in _markdown([plain], 1_000, 5)

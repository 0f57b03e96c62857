"""The dead-letter collector."""

from __future__ import annotations

import pyarrow as pa

from operators import DeadLetter, DeadLetters, Reason


def test_collects_in_order_drains_and_moves() -> None:
    letters = DeadLetters()
    letters.add(pa.table({"x": [1, 2]}), Reason.LATE, "Op")
    letters.add(pa.table({"x": pa.array([], pa.int64())}), Reason.NULL_KEY, "Op")  # ignored
    other = DeadLetters()
    other.add(pa.table({"y": ["a"]}), "custom reason", "Other")
    letters.absorb(other)
    letters.absorb(letters)
    assert len(letters) == 3 and len(other) == 0
    assert list(letters) == [
        DeadLetter({"x": 1}, "late", "Op"),
        DeadLetter({"x": 2}, "late", "Op"),
        DeadLetter({"y": "a"}, "custom reason", "Other"),
    ]
    batches = letters.drain_batches()
    assert [(b.rows.num_rows, b.reason) for b in batches] == [(2, "late"), (1, "custom reason")]
    assert letters.drain() == [] and len(letters) == 0


def test_reasons_compare_equal_to_strings() -> None:
    assert Reason.LATE == "late" and Reason.NULL_KEY == "null_key"
    assert {r.value for r in Reason} == {"null_key", "null_event_time", "null_value", "late", "no_match"}

"""A micro-batch's rows in channel and offset order: sorted only when they
are not already, the result the same either way."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from streaming.adapters.spark.query import in_channel_order

ORDER = [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
ROWS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 5)), max_size=25)


@given(ROWS, st.booleans())
def test_the_order_is_a_stable_sort_by_channel_and_offset(rows, presorted):
    if presorted:
        rows = sorted(rows, key=lambda r: r[:3])
    table = pa.table(
        {
            "topic": [r[0] for r in rows],
            "partition": pa.array([r[1] for r in rows], pa.int32()),
            "offset": pa.array([r[2] for r in rows], pa.int64()),
            "row": list(range(len(rows))),  # which row is which: a stable sort keeps ties in order
        }
    )
    assert in_channel_order(table).to_pylist() == table.sort_by(ORDER).to_pylist()


def test_a_table_in_order_is_handed_on_as_it_is():
    table = pa.table({"topic": ["a", "a", "b"], "partition": [1, 1, 0], "offset": [3, 3, 1]})
    assert in_channel_order(table) is table


@given(ROWS)
def test_a_micro_batch_in_channel_order_splits_into_one_run_per_channel(rows):
    from streaming.engine.worker.worker import _by_channel

    rows = sorted(rows, key=lambda r: r[:3])
    table = pa.table(
        {
            "topic": pa.array([r[0] for r in rows], pa.string()),
            "partition": pa.array([r[1] for r in rows], pa.int32()),
            "offset": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    runs = _by_channel(table)
    assert [(c.topic, c.partition) for c, _ in runs] == sorted({(r[0], r[1]) for r in rows})
    assert [r for _, part in runs for r in part.to_pylist()] == table.to_pylist()
    assert all(
        set(zip(part["topic"].to_pylist(), part["partition"].to_pylist())) == {(c.topic, c.partition)}
        for c, part in runs
    )

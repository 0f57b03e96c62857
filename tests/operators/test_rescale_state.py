"""Dividing state among a new number of tasks: keyed tables by the routing
key, buffered rows by their column, watermarks by their minimum, and a clear
refusal for a table that says nothing of how it divides."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import TumblingWindowAggregate, count, sum_
from operators.rescale import MIN, RESCALE_METADATA, StateDivisionError, rows_by, split_state
from operators.state import KeyedState


def assign(table: pa.Table, column: str, parts: int) -> pa.Array:
    """The routing of streaming.api.pipeline.route: crc32 of the key's text."""
    texts = pc.cast(table[column], pa.string()).to_pylist()
    return pa.array([zlib.crc32(t.encode()) % parts for t in texts], pa.int64())


def keyed(rows: dict[str, int]) -> pa.Table:
    state = KeyedState(["account"], ["balance"])
    state.upsert(pa.table({"account": list(rows), "balance": list(rows.values())}))
    return state.snapshot()


@pytest.mark.parametrize("parts", [1, 3])
def test_keyed_rows_go_to_the_task_their_key_now_routes_to(parts):
    old = [
        {"balances": keyed({"a": 1, "b": 2, "c": 3})},
        {"balances": keyed({"d": 4, "e": 5, "f": 6, "g": 7})},
    ]
    new = split_state(old, parts, ["account"], assign)
    assert len(new) == parts
    seen = []
    for index, state in enumerate(new):
        table = state["balances"]
        assert assign(table, "account", parts).to_pylist() == [index] * table.num_rows
        assert table.schema.metadata == old[0]["balances"].schema.metadata  # still says its keys
        seen += table.to_pylist()
    assert sorted(seen, key=lambda r: r["account"]) == [
        {"account": a, "balance": b} for a, b in zip("abcdefg", range(1, 8))
    ]


def test_a_watermark_table_gives_every_task_the_lowest_one():
    def mark(value):
        return pa.table({"watermark": pa.array([value], pa.int64())}).replace_schema_metadata({RESCALE_METADATA: MIN})

    new = split_state([{"watermark": mark(900)}, {"watermark": mark(400)}, {"watermark": mark(None)}], 2, [], assign)
    assert [s["watermark"]["watermark"].to_pylist() for s in new] == [[400], [400]]


def test_buffered_rows_follow_their_column():
    rows = pa.table({"id": ["x", "y", "x", "z"], "n": [1, 2, 3, 4]}).replace_schema_metadata(
        {RESCALE_METADATA: rows_by("id")}
    )
    new = split_state([{"pending": rows}, {"pending": rows.slice(0, 0)}], 2, ["id"], assign)
    got = [s["pending"] for s in new]
    assert sum(t.num_rows for t in got) == 4
    for index, table in enumerate(got):
        assert set(assign(table, "id", 2).to_pylist()) <= {index}
    both_x = [t for t in got if "x" in t["id"].to_pylist()][0]
    assert both_x.filter(pc.equal(both_x["id"], "x"))["n"].to_pylist() == [1, 3]  # order kept


def test_a_table_that_does_not_say_how_it_divides_is_refused_by_name():
    plain = pa.table({"total": [5]})
    with pytest.raises(StateDivisionError, match="'totals' does not say how it divides"):
        split_state([{"totals": plain}, {"totals": plain}], 3, ["account"], assign)


def test_keyed_state_not_keyed_by_the_routing_column_is_refused():
    with pytest.raises(StateDivisionError, match=r"keyed by \('account',\).*by 'user'"):
        split_state([{"balances": keyed({"a": 1})}], 2, ["user"], assign)


def test_state_of_a_stage_fed_by_partition_is_refused():
    with pytest.raises(StateDivisionError, match="partition"):
        split_state([{"balances": keyed({"a": 1})}], 2, [], assign)


def test_tables_empty_in_every_task_need_no_rule():
    empty = pa.table({"total": pa.array([], pa.int64())})
    new = split_state([{"totals": empty}, {"totals": empty}], 3, ["account"], assign)
    assert [s["totals"].num_rows for s in new] == [0, 0, 0]


def test_window_state_divided_restores_into_fresh_operators_and_closes_the_same_windows():
    def windows():
        return TumblingWindowAggregate("account", "ts", 100, {"net": sum_("amount"), "legs": count()})

    rows = pa.table({"account": list("abcdabcd"), "ts": [10, 20, 30, 40, 150, 160, 170, 180], "amount": range(8)})
    whole = windows()
    whole.process(rows)
    expected = whole.on_watermark(1_000).sort_by([("account", "ascending"), ("window_start", "ascending")])
    halves = [windows(), windows()]
    halves[0].process(rows.filter(pc.is_in(rows["account"], pa.array(["a", "b"]))))
    halves[1].process(rows.filter(pc.is_in(rows["account"], pa.array(["c", "d"]))))
    divided = split_state([h.snapshot() for h in halves], 3, ["account"], assign)
    closed = []
    for state in divided:
        operator = windows()
        operator.restore(state)
        closed.append(operator.on_watermark(1_000))
    got = pa.concat_tables(closed).sort_by([("account", "ascending"), ("window_start", "ascending")])
    assert got.to_pylist() == expected.to_pylist()

"""The rows' origin (``operators.dead_letters.ORIGIN``): every built-in
operator gives the same output and dead letters with it as without it, a
dead letter taken from the input names the input row it was, and the
operators that pass rows on keep each row's own origin."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import (
    Chain,
    Deduplicate,
    IntervalJoin,
    KeyedAggregate,
    KeyedProcess,
    KeyedProcessFunction,
    LatestValueJoin,
    SessionWindowAggregate,
    SlidingWindowAggregate,
    TumblingWindowAggregate,
    Union,
    count,
    filter_rows,
    flat_map,
    map_batches,
    select,
    sum_,
    with_column,
)
from operators.dead_letters import ORIGIN, ORIGIN_TYPE, without_origin

ROWS = pa.schema([("k", pa.int64()), ("t", pa.int64()), ("v", pa.int64()), ("tags", pa.list_(pa.string()))])
# per batch: keys (one null), times (one null, one late after the watermark below)
BATCHES = [
    [(1, 100, 5, ["a"]), (2, 150, 6, ["b", "c"]), (None, 160, 7, []), (1, None, 8, ["d"])],
    [(1, 120, 9, ["e"]), (2, 5_000, 10, None), (3, 5_100, 11, ["f"]), (1, 5_200, 12, ["g"])],
    [(1, 50, 13, ["h"]), (3, 9_000, 14, ["i"]), (2, 9_100, 15, ["j"])],
]
WATERMARKS = [None, 4_000, 20_000]


def batch(index: int, *, side: str = "in", origin: bool) -> pa.Table:
    rows = [dict(zip(ROWS.names, values)) for values in BATCHES[index]]
    table = pa.Table.from_pylist(rows, schema=ROWS)
    if not origin:
        return table
    offsets = [100 * index + n for n in range(table.num_rows)]
    origins = [{"topic": side, "partition": index, "offset": offset} for offset in offsets]
    return table.append_column(ORIGIN, pa.array(origins, ORIGIN_TYPE))


def source_row(origin: dict) -> dict:
    """The input row ``origin`` names, as ``batch`` made it (without its origin)."""
    index, position = origin["partition"], origin["offset"] % 100
    return dict(zip(ROWS.names, BATCHES[index][position]))


class Emit(KeyedProcessFunction):
    def process_rows(self, key, rows, ctx):
        assert all(ORIGIN not in row for row in rows), "the function saw the origin column"
        return [{"k": key, "n": len(rows)}]


def one_input(index: int, origin: bool) -> pa.Table:
    return batch(index, origin=origin)


def two_inputs(index: int, origin: bool) -> dict[str, pa.Table]:
    right = batch(index, side="right", origin=origin)
    right = right.rename_columns(["k", "t2", "w", "tags2", *([ORIGIN] if origin else [])])
    return {"left": batch(index, side="left", origin=origin), "right": right.filter(pc.is_valid(right["k"]))}


def driven(make, inputs=one_input):
    """A run of ``make()``'s operator over the batches (``inputs`` makes each
    call's input), the watermarks between them: the operator and its outputs."""

    def run(origin: bool):
        op = make()
        outputs = []
        for index, watermark in enumerate(WATERMARKS):
            if watermark is not None and hasattr(op, "on_watermark"):
                outputs.append(op.on_watermark(watermark))
            outputs.append(op.process(inputs(index, origin)))
        return op, outputs

    return run


# (name, run, whether each output row is one input row whose origin it keeps)
CASES = [
    ("filter", driven(lambda: filter_rows(pc.field("v") > 6)), True),
    ("select", driven(lambda: select("k", "v")), True),
    ("with_column", driven(lambda: with_column("w", pc.field("v") * 2)), True),
    ("flat_map", driven(lambda: flat_map("tags")), True),
    ("chain", driven(lambda: Chain(filter_rows(pc.field("v") > 5), select("k", "t"))), True),
    ("dedup", driven(lambda: Deduplicate("k", "t", 1_000)), True),
    ("keyed aggregate", driven(lambda: KeyedAggregate("k", {"n": count(), "s": sum_("v")})), False),
    ("tumbling", driven(lambda: TumblingWindowAggregate("k", "t", 1_000, {"n": count()})), False),
    ("sliding", driven(lambda: SlidingWindowAggregate("k", "t", 2_000, 1_000, {"n": count()})), False),
    ("sessions", driven(lambda: SessionWindowAggregate("k", "t", 500, {"n": count()})), False),
    ("keyed process", driven(lambda: KeyedProcess("k", Emit(), time_column="t")), False),
    ("latest value join", driven(lambda: LatestValueJoin("k", unmatched="dead_letter"), two_inputs), True),
    (
        "interval join",
        driven(lambda: IntervalJoin("k", left_time="t", right_time="t2", lower=-100, upper=100), two_inputs),
        True,
    ),
    ("union", driven(lambda: Union(("left", "right")), two_inputs), True),
]


def letters_of(op) -> list:
    return op.dead_letters.drain() if hasattr(op, "dead_letters") else []


@pytest.mark.parametrize(("name", "run", "keeps"), CASES, ids=[case[0] for case in CASES])
def test_the_origin_changes_nothing_else_and_traces_each_row(name, run, keeps):
    plain_op, plain = run(False)
    traced_op, traced = run(True)
    assert [out.to_pylist() for out in plain] == [without_origin(out).to_pylist() for out in traced]
    plain_letters, traced_letters = letters_of(plain_op), letters_of(traced_op)
    assert [(letter.reason, letter.row) for letter in plain_letters] == [
        (letter.reason, {c: v for c, v in letter.row.items() if c != ORIGIN}) for letter in traced_letters
    ]
    # every dead letter here is an input row: it names the row it was
    for letter in traced_letters:
        origin = letter.row[ORIGIN]
        assert origin is not None, f"{name}: dead letter {letter} has no origin"
        assert all(letter.row[c] == v for c, v in source_row(origin).items() if c in letter.row), letter
    if keeps:
        rows = [row for out in traced if out.num_rows for row in out.to_pylist()]
        assert rows, f"{name}: the case gives no output to check"
        for row in rows:
            origin = row[ORIGIN]
            assert origin is not None and origin["topic"] in ("in", "left", "right")
            source = source_row(origin)
            assert row["k"] == source["k"], row
    else:
        assert all(ORIGIN not in out.column_names for out in traced)


def test_a_dead_letter_case_is_in_the_cases():
    """The cases above reject rows for null keys, null times and lateness, so the origin checks run."""
    reasons = set()
    for _, run, _ in CASES:
        op, _ = run(True)
        reasons |= {letter.reason for letter in letters_of(op)}
    assert {"null_key", "null_event_time", "late"} <= reasons


OLD_ORIGIN = pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])


@pytest.mark.parametrize("buffered", ["without", "older type"])
def test_rows_buffered_before_restore_fit_rows_read_after_it(buffered):
    """Snapshots of another release: buffered rows without an origin, or with one of another type."""
    for make, side in (
        (lambda: LatestValueJoin("k"), "pending"),
        (lambda: IntervalJoin("k", left_time="t", right_time="t2", lower=-100, upper=100), "left"),
    ):
        op = make()
        op.process({"left": batch(0, side="left", origin=False).filter(pc.is_valid(pc.field("k")))})
        state = op.snapshot()
        table = state[side]
        if buffered == "older type":
            table = table.append_column(
                ORIGIN,
                pa.array([{"topic": "in", "partition": 0, "offset": n} for n in range(table.num_rows)], OLD_ORIGIN),
            )
        restored = make()
        restored.restore({**state, side: table})
        right = batch(0, side="right", origin=True).rename_columns(["k", "t2", "w", "tags2", ORIGIN])
        out = restored.process({"right": right.filter(pc.is_valid(right["k"]))})
        assert out.num_rows, side
        restored.process({"left": batch(1, side="left", origin=True).filter(pc.is_valid(pc.field("k")))})
        if ORIGIN in out.column_names and buffered == "older type":
            assert out[ORIGIN].type == ORIGIN_TYPE


def test_functions_of_ones_own_see_rows_without_their_origin():
    seen = []

    def fn(table):
        seen.append(table.column_names)
        return table.rename_columns(["x", "y"])

    out = Chain(select("k", "v"), map_batches(fn)).process(batch(0, origin=True))
    assert seen == [["k", "v"]] and out.column_names == ["x", "y"]
    kept = filter_rows(lambda t: pc.is_valid(t["k"]) if seen.append(t.column_names) is None else None)
    assert ORIGIN in kept.process(batch(0, origin=True)).column_names and seen[-1] == ROWS.names

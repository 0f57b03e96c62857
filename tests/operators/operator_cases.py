"""Shared strategies and reference models for the operator tests: random
input batches for each stateful operator, and plain-Python models of what
each operator must output, row by row."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from operators import DeadLetter
from operators.testing import Watermark

KEYS_STR = ["a", "b", "c", "d"]
KEYS_INT = [1, 2, 3, 40]

ACCOUNT_SCHEMA_STR = pa.schema([("account", pa.string()), ("amount", pa.int64())])
ACCOUNT_SCHEMA_INT = pa.schema([("account", pa.int64()), ("amount", pa.int64())])


def table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def maybe_null(values: st.SearchStrategy, null_weight: int = 8) -> st.SearchStrategy:
    """``values``, or None about one time in ``null_weight``."""
    return st.one_of(*[values] * (null_weight - 1), st.none())


def cuts(steps: list) -> st.SearchStrategy[int]:
    return st.integers(0, len(steps))


# -- keyed aggregate -------------------------------------------------------


@st.composite
def account_batches(draw, *, null_amounts: bool = True, max_batches: int = 6) -> list[pa.Table]:
    keys = draw(st.sampled_from([KEYS_STR, KEYS_INT]))
    schema = ACCOUNT_SCHEMA_STR if keys is KEYS_STR else ACCOUNT_SCHEMA_INT
    amount = st.integers(-50, 50)
    row = st.fixed_dictionaries(
        {
            "account": maybe_null(st.sampled_from(keys)),
            "amount": maybe_null(amount) if null_amounts else amount,
        }
    )
    batches = draw(st.lists(st.lists(row, max_size=8), max_size=max_batches))
    return [table(rows, schema) for rows in batches]


def keyed_aggregate_model(batches: list[pa.Table], key: str = "account", value: str = "amount"):
    """Expected outputs and dead letters of KeyedAggregate with count(),
    sum_, min_, max_ of ``value`` and count(value)."""
    state: dict[Any, dict[str, Any]] = {}
    outputs, letters = [], []
    for batch in batches:
        order: list[Any] = []
        for row in batch.to_pylist():
            k, v = row[key], row[value]
            if k is None:
                letters.append(DeadLetter(row, "null_key", "KeyedAggregate"))
                continue
            if k not in order:
                order.append(k)
            s = state.setdefault(k, {"count": 0, "total": None, "lo": None, "hi": None, "valid": 0})
            s["count"] += 1
            if v is not None:
                s["valid"] += 1
                s["total"] = v if s["total"] is None else s["total"] + v
                s["lo"] = v if s["lo"] is None else min(s["lo"], v)
                s["hi"] = v if s["hi"] is None else max(s["hi"], v)
        outputs.append([{key: k, **state[k]} for k in order])
    return outputs, letters


# -- tumbling windows ------------------------------------------------------


@st.composite
def window_steps(draw, *, watermarks: bool = True, max_steps: int = 7) -> list:
    row = st.fixed_dictionaries(
        {
            "k": maybe_null(st.sampled_from(KEYS_STR)),
            "t": maybe_null(st.integers(-20, 120)),
            "v": maybe_null(st.integers(0, 9)),
        }
    )
    schema = pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.int64())])
    batch = st.lists(row, max_size=8).map(lambda rows: table(rows, schema))
    step = st.one_of(batch, batch, st.integers(-20, 150).map(Watermark)) if watermarks else batch
    return draw(st.lists(step, max_size=max_steps))


def windows_model(steps: list, size: int, lateness: int):
    """Expected outputs and dead letters of TumblingWindowAggregate(k, t, size,
    {n: count(), s: sum_(v)}, allowed_lateness=lateness): rows never move the
    watermark, ``Watermark`` steps do; a window closes (and takes no more
    rows) once its end plus the lateness is at or behind the watermark."""
    watermark = None
    open_: dict[tuple[str, int], dict[str, Any]] = {}
    outputs, letters = [], []
    op = "TumblingWindowAggregate"
    for step in steps:
        if isinstance(step, Watermark):
            watermark = step.value if watermark is None else max(watermark, step.value)
        else:
            rows = step.to_pylist()
            letters += [DeadLetter(r, "null_key", op) for r in rows if r["k"] is None]
            rows = [r for r in rows if r["k"] is not None]
            letters += [DeadLetter(r, "null_event_time", op) for r in rows if r["t"] is None]
            rows = [r for r in rows if r["t"] is not None]
            on_time = []
            for r in rows:
                start = (r["t"] // size) * size
                if watermark is not None and start + size + lateness <= watermark:
                    letters.append(DeadLetter(r, "late", op))
                else:
                    on_time.append((r, start))
            for r, start in on_time:
                w = open_.setdefault((r["k"], start), {"n": 0, "s": None})
                w["n"] += 1
                if r["v"] is not None:
                    w["s"] = r["v"] if w["s"] is None else w["s"] + r["v"]
        closed = sorted(
            (start, k) for (k, start) in open_ if watermark is not None and start + size + lateness <= watermark
        )
        outputs.append(
            [
                {"k": k, "window_start": start, "window_end": start + size, **open_.pop((k, start))}
                for start, k in closed
            ]
        )
    return outputs, letters


# -- latest-value join -----------------------------------------------------

LEFT_SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.int64())])
RIGHT_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


@st.composite
def join_steps(draw, max_steps: int = 7) -> list[dict[str, pa.Table]]:
    left_row = st.fixed_dictionaries({"id": maybe_null(st.integers(0, 4)), "x": st.integers(0, 99)})
    right_row = st.fixed_dictionaries({"id": maybe_null(st.integers(0, 4)), "name": st.sampled_from(["p", "q", "r"])})
    step = st.fixed_dictionaries(
        {},
        optional={
            "left": st.lists(left_row, max_size=6).map(lambda rows: table(rows, LEFT_SCHEMA)),
            "right": st.lists(right_row, max_size=4).map(lambda rows: table(rows, RIGHT_SCHEMA)),
        },
    )
    return draw(st.lists(step, max_size=max_steps))


def join_model(steps: list[dict[str, pa.Table]], unmatched: str):
    latest: dict[int, str] = {}
    right_known = False  # before the right input's first batch its columns are unknown
    pending: list[dict[str, Any]] = []
    outputs, letters = [], []
    op = "LatestValueJoin"
    for step in steps:
        out = []
        if "right" in step:
            right_known = True
            for r in step["right"].to_pylist():
                if r["id"] is None:
                    letters.append(DeadLetter(r, "null_key", op))
                else:
                    latest[r["id"]] = r["name"]
            still = []
            for r in pending:
                (out.append({**r, "name": latest[r["id"]]}) if r["id"] in latest else still.append(r))
            pending = still
        if "left" in step:
            rows = step["left"].to_pylist()  # null keys are rejected first, then the batch is joined
            letters += [DeadLetter(r, "null_key", op) for r in rows if r["id"] is None]
            for r in rows:
                if r["id"] is None:
                    continue
                if r["id"] in latest:
                    out.append({**r, "name": latest[r["id"]]})
                elif unmatched == "emit_nulls":
                    out.append({**r, "name": None} if right_known else dict(r))
                elif unmatched == "buffer":
                    pending.append(r)
                else:
                    letters.append(DeadLetter(r, "no_match", op))
        outputs.append(out)
    return outputs, letters

"""Finding the rows a stage's code raises on (``streaming.engine.task.record_errors``):
``isolate`` over a small stateful process of its own (a running total that
raises on some values, or once the total passes a bound), checked against
the same process run row by row without the rows that raise; and
``RecordErrors``, the job's policy and its brake."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.isolation import SearchBounded, isolate
from streaming.errors import SparkAbsError, isolatable


class Totals:
    """A running total over rows (ints): ``process`` adds each row and
    returns the totals after each; it raises (half-way: the rows before the
    bad one are already added) on a row in ``bad``, or on a row that takes
    the total past ``ceiling``.  ``tries`` counts the calls."""

    def __init__(self, rows: list[int], bad: set[int] = frozenset(), ceiling: int | None = None):
        self.rows, self.bad, self.ceiling = rows, bad, ceiling
        self.total = 0
        self.tries = 0

    def process(self, start: int, end: int) -> list[int]:
        self.tries += 1
        out = []
        for value in self.rows[start:end]:
            if value in self.bad:
                raise ValueError(f"cannot take {value}")
            if self.ceiling is not None and self.total + value > self.ceiling:
                raise OverflowError(f"{self.total} + {value} is past {self.ceiling}")
            self.total += value
            out.append(self.total)
        return out

    def savepoint(self):
        total = self.total

        def back() -> None:
            self.total = total

        return back


def run(totals: Totals):
    """``totals`` processed whole; when it raises, put back and isolated."""
    back = totals.savepoint()
    try:
        return [totals.process(0, len(totals.rows))], []
    except ValueError as exc:
        back()
        return isolate(len(totals.rows), totals.process, totals.savepoint, exc)


def without(rows: list[int], bad: set[int]) -> list[int]:
    """The totals of ``rows`` run one by one, each bad one left out."""
    total, out = 0, []
    for value in rows:
        if value not in bad:
            total += value
            out.append(total)
    return out


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.integers(0, 40), min_size=1, max_size=300), bad=st.sets(st.integers(0, 40), max_size=3))
def test_the_rows_set_aside_are_exactly_the_ones_that_raise_and_the_rest_is_as_if_they_were_not_there(rows, bad):
    totals = Totals(rows, bad)
    outputs, isolated = run(totals)
    assert [rows[one.index] for one in isolated] == [value for value in rows if value in bad]
    assert all(isinstance(one.error, ValueError) for one in isolated)
    assert [total for output in outputs for total in output] == without(rows, bad)
    assert totals.total == sum(value for value in rows if value not in bad)


def test_one_bad_row_in_a_thousand_takes_about_twice_log2_tries():
    rows = [1] * 1000
    rows[637] = 13
    totals = Totals(rows, {13})
    outputs, isolated = run(totals)
    assert [one.index for one in isolated] == [637]
    assert totals.tries <= 1 + 2 * 10 + 1  # the whole run, then the search: 2 log2(1000) at most
    assert sum(map(len, outputs)) == 999


def test_a_row_is_set_aside_by_the_state_the_rows_before_it_left_whatever_the_cut():
    # the total may not pass 10: the row that would take it past is the one set aside, in any cut
    rows = [3, 3, 3, 3, 1, 5, 1]  # 3+3+3 = 9, then 3 is over; 1 -> 10; 5 is over; 1 is over
    for cut in range(1, len(rows) + 1):
        totals, found = Totals(rows, ceiling=10), []
        for start in range(0, len(rows), cut):
            part = Totals(rows[start : start + cut], ceiling=10)
            part.total = totals.total
            back = part.savepoint()
            try:
                part.process(0, len(part.rows))
            except OverflowError as exc:
                back()
                _, isolated = isolate(len(part.rows), part.process, part.savepoint, exc)
                found += [start + one.index for one in isolated]
            totals.total = part.total
        assert found == [3, 5, 6], cut
        assert totals.total == 10


def test_a_run_that_raised_once_and_then_goes_through_sets_nothing_aside():
    totals = Totals([1, 2, 3])
    outputs, isolated = isolate(3, totals.process, totals.savepoint, RuntimeError("once"))
    assert isolated == [] and [t for output in outputs for t in output] == [1, 3, 6]


def test_an_error_no_record_causes_is_not_isolated():
    class Broken(Totals):
        def process(self, start, end):
            raise MemoryError("out of memory")

    totals = Broken([1, 2, 3])
    with pytest.raises(MemoryError):
        isolate(3, totals.process, totals.savepoint, ValueError("first"))

    class Engine(Totals):
        def process(self, start, end):
            raise SparkAbsError("the engine's own")

    with pytest.raises(SparkAbsError):
        isolate(3, Engine([1, 2, 3]).process, totals.savepoint, ValueError("first"), isolatable=isolatable)


def test_a_search_past_its_bounds_stops_saying_how_far_it_got():
    every = Totals([1, 2, 3, 4, 5, 6], bad={1, 2, 3, 4, 5, 6})
    with pytest.raises(
        SearchBounded, match=r"stopped at row 3, 3 set aside .* the first: row 0: ValueError: cannot take 1"
    ):
        isolate(6, every.process, every.savepoint, ValueError("first"), most=2)

    class Slow(Totals):
        def process(self, start, end):
            time.sleep(0.02)
            return super().process(start, end)

    slow = Slow([1, 2, 3, 4], bad={2})
    with pytest.raises(SearchBounded, match=r"bounds: None rows, 0.01 s"):
        isolate(4, slow.process, slow.savepoint, ValueError("first"), within_s=0.01)

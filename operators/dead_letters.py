"""Dead letters: the side output where operators put rows they will not
process, each with its reason (null key, late for a closed window, ...).

Rows are never dropped silently.  A dead letter is output, like the table
``process()`` returns, not state: it is not part of any snapshot.  The stage
task drains the collector after every ``process()`` call and sends what it
drained on (to the job's dead-letter topic, a log, a test's assertion).

Rows may carry the input record they came from in the column ``_abs_origin``
(``ORIGIN``: a struct of the ingress ``topic``, ``partition`` and
``offset``), which the stage task adds to the rows it reads.  A dead letter
taken from an operator's input keeps it, so the task can send the original
record with it.  The operators keep the column wherever an output row is one
input row (filters, projections, de-duplication, the probe side of a join)
and drop it where a row is made from many (aggregates, windows);
``KeyedProcess`` hands its function rows without it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa

__all__ = [
    "Reason",
    "DeadLetter",
    "DeadLetterBatch",
    "DeadLetters",
    "ORIGIN",
    "ORIGIN_TYPE",
    "without_origin",
    "origin_as_now",
]

# the column naming the input record a row came from, and its type
ORIGIN = "_abs_origin"
# (the topic dictionary-encoded: rows of a few channels take 4 bytes for it, not the name)
ORIGIN_TYPE = pa.struct(
    [("topic", pa.dictionary(pa.int32(), pa.string())), ("partition", pa.int32()), ("offset", pa.int64())]
)


def without_origin(table: pa.Table) -> pa.Table:
    """``table`` without the ``ORIGIN`` column (itself when it has none)."""
    return table.drop_columns([ORIGIN]) if ORIGIN in table.column_names else table


def origin_as_now(table: pa.Table) -> pa.Table:
    """Restored rows (``table``) with their origin as ``ORIGIN_TYPE`` says
    now: cast when it can be, left out when not (a snapshot of another
    release), so rows read since fit them."""
    position = table.schema.get_field_index(ORIGIN)
    if position < 0 or table.schema.field(position).type == ORIGIN_TYPE:
        return table
    try:
        return table.set_column(position, ORIGIN, table[ORIGIN].cast(ORIGIN_TYPE))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return table.drop_columns([ORIGIN])


class Reason(StrEnum):
    """Why a row went to the dead letters (compares equal to its string)."""

    NULL_KEY = "null_key"
    """The key column is null: a keyed operator cannot place the row."""
    NULL_EVENT_TIME = "null_event_time"
    """The event-time column is null: a window operator cannot place the row."""
    NULL_VALUE = "null_value"
    """A value the operator needs (e.g. a balance delta) is null."""
    LATE = "late"
    """The row's window had already closed (the watermark had passed its end)."""
    NO_MATCH = "no_match"
    """A join found no right-side value and its policy says not to wait."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One rejected row: its values by column name, the reason, and the
    operator (class name) that rejected it."""

    row: dict[str, Any]
    reason: str
    operator: str


@dataclass(frozen=True, slots=True)
class DeadLetterBatch:
    """Rows rejected together for one reason, kept as Arrow."""

    rows: pa.Table
    reason: str
    operator: str

    def letters(self) -> list[DeadLetter]:
        return [DeadLetter(row, self.reason, self.operator) for row in self.rows.to_pylist()]


class DeadLetters:
    """Collects rejected rows in the order operators reject them.

    Operators that can reject rows take ``dead_letters=`` (a collector to
    share) or make their own, exposed as ``operator.dead_letters``.  A
    ``Chain`` moves its operators' letters into its own collector after
    each step, so draining the chain gets them all."""

    __slots__ = ("_batches",)

    def __init__(self) -> None:
        self._batches: list[DeadLetterBatch] = []

    def add(self, rows: pa.Table, reason: str, operator: str) -> None:
        """Record ``rows`` as rejected for ``reason``; an empty table is ignored."""
        if rows.num_rows:
            self._batches.append(DeadLetterBatch(rows, str(reason), operator))

    def absorb(self, other: DeadLetters) -> None:
        """Move every letter of ``other`` to the end of this collector."""
        if other is not self:
            self._batches.extend(other.drain_batches())

    def drain_batches(self) -> list[DeadLetterBatch]:
        """Take every collected batch out, oldest first."""
        batches, self._batches = self._batches, []
        return batches

    def drain(self) -> list[DeadLetter]:
        """Take every collected row out, oldest first."""
        return [letter for batch in self.drain_batches() for letter in batch.letters()]

    def __len__(self) -> int:
        return sum(batch.rows.num_rows for batch in self._batches)

    def __iter__(self) -> Iterator[DeadLetter]:
        """The collected rows, without draining them."""
        for batch in self._batches:
            yield from batch.letters()

    def __repr__(self) -> str:
        return f"DeadLetters({len(self)} rows)"

"""Finding the rows an operator raises on: when ``process()`` raised on a
run of rows, the operator is put back (``operators.base.savepoint_of``) and
the run processed again in parts, to find the rows it raises on, each
alone, from the state the rows before it left (``isolate``); the rest is
processed exactly as if those rows had not been there.

The search gallops from the start of the run: it tries the first half of
what is known to raise; what went through is kept (its output, its state)
and the search goes on from there, what raised is put back and halved
again, down to one row.  A row is set aside only when it raises on its
own, so the decision depends on the row and the rows before it, never on
how the rows were cut into batches (for an operator whose errors are a
row's, given the state before it: not, say, an error on a batch's sum): a
replay of the same rows after a restore sets aside the same ones.  About
``2 log2(n)`` tries find one row in a run of ``n``.  A run that raised once
and then goes through in parts sets nothing aside."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["isolate", "Isolated", "SearchBounded", "said"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class SearchBounded(Exception):
    """A search for the rows the code raises on passed its bound
    (``isolate``'s ``most`` or ``within_s``): the message says how far it
    got and the errors it met."""


@dataclass(frozen=True, slots=True)
class Isolated:
    """Row ``index`` of a run raised ``error`` on its own."""

    index: int
    error: Exception


def _any_but_memory(error: BaseException) -> bool:
    return isinstance(error, Exception) and not isinstance(error, MemoryError)


def isolate(
    rows: int,
    attempt: Callable[[int, int], T],
    savepoint: Callable[[], Callable[[], None]],
    failed: Exception,
    *,
    isolatable: Callable[[BaseException], bool] = _any_but_memory,
    most: int | None = None,
    within_s: float | None = None,
) -> tuple[list[T], list[Isolated]]:
    """A run of ``rows`` rows whose processing raised ``failed`` (the state
    already put back), processed again without the rows that raise on
    their own: ``attempt(start, end)`` processes rows ``[start, end)`` and
    returns its output, ``savepoint()`` gives a function that puts the state
    back to where it is now.  Returns the outputs of the tries that went
    through, in row order, and the rows set aside.  An error ``isolatable``
    says no record causes (by default ``MemoryError``) is raised as it is.
    The search is bounded: past ``most`` rows set aside, or ``within_s``
    seconds, it stops with ``SearchBounded`` (code that raises on every row
    is not a few bad rows: a run of Spark code costs a job per try)."""
    started = time.monotonic()
    outputs: list[T] = []
    isolated: list[Isolated] = []
    start = 0
    raising: int | None = rows  # [start, raising) raised (from here or from a state before here)
    last = failed
    while start < rows:
        if most is not None and len(isolated) > most or within_s is not None and time.monotonic() - started > within_s:
            found = ", ".join(f"row {one.index}: {said(one.error)}" for one in isolated[:3])
            raise SearchBounded(
                f"searching a run of {rows} rows for those the code raises on stopped at row {start}, "
                f"{len(isolated)} set aside in {time.monotonic() - started:.0f} s (bounds: {most} rows, "
                f"{within_s} s); the first: {found or 'none'}; the last error: {said(last)}"
            )
        if raising is None:
            end = rows  # nothing known of the rest: try it whole
        elif raising - start <= 1:
            end = start + 1
        else:
            end = start + (raising - start) // 2
        back = savepoint()
        try:
            output = attempt(start, end)
        except Exception as exc:
            if not isolatable(exc):
                raise
            back()
            last = exc
            if end - start == 1:
                isolated.append(Isolated(start, exc))
                start, raising = end, None
            else:
                raising = end
            continue
        outputs.append(output)
        start = end
        if raising is not None and start >= raising:
            raising = None  # the row that raised with others does not on its own: the rest is tried whole
    if not isolated:
        log.info("a run of %d rows raised %s once, then went through in parts: no row set aside", rows, said(last))
    return outputs, isolated


def said(error: BaseException) -> str:
    """``error`` as a dead letter or a log line says it: its type and message."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

"""Records that make a stage's code raise: when an operator (or a user's
function in it) raises on a run of rows, the task puts the operator back
as it was before the run (``operators.base.savepoint_of``) and finds the
rows it raises on, each alone, from the state the rows before it left
(``operators.isolation.isolate``); each such row goes to the dead letters
with the exception and the stage, and the rest is processed exactly as if
it had not been there.  A stage's Spark code is searched the same way, by
Spark (``streaming.adapters.spark.stage``).

What a job does with such a row is its ``record_errors`` setting
(``RecordErrors``): isolate it (the default), or fail the job naming it.
Past ``max_isolated_records`` in one checkpoint interval, or past
``max_isolated_share`` of the records of the interval, the job stops: a bug
that breaks every record must not route the stream into the dead letters.

Some errors are not a record's: ``MemoryError`` and the engine's own errors
(``streaming.errors.isolatable``) fail the task as they would anyway."""

from __future__ import annotations

from dataclasses import dataclass

from barriers.messages import ChannelId
from operators.isolation import said
from streaming.api.settings import RECORD_ERRORS
from streaming.errors import RecordErrorsStop

__all__ = ["RecordErrors", "ISOLATE", "FAIL", "POLICIES"]

# what a record error does (JobSettings.record_errors): the row to the dead letters, or the job stops
POLICIES = RECORD_ERRORS
ISOLATE, FAIL = RECORD_ERRORS

# the isolated records an error of the brake names
_NAMED = 5
# the isolated records below which the share does not stop a job (one bad record of three is no trend)
_SHARE_FLOOR = 10


@dataclass(slots=True)
class _Named:
    channel: ChannelId
    offset: int
    error: str


class RecordErrors:
    """What task ``task`` does with rows its stage's code raises on (see the
    module docstring): ``policy`` (``ISOLATE`` or ``FAIL``), and the brake,
    ``max_records`` isolated rows per checkpoint interval, or
    ``max_share`` of the records processed in it (once ``_SHARE_FLOOR``
    rows were).  ``interval_ended`` starts a new interval (the task's
    snapshot); ``rolled_back``, set by whoever put the operator's state
    back, says it was since the last snapshot (so the next one stores it
    whole)."""

    def __init__(self, task: str, policy: str = ISOLATE, max_records: int = 1000, max_share: float = 0.5):
        if policy not in POLICIES:
            raise ValueError(f"record_errors {policy!r}: use {' or '.join(map(repr, POLICIES))}")
        self.task = task
        self.policy = policy
        self.max_records = max_records
        self.max_share = max_share
        self.isolated = 0  # in this interval
        self.records = 0  # processed in this interval
        self.rolled_back = False
        self._first: list[_Named] = []

    def processed(self, records: int) -> None:
        """``records`` records were processed (the share's denominator)."""
        self.records += records

    def met(self, channel: ChannelId, offsets: list[int], error: Exception | str, stage: str) -> None:
        """The run of records at ``offsets`` of ``channel`` raised ``error``
        in stage ``stage``: with the policy ``FAIL`` the job stops here."""
        if self.policy == FAIL:
            where = f"{channel} offsets {offsets[0]}..{offsets[-1]}" if offsets else str(channel)
            raise RecordErrorsStop(
                f"task {self.task}: stage {stage} raised {_text(error)} on the records at {where}, and "
                f"record_errors is {FAIL!r}: the job stops. Fix the stage's code or the records, or set "
                f"record_errors to {ISOLATE!r} to send the records it raises on to the dead letters"
            )

    def isolate(self, channel: ChannelId, offset: int, error: Exception | str) -> None:
        """One record (at ``offset`` of ``channel``, -1 when the row names
        none) was set aside for ``error``; past the brake the job stops."""
        self.isolated += 1
        if len(self._first) < _NAMED:
            self._first.append(_Named(channel, offset, _text(error)))
        over_count = self.isolated > self.max_records
        over_share = self.isolated >= _SHARE_FLOOR and self.isolated > self.max_share * max(self.records, 1)
        if over_count or over_share:
            bound = (
                f"more than max_isolated_records ({self.max_records})"
                if over_count
                else f"{self.isolated} of {self.records} records, more than max_isolated_share ({self.max_share:g})"
            )
            named = "; ".join(
                f"{n.channel} offset {n.offset}: {n.error}" if n.offset >= 0 else f"{n.channel}: {n.error}"
                for n in self._first
            )
            raise RecordErrorsStop(
                f"task {self.task}: the stage's code raised on {bound} in one checkpoint interval: "
                f"the job stops rather than send the stream to the dead letters. The first: {named}. "
                "A bug that fails every record is fixed in the code; records that truly are bad are "
                "skipped with a higher max_isolated_records (or max_isolated_share)"
            )

    def interval_ended(self) -> bool:
        """A checkpoint interval ended (the task's snapshot): counts start
        again.  Returns whether the state was put back during it."""
        rolled_back = self.rolled_back
        self.isolated = self.records = 0
        self.rolled_back = False
        self._first.clear()
        return rolled_back


def _text(error: Exception | str) -> str:
    return error if isinstance(error, str) else said(error)

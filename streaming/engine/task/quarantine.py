"""Records a task cannot take, sent to the job's dead-letter topic with
their reason and counted: malformed or undecodable input, input an operator
refuses, rows an operator gave up on (late, unmatched), and control records
that fail their checks (forged or foreign barriers).  Prometheus counts them
by a reason of few values (``REASONS``); the message keeps the whole reason."""

from __future__ import annotations

import collections
import json
import logging
from typing import Any

import pyarrow as pa

from barriers.messages import BarrierRejected, ChannelId
from operators.dead_letters import DeadLetters as OperatorDeadLetters
from streaming.engine.metrics import TaskMetrics

__all__ = ["Quarantine", "REASONS"]

# what the dead letters are counted by: input that does not decode, input or rows the operator
# refuses, rows an operator gave up on (late, unmatched), control records that fail their checks
REASONS = ("malformed", "refused", "given_up", "rejected_control")

log = logging.getLogger(__name__)


def _headers(row: pa.Table) -> list[tuple[str, bytes]]:
    return [(h["key"], h["value"]) for h in (row["headers"][0].as_py() or [])]


class Quarantine:
    """The dead letters of task ``task``, sent with ``io.dead_letter(channel,
    offset, key, value, headers, reason)`` (a ``TaskIO``'s), counted in ``metrics``."""

    def __init__(self, task: str, io: Any, counters: collections.Counter, metrics: TaskMetrics):
        self.task = task
        self.io = io
        self.counters = counters
        self.metrics = metrics

    def record(self, channel: ChannelId, row: pa.Table, reason: str, *, counted_as: str = "malformed") -> None:
        """One input record (a one-row batch table), with ``reason``
        (``counted_as``: one of ``REASONS``)."""
        self.counters["dead_letters"] += 1
        self.metrics.dead_letter(counted_as)
        self.io.dead_letter(
            channel,
            int(row["offset"][0].as_py()),
            row["key"][0].as_py(),
            row["value"][0].as_py(),
            _headers(row),
            reason,
        )

    def row(self, channel: ChannelId, value: bytes, reason: str, *, counted_as: str = "given_up") -> None:
        """A row made from input records (``value``: the row as JSON), with
        ``reason`` (``counted_as``: one of ``REASONS``)."""
        self.counters["dead_letters"] += 1
        self.metrics.dead_letter(counted_as)
        self.io.dead_letter(channel, -1, None, value, [], reason)

    def control_record(self, channel: ChannelId, row: pa.Table, rejected: BarrierRejected) -> None:
        """A control record whose barrier failed its checks."""
        offset = int(row["offset"][0].as_py())
        self.counters["rejected_control_records"] += 1
        self.metrics.dead_letter("rejected_control")
        log.warning("%s: control record at %s offset %d rejected: %s", self.task, channel, offset, rejected)
        self.io.dead_letter(
            channel,
            offset,
            row["key"][0].as_py(),
            row["value"][0].as_py(),
            _headers(row),
            f"rejected control record: {rejected.reason}",
        )

    def from_operator(self, channel: ChannelId, operator: Any) -> None:
        """The rows ``operator`` gave up on since the last call (its ``dead_letters``)."""
        letters = getattr(operator, "dead_letters", None)
        if not isinstance(letters, OperatorDeadLetters) or not len(letters):
            return
        for letter in letters.drain():
            value = json.dumps(letter.row, default=str, separators=(",", ":")).encode()
            self.row(channel, value, f"{letter.operator}: {letter.reason}")

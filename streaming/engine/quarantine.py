"""Records a task cannot take, sent to the job's dead-letter topic with
their reason and counted: malformed or undecodable input, input an operator
refuses, rows an operator gave up on (late, unmatched), and control records
that fail their checks (forged or foreign barriers)."""

from __future__ import annotations

import collections
import json
import logging
from typing import Any

import pyarrow as pa

from barriers.messages import BarrierRejected, ChannelId
from operators.dead_letters import DeadLetters as OperatorDeadLetters

__all__ = ["Quarantine"]

log = logging.getLogger(__name__)


def _headers(row: pa.Table) -> list[tuple[str, bytes]]:
    return [(h["key"], h["value"]) for h in (row["headers"][0].as_py() or [])]


class Quarantine:
    """The dead letters of task ``task``, sent with ``io.dead_letter(channel,
    offset, key, value, headers, reason)`` (a ``TaskIO``'s)."""

    def __init__(self, task: str, io: Any, counters: collections.Counter):
        self.task = task
        self.io = io
        self.counters = counters

    def record(self, channel: ChannelId, row: pa.Table, reason: str) -> None:
        """One input record (a one-row batch table), with ``reason``."""
        self.counters["dead_letters"] += 1
        self.io.dead_letter(
            channel,
            int(row["offset"][0].as_py()),
            row["key"][0].as_py(),
            row["value"][0].as_py(),
            _headers(row),
            reason,
        )

    def row(self, channel: ChannelId, value: bytes, reason: str) -> None:
        """A row made from input records (``value``: the row as JSON), with ``reason``."""
        self.counters["dead_letters"] += 1
        self.io.dead_letter(channel, -1, None, value, [], reason)

    def control_record(self, channel: ChannelId, row: pa.Table, rejected: BarrierRejected) -> None:
        """A control record whose barrier failed its checks."""
        offset = int(row["offset"][0].as_py())
        self.counters["rejected_control_records"] += 1
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

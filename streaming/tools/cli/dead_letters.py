"""``spark-abs dead-letters``: a job's dead letters, each once, with their reasons."""

from __future__ import annotations

import argparse
import collections
import json
import os
from collections.abc import Sequence
from typing import Any

from barriers.headers import (
    DEAD_LETTER_AFTER_CHECKPOINT,
    DEAD_LETTER_GENERATION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
    DEAD_LETTER_SOURCE_OFFSET,
)
from streaming.adapters.kafka.admin import job_key
from streaming.tools.cli.options import runtime_settings

__all__ = ["register", "run", "letter_rows", "render"]

_COLUMNS = ("offset", "source", "source offset", "generation", "after checkpoint", "reason")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "dead-letters",
        help="a job's dead letters, each once: where each record came from and why",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Reads the job's dead-letter topic (spark-abs.<job>.dead-letters) to its end
and prints its letters: the record's source channel and offset, the
generation that sent it, the checkpoint its task had snapshotted, and the
reason.  A restore reads again every record after the checkpoint it goes
back to, and sends again the letters of those records: the first ones are
superseded (left out here; --superseded shows them) by the restore's mark,
signed with the job's key.  The counts by reason come last.

The connection is the deployment's (SPARK_ABS_*) or the local runtime's.""",
    )
    parser.add_argument("--job", required=True, help="job name")
    parser.add_argument("--last", type=int, default=50, metavar="N", help="letters shown, the newest (default 50)")
    parser.add_argument("--superseded", action="store_true", help="also show the superseded letters, marked")
    parser.add_argument("--json", action="store_true", help="every letter as one JSON object per line")
    parser.set_defaults(func=run)


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", "replace")


def letter_rows(records: Sequence[Any], superseded: bool = False) -> list[dict[str, Any]]:
    """Each dead letter of ``records`` (kafka-python records) as plain values."""
    rows = []
    for record in records:
        headers = {name: _text(value) for name, value in record.headers or []}
        rows.append(
            {
                "offset": record.offset,
                "source": headers.get(DEAD_LETTER_SOURCE),
                "source offset": headers.get(DEAD_LETTER_SOURCE_OFFSET),
                "generation": headers.get(DEAD_LETTER_GENERATION),
                "after checkpoint": headers.get(DEAD_LETTER_AFTER_CHECKPOINT),
                "reason": headers.get(DEAD_LETTER_REASON),
                "superseded": superseded,
                "key": _text(record.key) if record.key is not None else None,
                "value": _text(record.value)[:2000],
            }
        )
    return rows


def _rows(found: Any, superseded: bool) -> list[dict[str, Any]]:
    """The letters of ``found`` (a ``DeadLetterLog``), with its superseded ones when asked, in topic order."""
    rows = letter_rows(found.letters) + (letter_rows(found.superseded, True) if superseded else [])
    return sorted(rows, key=lambda row: row["offset"])


def render(job: str, found: Any, last: int, superseded: bool) -> str:
    """What ``spark-abs dead-letters`` prints of ``found`` (a ``DeadLetterLog``)."""
    from streaming.tools.views import as_text, titled_table

    rows = _rows(found, superseded)
    shown = rows[-last:] if last > 0 else []
    lines = [
        f"job {job}: {len(found.letters)} dead letters"
        + (f", {len(found.superseded)} more superseded by a restore" if found.superseded else "")
        + (f" ({'; '.join(str(r) for r in found.restores)})" if found.restores else "")
    ]
    parts: list[object] = []
    if shown:
        title = f"the last {len(shown)}" if len(shown) < len(rows) else None
        table_rows = [
            [*(row[c] for c in _COLUMNS[:-1]), ("(superseded) " if row["superseded"] else "") + (row["reason"] or "")]
            for row in shown
        ]
        parts.append(titled_table(title, _COLUMNS, table_rows, right=("offset", "source offset")))
    counted = [row for row in rows if not row["superseded"]] if superseded else rows
    reasons = collections.Counter((row["reason"] or "").split(":")[0][:80] for row in counted)
    if reasons:
        parts.append(titled_table("by reason", ("letters", "reason"), [(n, r) for r, n in reasons.most_common()]))
    for ignored in found.ignored:
        lines.append(f"ignored: {ignored}")
    return "\n".join(lines) + ("\n\n" + as_text(*parts) if parts else "")


def run(args: argparse.Namespace) -> int:
    from streaming.adapters.kafka.dead_letters import read_dead_letters
    from streaming.api.config import Connection

    connection = Connection.from_env(os.environ) or Connection.load(runtime_settings(args))
    found = read_dead_letters(connection.kafka, args.job, job_key(connection, args.job))
    if args.json:
        for row in _rows(found, args.superseded):
            print(json.dumps(row))
        return 0
    print(render(args.job, found, args.last, args.superseded))
    return 0

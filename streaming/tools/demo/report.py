"""What ``spark-abs demo`` reports: the money of every checkpoint, the
restores, the committed output against the expected, drawn as a table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from barriers.coordinator import CheckpointStatus
from streaming.api.settings import Mode
from streaming.tools.views import as_text, titled_table

__all__ = ["DemoReport"]


@dataclass
class DemoReport:
    mode: Mode
    job: str
    transfers: int
    money: list[Any]
    restores: list
    output_rows: int
    expected_rows: int
    output_matches: bool
    dead_letters: int
    checkpoints: list

    lost: int = 0

    @property
    def passed(self) -> bool:
        if self.mode is Mode.AT_LEAST_ONCE:  # replay may duplicate; nothing may be lost
            return self.lost == 0
        return self.output_matches and bool(self.money) and all(m.total == 0 for m in self.money)

    def render(self) -> str:
        money = {m.checkpoint_id: m for m in self.money}
        rows: list[tuple[Any, ...]] = []
        for record in self.checkpoints:
            m = money.get(record.checkpoint_id)
            seconds = f"{record.duration_s:.2f}" if record.duration_s is not None else None
            if m is None:
                status, reason = str(record.status), record.reason or None
                if record.status is CheckpointStatus.PENDING:  # triggered, then the job was stopped: never finished
                    status, reason = "stopped", "the job stopped before it completed"
                rows.append((record.checkpoint_id, status, seconds, None, None, None, reason))
            else:
                conserved = "yes" if m.total == 0 else f"NO: {m.total}"
                rows.append(
                    (record.checkpoint_id, str(record.status), seconds, m.balances, m.in_flight, m.accounts, conserved)
                )
        table = titled_table(
            f"job {self.job}: {self.transfers} transfers",
            ("checkpoint", "status", "seconds", "balances", "in flight", "accounts", "money conserved"),
            rows,
            right=("checkpoint", "seconds", "balances", "in flight", "accounts"),
        )
        lines = [as_text(table)]
        lines.append("")
        for restore in self.restores:
            origin = f"checkpoint {restore.checkpoint_id}" if restore.checkpoint_id else "the beginning"
            lines.append(f"restore: generation {restore.generation} from {origin} ({restore.reason})")
        lines.append(
            f"output: {self.output_rows} window rows committed, {self.expected_rows} expected from a "
            f"run without failures: {'identical' if self.output_matches else 'DIFFERENT'}"
        )
        if self.mode is Mode.AT_LEAST_ONCE:
            lines.append(f"at-least-once: replay may duplicate legs; windows missing legs: {self.lost}")
        lines.append(f"dead letters: {self.dead_letters}")
        return "\n".join(lines)

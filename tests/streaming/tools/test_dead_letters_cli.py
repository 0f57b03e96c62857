"""``spark-abs dead-letters``: each record's letter once, the superseded ones only when asked."""

from __future__ import annotations

import re
from dataclasses import dataclass

from streaming.adapters.kafka.dead_letters import DeadLetterLog, Restored
from streaming.tools.cli.dead_letters import letter_rows, render


@dataclass
class _Record:
    offset: int
    headers: list[tuple[str, bytes]]
    key: bytes | None = None
    value: bytes | None = b"{oops"


def _letter(offset: int, source_offset: int, reason: str, generation: int, after: int) -> _Record:
    headers = {
        "spark-abs-reason": reason,
        "spark-abs-source": "carts.cart-events:1",
        "spark-abs-source-offset": str(source_offset),
        "spark-abs-generation": str(generation),
        "spark-abs-after-checkpoint": str(after),
    }
    return _Record(offset, [(name, value.encode()) for name, value in headers.items()])


def test_the_letters_are_listed_once_with_their_reasons_and_counted_by_reason():
    first = _letter(0, 20418, "stage abandoned-carts raised TypeError: unsupported operand", 0, 4)
    again = _letter(3, 20418, "stage abandoned-carts raised TypeError: unsupported operand", 1, 3)
    other = _letter(4, 20500, "value is not JSON: Expecting value", 1, 3)
    found = DeadLetterLog(letters=[again, other], superseded=[first], restores=[Restored(1, 3)])
    text = render("carts", found, 50, superseded=False)
    assert text.splitlines()[0] == (
        "job carts: 2 dead letters, 1 more superseded by a restore (generation 1 restored from checkpoint 3)"
    )
    assert "(superseded)" not in text and text.count("20418") == 1
    by_reason = text.split("by reason")[1]
    assert re.search(r"1 +stage abandoned-carts raised TypeError\n", by_reason)
    assert re.search(r"1 +value is not JSON$", by_reason)
    shown = render("carts", found, 50, superseded=True)
    assert "(superseded) stage abandoned-carts" in shown and shown.count("20418") == 2
    # the newest only, when asked for fewer
    assert "20500" in render("carts", found, 1, False) and "20418" not in render("carts", found, 1, False)
    row = letter_rows([other])[0]
    assert (row["source"], row["source offset"], row["generation"], row["value"]) == (
        "carts.cart-events:1",
        "20500",
        "1",
        "{oops",
    )

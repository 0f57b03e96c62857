"""Which records of older generations are still valid after restores
(docs/architecture/restore.md, "Restore", step 4).

Every restore starts generation g from a checkpoint whose barrier on channel
c is at ``position(c) - 1``.  Records that an older generation wrote on c at
or after ``position(c)`` came from a run that failed after that cut: they are
stale, and the new generation writes them again.  Records before it are
valid whatever their generation (in unaligned mode they are channel state).

A record of generation h is stale when *any* restore after h, up to the
current generation along the restored lineage, put its position at or before
the record: a slice that was stale for generation 2 stays stale when
generation 4 restores a checkpoint taken in generation 2, even if generation
4's own positions lie after it.  So each snapshot carries its lineage, the
restores its generation descends from, and a restore appends its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from barriers.messages import ChannelId

__all__ = ["Lineage"]


@dataclass(frozen=True, slots=True)
class Lineage:
    """The restores a generation descends from: ``(generation, positions)``,
    oldest first; a restore from the beginning has no positions (everything
    older is stale)."""

    restores: tuple[tuple[int, Mapping[ChannelId, int]], ...] = ()

    def after_restore(self, generation: int, positions: Mapping[ChannelId, int] | None) -> Lineage:
        """The lineage of ``generation``, restored at ``positions`` (None: from the beginning)."""
        if self.restores and generation <= self.restores[-1][0]:
            raise ValueError(f"generation {generation} does not come after {self.restores[-1][0]}")
        return Lineage(self.restores + ((generation, dict(positions or {})),))

    def is_stale(self, channel: ChannelId, generation: int, offset: int) -> bool:
        """Whether a record written by ``generation`` at ``offset`` of ``channel`` is stale."""
        return any(
            restored > generation and offset >= positions.get(channel, 0) for restored, positions in self.restores
        )

    def to_json(self) -> list[Any]:
        return [[generation, {str(c): o for c, o in positions.items()}] for generation, positions in self.restores]

    @classmethod
    def from_json(cls, data: Any) -> Lineage:
        if not data:
            return cls()
        try:
            return cls(
                tuple((int(g), {ChannelId.parse(c): int(o) for c, o in positions.items()}) for g, positions in data)
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"lineage {data!r} is not [[generation, {{channel: offset}}], ...]: {exc}") from exc

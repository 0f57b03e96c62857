"""What the job's control topic says of checkpoints the store does not show:
for ``spark-abs ui``, the checkpoints of the current generation triggered
and not yet complete (which tasks acknowledged them so far), the ones
given up, with why (the coordinator's abort, a task's decline), and how
many have failed in a row against how many the job tolerates (as the
coordinator's aborts say it).

``ControlWatch`` reads the tail of the topic once (its last ``tail``
events), then, at each look, what came since: a page that refreshes every
few seconds costs one short poll.  It never writes: a job whose control
topic does not exist is reported, not created."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kafka.errors import KafkaError

from streaming.adapters.kafka.admin import admin_client, end_offsets
from streaming.adapters.kafka.control.events import (
    Abort,
    Ack,
    Complete,
    ControlEvent,
    Decline,
    Progress,
    Ready,
    Trigger,
)
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.topics import control_topic
from streaming.errors import SparkAbsError
from streaming.tools.tables import Table
from streaming.waits import Deadline

__all__ = ["ControlWatch", "ControlView", "LiveCheckpoint", "live_table"]

# the checkpoints a watch remembers (the newest), and the polls of one look at most
KEPT = 200
POLLS = 50


@dataclass
class LiveCheckpoint:
    """One checkpoint as the control topic tells it: ``status`` is
    ``in progress``, ``complete`` or ``aborted`` (``why``)."""

    checkpoint_id: int
    generation: int
    status: str = "in progress"
    acked: set[str] = field(default_factory=set)
    why: str | None = None


@dataclass(frozen=True)
class ControlView:
    """A look at the control topic: the current generation's checkpoints in
    progress, the newest given up, how many tasks the generation runs (when
    the tail read shows it), the checkpoints failed in a row in it and the
    job's ``tolerable_failed_checkpoints`` (None: no abort said them), or
    the ``problem`` that kept it from being read."""

    topic: str
    generation: int | None = None
    in_progress: tuple[LiveCheckpoint, ...] = ()
    aborted: tuple[LiveCheckpoint, ...] = ()
    tasks: int | None = None
    problem: str | None = None
    failed_in_a_row: int | None = None
    tolerable_failed_checkpoints: int | None = None
    # records of the tail read that the job's key does not vouch for, by reason (none shown)
    rejected: Mapping[str, int] = field(default_factory=dict)
    # records the stages' code raised on, set aside, in the generation (its tasks' latest progress)
    set_aside: int = 0


class ControlWatch:
    """The control topic of ``job`` on ``kafka``, followed from its last
    ``tail`` events on (those that verify with the job's ``key``: what
    anyone else wrote there is not shown; or what gives it when the topic is
    first read, since the key asks Kafka for its cluster's id: with Kafka
    down the page shows the store and says why there is no live view);
    ``look`` may be called from any thread."""

    def __init__(
        self,
        kafka: KafkaAccess,
        job: str,
        key: JobKey | Callable[[], JobKey],
        *,
        tail: int = 5000,
        timeout_s: float = 3.0,
    ):
        self.kafka = kafka
        self.job = job
        self.key = key
        self.topic_name = control_topic(job)
        self.tail = tail
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._topic: ControlTopic | None = None
        self._catch_up_to: int | None = None
        self._checkpoints: dict[int, LiveCheckpoint] = {}
        self._tasks: dict[int, set[str]] = {}
        self._generation: int | None = None
        # per generation, the checkpoints failed in a row as its latest abort or complete said (None: not said)
        self._failed: dict[int, int | None] = {}
        self._tolerable: int | None = None
        # per generation, each task's records set aside, as its latest progress said
        self._set_aside: dict[int, dict[str, int]] = {}

    def look(self) -> ControlView:
        """What the topic said up to now (the events since the last look read first)."""
        with self._lock:
            try:
                if self._topic is None:
                    opened = self._open()
                    if opened is None:
                        return ControlView(self.topic_name, problem=f"Kafka has no topic {self.topic_name}")
                    self._topic, self._catch_up_to = opened
                self._read(self._topic)
            except (SparkAbsError, KafkaError, OSError) as exc:
                self._drop_topic()
                return ControlView(self.topic_name, problem=f"control topic {self.topic_name} unreadable: {exc}")
            return self._view()

    def close(self) -> None:
        with self._lock:
            self._drop_topic()

    def _open(self) -> tuple[ControlTopic, int] | None:
        """The topic, positioned ``tail`` events before its end, and that end
        (the first look reads up to it); None when it does not exist."""
        admin = admin_client(self.kafka, self.timeout_s)
        try:
            if self.topic_name not in admin.list_topics():
                return None
        finally:
            admin.close()
        end = end_offsets(self.kafka, self.topic_name, 1)[0]
        if not isinstance(self.key, JobKey):
            self.key = self.key()
        return ControlTopic(self.kafka, self.job, self.key, start_at=max(0, end - self.tail)), end

    def _read(self, topic: ControlTopic) -> None:
        """The events at hand; on the first look, every event up to the end
        the topic had when opened (for at most ``timeout_s``: a consumer's
        first fetch takes a while)."""
        deadline = Deadline(self.timeout_s)
        for _ in range(POLLS):
            catching_up = self._catch_up_to is not None and not deadline.passed()
            events = topic.poll(0.2 if catching_up else 0.05)
            for event in events:
                self._fold(event)
                if self._catch_up_to is not None and event.offset >= self._catch_up_to - 1:
                    self._catch_up_to = None
            if not events and not catching_up:
                break
        self._catch_up_to = None

    def _drop_topic(self) -> None:
        if self._topic is not None:
            try:
                self._topic.close()
            finally:
                self._topic = None

    def _fold(self, event: ControlEvent) -> None:
        generation = getattr(event, "generation", None)
        if generation is not None and (self._generation is None or generation > self._generation):
            self._generation = generation
        if isinstance(event, Ready):
            self._tasks.setdefault(event.generation, set()).add(event.task)
            return
        if isinstance(event, Progress):
            self._set_aside.setdefault(event.generation, {})[event.task] = event.set_aside
            return
        if not isinstance(event, Trigger | Ack | Decline | Complete | Abort):
            return
        entry = self._checkpoints.get(event.checkpoint_id)
        if entry is None:
            entry = self._checkpoints[event.checkpoint_id] = LiveCheckpoint(event.checkpoint_id, event.generation)
            for old in sorted(self._checkpoints)[:-KEPT]:
                del self._checkpoints[old]
        if isinstance(event, Ack):
            entry.acked.add(event.task)
        elif isinstance(event, Decline):
            entry.why = f"{event.task} declined: {event.reason.value}" + (f" ({event.detail})" if event.detail else "")
        elif isinstance(event, Complete):
            entry.status = "complete"
            self._failed[event.generation] = 0
        elif isinstance(event, Abort):
            entry.status = "aborted"
            self._failed[event.generation] = event.failed_in_a_row
            if event.tolerable_failed_checkpoints is not None:
                self._tolerable = event.tolerable_failed_checkpoints
            detail = f" ({event.detail})" if event.detail and event.detail != event.reason.value else ""
            entry.why = f"{event.reason.value}{detail}" + (f", by {event.task}" if event.task else "")

    def _view(self) -> ControlView:
        current = self._generation
        entries = sorted(self._checkpoints.values(), key=lambda c: c.checkpoint_id)
        tasks = self._tasks.get(current) if current is not None else None
        return ControlView(
            self.topic_name,
            current,
            tuple(c for c in entries if c.status == "in progress" and c.generation == current),
            tuple(c for c in entries if c.status == "aborted")[-10:],
            len(tasks) if tasks else None,
            # a generation's coordinator counts from 0, and says every change in an abort or a complete
            failed_in_a_row=self._failed.get(current, 0) if current is not None else None,
            tolerable_failed_checkpoints=self._tolerable,
            rejected=dict(self._topic.rejected) if self._topic is not None else {},
            set_aside=sum(self._set_aside.get(current, {}).values()) if current is not None else 0,
        )


def live_table(view: ControlView) -> Table:
    """The checkpoints in progress and the newest aborted, newest last."""
    rows = [
        (
            c.checkpoint_id,
            c.generation,
            c.status,
            (f"{len(c.acked)} of {view.tasks}" if view.tasks else str(len(c.acked)))
            + (f": {', '.join(sorted(c.acked))}" if c.acked else ""),
            c.why,
        )
        for c in sorted((*view.in_progress, *view.aborted), key=lambda c: c.checkpoint_id)
    ]
    return Table.of(
        f"from the control topic {view.topic}: checkpoints in progress and aborted",
        ("checkpoint", "gen", "status", "acked by", "why"),
        rows,
        right=("checkpoint", "gen"),
    )

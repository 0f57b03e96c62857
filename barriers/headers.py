"""Every Kafka record header spark-abs writes or reads, by name; defined here
and nowhere else.

Two prefixes, each for a reason:

- ``abs.``: headers the engine reads back and acts on (a barrier, a
  watermark, a record's generation and format, a sink's epoch, a
  signature).  A record carrying any ``abs.`` header is the protocol's
  business (``barriers.messages.is_control``), so a user's own headers must
  not start with it.
- ``spark-abs-``: the notes on a dead letter, written for people and tools
  that read the dead-letter topic and never acted on by the engine.  Apart
  from ``abs.`` on purpose: a dead letter replayed into an ingress topic
  keeps its notes, and they must not make it look like a control record.

Two signatures, each named after what it signs: ``abs.sig`` on control
events and barriers, ``abs.signature`` on a Kafka sink's commit markers
(named before the two were one module; kept, so the markers in existing
commits topics still verify)."""

from __future__ import annotations

__all__ = [
    "HEADER_PREFIX",
    "KIND_HEADER",
    "CHECKPOINT_HEADER",
    "JOB_HEADER",
    "ALIGNMENT_HEADER",
    "TIMESTAMP_HEADER",
    "REASON_HEADER",
    "IN_FLIGHT_HEADER",
    "ALIGNMENT_TIMEOUT_HEADER",
    "HELD_BUDGET_HEADER",
    "GENERATION_HEADER",
    "CHANNEL_HEADER",
    "SIGNATURE_HEADER",
    "WATERMARK_HEADER",
    "IDLE_HEADER",
    "FORMAT_HEADER",
    "EPOCH_HEADER",
    "MARKER_SIGNATURE_HEADER",
    "NOTE_PREFIX",
    "DEAD_LETTER_REASON",
    "DEAD_LETTER_SOURCE",
    "DEAD_LETTER_SOURCE_OFFSET",
    "DEAD_LETTER_ROW",
    "DEAD_LETTER_READ_FROM",
    "DEAD_LETTER_ORIGINAL",
    "DEAD_LETTER_TRUNCATED",
    "DEAD_LETTER_ORIGINAL_BYTES",
    "DEAD_LETTER_ORIGINAL_SHA256",
    "DEAD_LETTER_GENERATION",
    "DEAD_LETTER_AFTER_CHECKPOINT",
    "DEAD_LETTER_RESTORED",
    "DEAD_LETTER_SIGNATURE",
    "DRILL_HEADER",
]

# ---------------------------------------------------------------- the engine's: abs.*
HEADER_PREFIX = "abs."

# a barrier or a cancellation (barriers.messages encodes and decodes them)
KIND_HEADER = "abs.kind"
CHECKPOINT_HEADER = "abs.checkpoint"
JOB_HEADER = "abs.job"
ALIGNMENT_HEADER = "abs.alignment"
TIMESTAMP_HEADER = "abs.ts"
REASON_HEADER = "abs.reason"
IN_FLIGHT_HEADER = "abs.in_flight"
ALIGNMENT_TIMEOUT_HEADER = "abs.timeout_ms"
HELD_BUDGET_HEADER = "abs.held_budget"
# carried by data records too: the generation of the task that wrote them
GENERATION_HEADER = "abs.gen"
# the channel (``topic:partition``) a barrier or a cancellation was written for: signed with it, so a
# copy appended to another channel does not verify there
CHANNEL_HEADER = "abs.channel"
# the job key's signature of a barrier or of a control event
SIGNATURE_HEADER = "abs.sig"

# event time: a watermark record's watermark (or a data record's, on an event-time ingress), and,
# on a watermark record, that the task that wrote it has no active event-time input
WATERMARK_HEADER = "abs.wm"
IDLE_HEADER = "abs.idle"
# a record whose value is an Arrow IPC stream (stage-to-stage topics)
FORMAT_HEADER = "abs.fmt"
# every record a Kafka sink publishes: ``<task>:<epoch>``
EPOCH_HEADER = "abs.epoch"
# a Kafka sink's commit marker: the job key's signature of the sink topic, the marker and its value
MARKER_SIGNATURE_HEADER = "abs.signature"

# ---------------------------------------------------------------- a dead letter's notes: spark-abs-*
NOTE_PREFIX = "spark-abs-"

# why the record is a dead letter, and where it was read (channel and offset)
DEAD_LETTER_REASON = "spark-abs-reason"
DEAD_LETTER_SOURCE = "spark-abs-source"
DEAD_LETTER_SOURCE_OFFSET = "spark-abs-source-offset"
# a row an operator rejected, as the operator had it, and the channel the task was reading
DEAD_LETTER_ROW = "spark-abs-row"
DEAD_LETTER_READ_FROM = "spark-abs-read-from"
# present only when the ingress record could not be included, and why
DEAD_LETTER_ORIGINAL = "spark-abs-original"
# a dead letter cut to what Kafka takes: what was cut, and the whole value's size and digest
DEAD_LETTER_TRUNCATED = "spark-abs-truncated"
DEAD_LETTER_ORIGINAL_BYTES = "spark-abs-original-bytes"
DEAD_LETTER_ORIGINAL_SHA256 = "spark-abs-original-sha256"
# the generation that sent a task's dead letter, and the newest checkpoint whose snapshot the task had
# taken (or that it started from) when it sent it: a restore to that checkpoint or an older one reads
# the record again, and the letter is superseded (``streaming.adapters.kafka.dead_letters``)
DEAD_LETTER_GENERATION = "spark-abs-generation"
DEAD_LETTER_AFTER_CHECKPOINT = "spark-abs-after-checkpoint"
# the key of a restore's mark in the dead-letter topic: generation g starts from checkpoint c, and
# every letter of an older generation sent after c is superseded (signed with the job's key)
DEAD_LETTER_RESTORED = b"spark-abs-restored"
DEAD_LETTER_SIGNATURE = "spark-abs-signature"
# a record a restore drill sent to be a dead letter (its poison kind): references leave it out, the
# engine reads it as any other record
DRILL_HEADER = "spark-abs-drill"

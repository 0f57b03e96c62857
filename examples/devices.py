"""Device events deduplicated and counted per device over the last minute,
every twenty seconds: devices send again what they are not sure arrived
(the same event, seconds later), and each event must count once.

::

    <job>.events (2 partitions, event time ts) ─► events-by-id (2 tasks, by event_id)
        ─► unique-events (2 tasks, Deduplicate within 1 min, by device)
        ─► calibrated (2 tasks, Spark SQL over the deduplicated rows, by device)
        ─► device-minutes (1-minute windows sliding by 20 s, per device) ─► Kafka topic <job>.device-minutes

What it shows: Avro values as Confluent's serializers write them (after a
zero byte and a schema id), their schemas in a schema registry, and a
producer that evolves its schema mid-stream: the first half of the events
is written with ``EVENTS_V1`` (no ``kind``, ``value`` an int), the rest
with ``EVENTS_V2`` (a ``firmware`` field added), each value resolved by its
writer schema's id to ``EVENTS``, the schema the pipeline reads with
(``Ingress(registry=True)``: ``kind`` defaults to ``temp``, an int
widens to a long, ``firmware`` is not read); the values decoded by Spark on
the executors; a stage of Spark code given as a DataFrame function
(``readings``); deduplication within a watermark (Spark's
``dropDuplicatesWithinWatermark``), fed by a stage that routes by the event
id so that every copy of an event meets in one task; Spark code after a
stage of Python (``calibrated``: Spark reads the rows ``unique-events``
writes, Arrow batches of the ``schema`` it declares); sliding windows
(Spark's ``window(ts, size, slide)``); records out of order within the
ingress's declared bound (a resent event is up to 4 s behind), never late.

Run it on the local runtime (``spark-abs local up``)::

    spark-abs run devices --store file:///tmp/devices-store
"""

from __future__ import annotations

import random

import pyarrow as pa

from operators import Deduplicate, SlidingWindowAggregate, count, sum_
from streaming import Ingress, Pipeline, Sink, Stage
from streaming.adapters.serde import avro
from streaming.adapters.serde.schema_registry import current_registry, subject_of

__all__ = [
    "overflowing",
    "EVENTS",
    "EVENTS_V1",
    "EVENTS_V2",
    "UNIQUE",
    "CALIBRATE",
    "pipeline",
    "readings",
    "records",
    "REFERENCE",
    "KEYS",
    "drill_workload",
]

_KIND = {"type": "enum", "name": "Kind", "symbols": ["temp", "door"]}
# the Avro schema the pipeline reads the devices' events with (event time ts in milliseconds)
EVENTS = {
    "type": "record",
    "name": "DeviceEvent",
    "namespace": "examples.devices",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "kind", "type": _KIND, "default": "temp"},
        {"name": "value", "type": "long"},
        {"name": "ts", "type": "long"},
    ],
}
# what the devices' firmware wrote first: no kind, the value an int
EVENTS_V1 = {
    "type": "record",
    "name": "DeviceEvent",
    "namespace": "examples.devices",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "value", "type": "int"},
        {"name": "ts", "type": "long"},
    ],
}
# and after an update, mid-stream: the kind, a long value, and the firmware's version
EVENTS_V2 = {
    "type": "record",
    "name": "DeviceEvent",
    "namespace": "examples.devices",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "kind", "type": _KIND},
        {"name": "value", "type": "long"},
        {"name": "ts", "type": "long"},
        {"name": "firmware", "type": ["null", "string"], "default": None},
    ],
}
# the rows unique-events passes on (what readings keeps), which Spark reads after it
UNIQUE = pa.schema([("event_id", pa.string()), ("device", pa.string()), ("value", pa.int64()), ("ts", pa.int64())])
# readings are sent in tenths of the unit the totals are kept in
CALIBRATE = "SELECT _position, event_id, device, value * 10 AS value, ts FROM {input}"
MINUTE_MS = 60_000
SLIDE_MS = 20_000


def pipeline(job: str = "device-events") -> Pipeline:
    events = f"{job}.events"
    return Pipeline(
        job,
        (
            Ingress(
                events,
                2,
                avro=EVENTS,
                confluent_wire=True,
                registry=True,
                event_time="ts",
                max_out_of_orderness=5_000,
            ),
        ),
        (
            # Spark code, a DataFrame function: Spark decodes the events and keeps four columns
            Stage("events-by-id", (events,), spark=readings, parallelism=2, key="event_id"),
            Stage(
                "unique-events",
                ("events-by-id",),
                lambda: Deduplicate("event_id", "ts", within=MINUTE_MS),
                parallelism=2,
                key="device",
                schema=UNIQUE,
            ),
            # Spark code after a stage of Python: Spark SQL over the rows unique-events writes
            Stage("calibrated", ("unique-events",), spark=CALIBRATE, parallelism=2, key="device"),
            Stage(
                "device-minutes",
                ("calibrated",),
                lambda: SlidingWindowAggregate(
                    "device", "ts", MINUTE_MS, SLIDE_MS, {"events": count(), "total": sum_("value")}
                ),
                sink=Sink("kafka", f"{job}.device-minutes"),
            ),
        ),
    )


def readings(events):
    """The columns the later stages need, chosen by Spark on the executors."""
    return events.select("_position", "event_id", "device", "value", "ts")


def records(
    job: str = "device-events", *, events: int = 2_500, seed: int = 9, round: int = 0, registry=None
) -> list[tuple[str, int, bytes]]:
    """Events of 25 devices, 50 ms of event time apart, spread over two
    partitions; one in eight is sent again 1 to 4 s later on its partition
    (the same record: its event time is the original's).  Round ``n`` is
    the ``n``-th ``events`` events, their ids and event time after the
    rounds before (a resend of one round may come after the next round's
    first events, within the ingress's bound).  Each round's first half is
    written with ``EVENTS_V1``, the rest with ``EVENTS_V2``, both registered
    in ``registry`` (None: the schema registry of this process,
    ``streaming.adapters.serde.schema_registry.use_registry``) under ``<topic>-value``."""
    rng = random.Random(seed if round == 0 else f"{seed}-{round}")
    partitions: list[list[tuple[int, dict]]] = [[], []]
    for i in range(round * events, (round + 1) * events):
        ts = i * 50
        event = {
            "event_id": f"e{i:06d}",
            "device": f"d{rng.randrange(25):02d}",
            "kind": rng.choice(("temp", "door")),
            "value": rng.randint(0, 99),
            "ts": ts,
        }
        partition = rng.randrange(2)
        partitions[partition].append((ts, event))
        if rng.random() < 0.125:
            partitions[partition].append((ts + rng.randint(1_000, 4_000), event))  # sent again later
    topic = f"{job}.events"
    registry = registry or current_registry("the devices example's producer")
    writers = [(avro.avro_schema(v, confluent_wire=True, what=topic), v is EVENTS_V1) for v in (EVENTS_V1, EVENTS_V2)]
    ids = [registry.register(subject_of(topic), schema.json) for schema, _ in writers]
    sent = sorted(
        (
            (at, p, n, row)
            for p, rows in enumerate(partitions)
            for n, (at, row) in enumerate(sorted(rows, key=lambda r: r[0]))
        ),
        key=lambda r: (r[0], r[1], r[2]),
    )
    values = []
    for n, (_, _, _, row) in enumerate(sent):
        version = 0 if n < len(sent) // 2 else 1  # the update comes mid-stream, on both partitions
        schema, first = writers[version]
        written = {k: v for k, v in row.items() if k != "kind"} if first else {**row, "firmware": "2.1"}
        values += avro.encode([written], schema, schema_id=ids[version])
    return [(topic, p, value) for (_, p, _, _), value in zip(sent, values)]


def drill_workload():
    """This pipeline's workload for ``spark-abs drill`` (``spark_abs_examples.check.drill_workload``);
    its poison (``spark-abs drill --kinds poison``): a reading of the largest long, which
    ``calibrated``'s Spark SQL cannot multiply by ten (ARITHMETIC_OVERFLOW in Spark's ANSI mode)."""
    from spark_abs_examples import check

    return check.drill_workload(records, REFERENCE, KEYS, poisoned=overflowing)


def overflowing(sent):
    """A reading of ``2**63 - 1`` at the time of ``sent`` (a drill's ``InputRecord``, an event the
    workload wrote), written as the devices' firmware writes now (``EVENTS_V2``)."""
    from streaming.tools.drill.workload import InputRecord

    registry = current_registry("the devices example's poison")
    read = avro.avro_schema(EVENTS, confluent_wire=True, registry=True, subject=subject_of(sent.topic), what=sent.topic)
    table, _, _ = avro.decode(pa.array([sent.value], pa.binary()), read)
    ts = table["ts"][0].as_py()
    writer = avro.avro_schema(EVENTS_V2, confluent_wire=True, what=sent.topic)
    schema_id = registry.register(subject_of(sent.topic), writer.json)
    event = {"event_id": f"overflow-{ts}", "device": "d00", "kind": "temp", "value": 2**63 - 1, "ts": ts}
    [value] = avro.encode([{**event, "firmware": "2.1"}], writer, schema_id=schema_id)
    return [InputRecord(sent.topic, sent.partition, value)]


# the output, computed in batch from the same topic: every event once, per device and sliding minute
REFERENCE = f"""
SELECT device,
       unix_millis(w.start) AS window_start,
       unix_millis(w.end) AS window_end,
       COUNT(*) AS events,
       SUM(value * 10) AS total
FROM (SELECT device, value, window(timestamp_millis(ts), '{MINUTE_MS // 1000} seconds', '{SLIDE_MS // 1000} seconds') AS w
      FROM (SELECT DISTINCT event_id, device, value, ts FROM events))
GROUP BY device, w
"""
KEYS = ("device", "window_start")

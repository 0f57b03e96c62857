"""The records a restore drill's ``poison`` kind appends to a job's ingress
topics while it runs (``streaming.tools.drill.failures``): one of every kind
of record no schema expected, which a producer of the topic can write
(``hostile_records``), and the workload's own records that make the
pipeline's code raise (``DrillWorkload.poisoned``, made from the last
record the workload sent).  Each must become exactly one dead letter
naming why, the job must go on without a restore, and the output must be
the reference's over the other records: every such record carries
``DRILL_HEADER``, which the references leave out (``POISON_FILTER``)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

import pyarrow as pa

from barriers.headers import DRILL_HEADER, FORMAT_HEADER, GENERATION_HEADER, WATERMARK_HEADER
from barriers.messages import UNSIGNED, Barrier, encode
from streaming.adapters.serde.codec import ARROW_FORMAT, encode_batches
from streaming.api.pipeline import Ingress, Pipeline
from streaming.tools.drill.workload import InputRecord

__all__ = ["HOSTILE", "hostile_records", "own_poison"]

_MARK = ((DRILL_HEADER, b"poison"),)

# what each hostile record is, by name (the drill's log says which were sent)
HOSTILE = (
    "not JSON",
    "a number of 5,000 digits",
    "JSON nested 100,000 deep",
    "an Arrow batch on an ingress topic",
    "an abs.wm header of zz",
    "an abs.gen header of zz",
    "an unsigned barrier",
    "Confluent's wire format naming a schema id the registry does not have",
)


def _hostile(ingress: Ingress, job: str) -> list[tuple[bytes, tuple[tuple[str, bytes], ...]]]:
    """Each of ``HOSTILE``'s records for ``ingress``: (value, headers)."""
    [arrow] = encode_batches(pa.table({"id": [10**9], "amount": [10**6]}))
    # the number where the schema has a number (its first integer field, or else its first)
    fields = list(ingress.schema) if ingress.schema is not None else []
    number = next((f.name for f in fields if pa.types.is_integer(f.type)), fields[0].name if fields else "id")
    records = [
        (b"{not json", ()),
        (b'{"' + number.encode() + b'": ' + b"9" * 5000 + b"}", ()),
        (b"[" * 100_000, ()),
        (arrow, ((FORMAT_HEADER, ARROW_FORMAT),)),
        (b"{}", ((WATERMARK_HEADER, b"zz"),)),
        (b"{}", ((GENERATION_HEADER, b"zz"),)),
        (b"", tuple(encode(Barrier(1, job=job), key=UNSIGNED))),  # a barrier without the job's key
    ]
    if ingress.avro is not None:
        records.append((b"\x00" + struct.pack(">I", 2**31 - 1) + b"\x02\x04", ()))
    return records


def hostile_records(pipeline: Pipeline) -> list[InputRecord]:
    """One of each of ``HOSTILE`` on every ingress topic of ``pipeline``
    (those of an Avro ingress only there), spread over its partitions, each
    marked with ``DRILL_HEADER``."""
    out = []
    for ingress in pipeline.ingress:
        for i, (value, headers) in enumerate(_hostile(ingress, pipeline.job)):
            out.append(InputRecord(ingress.topic, i % ingress.partitions, value, (*headers, *_MARK), malformed=True))
    return out


def own_poison(
    pipeline: Pipeline,
    poisoned: Callable[[InputRecord], list[InputRecord]] | None,
    last: Mapping[str, InputRecord],
) -> list[InputRecord]:
    """The workload's records its pipeline's code raises on
    (``DrillWorkload.poisoned``), made from ``last``: the last record the
    workload sent on each ingress topic, each marked with ``DRILL_HEADER``."""
    out = []
    if poisoned is not None:
        for ingress in pipeline.ingress:
            sent = last.get(ingress.topic)
            if sent is None:
                continue
            for record in poisoned(sent):
                headers = (*record.headers, *_MARK)
                out.append(InputRecord(record.topic, record.partition, record.value, headers, record.key, True))
    return out

"""Payments checked against their card authorisation: a payment must come
within five minutes after the authorisation it names, and not above the
authorised amount; each payment is committed to a Kafka topic with its
status (``ok``, ``over-limit``, ``unauthorised``).

::

    <job>.authorisations (2 partitions by auth_id, event time ts) ─┐
                                                                   ├─► checked-payments (2 tasks) ─► Kafka topic <job>.checked-payments
    <job>.payments       (2 partitions by auth_id, event time ts) ─┘

What it shows: an interval join of two streams bounded by event time (left
outer: a payment with no authorisation in its interval still comes out, once
the watermark says none can come any more), whose state the watermark keeps
bounded; and two ingress topics read straight by a keyed stage with several
tasks, which is right because their producers partition both by
``auth_id`` into as many partitions (the pipeline check refuses it
otherwise).

Run it on the local runtime (``spark-abs local up``)::

    spark-abs run payments --store file:///tmp/payments-store
"""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators import Chain, IntervalJoin, with_column
from streaming import Ingress, Pipeline, Sink, Stage

__all__ = ["PAYMENTS", "AUTHORISATIONS", "pipeline", "records", "REFERENCE", "KEYS", "drill_workload"]

PAYMENTS = pa.schema([("payment_id", pa.int64()), ("auth_id", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
AUTHORISATIONS = pa.schema(
    [("auth_id", pa.string()), ("merchant", pa.string()), ("authorised", pa.int64()), ("ts", pa.int64())]
)
WITHIN_MS = 5 * 60_000
MERCHANTS = ("books", "travel", "groceries", "games", "fuel")


def _status() -> pc.Expression:
    unauthorised = pc.is_null(pc.field("merchant"))
    over = pc.greater(pc.field("amount"), pc.field("authorised"))
    return pc.if_else(unauthorised, "unauthorised", pc.if_else(over, "over-limit", "ok"))


def pipeline(job: str = "payments") -> Pipeline:
    payments, authorisations = f"{job}.payments", f"{job}.authorisations"
    return Pipeline(
        job,
        (
            Ingress(authorisations, 2, AUTHORISATIONS, event_time="ts", max_out_of_orderness=2_000, key="auth_id"),
            Ingress(payments, 2, PAYMENTS, event_time="ts", max_out_of_orderness=2_000, key="auth_id"),
        ),
        (
            Stage(
                "checked-payments",
                (payments, authorisations),
                lambda: Chain(
                    # the authorisation's ts within [payment ts - 5 min, payment ts]
                    IntervalJoin(
                        "auth_id",
                        left_time="ts",
                        right_time="ts",
                        lower=-WITHIN_MS,
                        upper=0,
                        left=payments,
                        right=authorisations,
                        how="left_outer",
                        right_suffix="_auth",
                    ),
                    with_column("status", _status()),
                ),
                parallelism=2,
                sink=Sink("kafka", f"{job}.checked-payments"),
            ),
        ),
    )


def partition_of(auth_id: str, partitions: int = 2) -> int:
    """Where producers write the records of an authorisation (both topics alike)."""
    return zlib.crc32(auth_id.encode()) % partitions


def records(
    job: str = "payments", *, authorisations: int = 800, seed: int = 5, round: int = 0
) -> list[tuple[str, int, bytes]]:
    """Authorisations a second apart on average, each followed by none to two
    payments 1 s to 6 min later (some too late for it, some above the
    authorised amount), and a few payments naming no authorisation; every
    record in event-time order within its partition.  Round ``n`` follows
    the ``n`` before it: its event time ``n * 3 * authorisations`` seconds
    later (after every payment of the round before), its ids after theirs."""
    rng = random.Random(seed if round == 0 else f"{seed}-{round}")
    ts = round * authorisations * 3_000
    events, payment_id = [], round * authorisations * 3
    for a in range(round * authorisations, (round + 1) * authorisations):
        ts += rng.randint(200, 1_800)
        auth: dict[str, Any] = {
            "auth_id": f"a{a:05d}",
            "merchant": rng.choice(MERCHANTS),
            "authorised": rng.randint(10, 500),
            "ts": ts,
        }
        events.append((ts, "authorisations", auth))
        for _ in range(rng.choice((0, 1, 1, 1, 2))):
            amount = auth["authorised"] + rng.choice((-5, -1, 0, 0, 0, 3))
            pay_ts = ts + rng.randint(1_000, 360_000)
            events.append(
                (
                    pay_ts,
                    "payments",
                    {"payment_id": payment_id, "auth_id": auth["auth_id"], "amount": amount, "ts": pay_ts},
                )
            )
            payment_id += 1
        if rng.random() < 0.03:
            events.append((ts, "payments", {"payment_id": payment_id, "auth_id": f"x{a:05d}", "amount": 20, "ts": ts}))
            payment_id += 1
    ordered = sorted(events, key=lambda e: (e[0], e[1], json.dumps(e[2])))
    return [(f"{job}.{topic}", partition_of(row["auth_id"]), json.dumps(row).encode()) for _, topic, row in ordered]


def drill_workload():
    """This pipeline's workload for ``spark-abs drill`` (``spark_abs_examples.check.drill_workload``)."""
    from spark_abs_examples import check

    return check.drill_workload(records, REFERENCE, KEYS)


# the output, computed in batch from the same topics
REFERENCE = f"""
SELECT p.payment_id, p.auth_id, p.amount, p.ts,
       a.merchant, a.authorised, a.ts AS ts_auth,
       CASE WHEN a.auth_id IS NULL THEN 'unauthorised'
            WHEN p.amount > a.authorised THEN 'over-limit'
            ELSE 'ok' END AS status
FROM payments p
LEFT JOIN authorisations a
  ON p.auth_id = a.auth_id AND a.ts BETWEEN p.ts - {WITHIN_MS} AND p.ts
"""
KEYS = ("payment_id",)

"""Clickstream sessions: each user's clicks grouped into sessions that end
after 30 seconds without a click, with the clicks and the money spent in
each, committed to a Delta Lake table.

::

    <job>.clicks (2 partitions by user, event time ts) ─► user-sessions (2 tasks) ─► Delta table <store>/<job>/sink/table

What it shows: session windows (Spark's ``session_window``), and keyed
state read straight from an ingress topic with several tasks, which is
right only because the producers partition the topic by user and the
ingress says so (``Ingress(key="user")``): the pipeline check refuses it
otherwise; and Spark code in front of a stateful operator in one stage
(``session_columns``: Spark decodes the clicks and keeps the columns the
sessions need), the sessions following event time the Spark side reports;
and the Delta sink: each task appends an epoch's sessions in one Delta
commit, read back with Spark (``spark.read.format("delta")``) or
``streaming.read_delta_output``.

Run it on the local runtime (``spark-abs local up``)::

    spark-abs run clickstream --store file:///tmp/clicks-store
"""

from __future__ import annotations

import heapq
import json
import random
import zlib

import pyarrow as pa

from operators import SessionWindowAggregate, count, max_, sum_
from streaming import Ingress, Pipeline, Sink, Stage

__all__ = ["CLICKS", "GAP_MS", "pipeline", "session_columns", "records", "REFERENCE", "KEYS", "drill_workload"]

CLICKS = pa.schema([("user", pa.string()), ("page", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
GAP_MS = 30_000
PAGES = ("home", "search", "product", "cart", "checkout", "help")


def pipeline(job: str = "clickstream") -> Pipeline:
    clicks = f"{job}.clicks"
    return Pipeline(
        job,
        # producers write each user's clicks to one partition (partition_of), in event-time order
        (Ingress(clicks, 2, CLICKS, event_time="ts", max_out_of_orderness=2_000, key="user"),),
        (
            Stage(
                "user-sessions",
                (clicks,),
                lambda: SessionWindowAggregate(
                    "user", "ts", GAP_MS, {"clicks": count(), "spent": sum_("amount"), "biggest": max_("amount")}
                ),
                parallelism=2,
                sink=Sink("delta"),
                spark=session_columns,
            ),
        ),
    )


def session_columns(clicks):
    """Spark code, run on the executors: of each click, only what sessions
    need crosses to Python (the page stays behind)."""
    return clicks.select("_position", "user", "amount", "ts")


def partition_of(user: str, partitions: int = 2) -> int:
    """Where a producer writes a user's clicks: every click of a user in one partition."""
    return zlib.crc32(user.encode()) % partitions


ROUND_MS = 660_000  # event time of one round of input (records(round=n)): 10 minutes of clicks and a pause


def records(
    job: str = "clickstream", *, users: int = 40, seed: int = 3, round: int = 0
) -> list[tuple[str, int, bytes]]:
    """Clicks of ``users`` users over about ten minutes of event time, in
    event-time order: within a session clicks come 0.5 to 25 s apart,
    between two sessions 45 s to 3 min (never exactly the gap).  Round ``n``
    is the ten minutes ``n * ROUND_MS`` later (every session of a round ends
    before the next round)."""
    rng = random.Random(seed if round == 0 else f"{seed}-{round}")
    streams = []
    for u in range(users):
        start = round * ROUND_MS
        user, ts, clicks = f"u{u:03d}", start + rng.randint(0, 60_000), []
        while ts < start + 600_000:
            page = rng.choice(PAGES)
            amount = rng.randint(5, 300) if page == "checkout" else 0
            clicks.append((ts, user, page, amount))
            ts += rng.randint(500, 25_000) if rng.random() < 0.85 else rng.randint(45_000, 180_000)
        streams.append(clicks)
    topic = f"{job}.clicks"
    return [
        (topic, partition_of(user), json.dumps({"user": user, "page": page, "amount": amount, "ts": ts}).encode())
        for ts, user, page, amount in heapq.merge(*streams)
    ]


def drill_workload():
    """This pipeline's workload for ``spark-abs drill`` (``spark_abs_examples.check.drill_workload``)."""
    from spark_abs_examples import check

    return check.drill_workload(records, REFERENCE, KEYS)


# the output, computed in batch from the same topic with Spark's session windows
REFERENCE = f"""
SELECT user,
       unix_millis(session_window.start) AS session_start,
       unix_millis(session_window.end) AS session_end,
       COUNT(*) AS clicks,
       SUM(amount) AS spent,
       MAX(amount) AS biggest
FROM clicks
GROUP BY user, session_window(timestamp_millis(ts), '{GAP_MS // 1000} seconds')
"""
KEYS = ("user", "session_start")

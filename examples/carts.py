"""Abandoned shopping carts: a cart with no new item for ten minutes of
event time, and no checkout, is reported once, with its items and value.
Keyed state with event-time timers written by hand (``KeyedProcess``, the
shape of Flink's ``KeyedProcessFunction`` and Spark's ``transformWithState``).

::

    <job>.cart-events (2 partitions by user, event time ts) ─► abandoned-carts (2 tasks) ─► Kafka topic <job>.abandoned-carts

What it shows: per-user state and a timer per cart, kept in checkpoints and
restored; logic written in event time (a row that comes after its cart's
deadline closes that cart itself, whatever the watermark says yet), so the
output does not depend on how fast the watermark moves.

Run it on the local runtime (``spark-abs local up``)::

    spark-abs run carts --store file:///tmp/carts-store
"""

from __future__ import annotations

import json
import random
import zlib

import pyarrow as pa

from operators import KeyContext, KeyedProcess, KeyedProcessFunction
from streaming import Ingress, Pipeline, Sink, Stage

__all__ = [
    "CART_EVENTS",
    "ABANDONED",
    "AbandonedCarts",
    "pipeline",
    "records",
    "REFERENCE",
    "KEYS",
    "drill_workload",
    "priceless",
]

CART_EVENTS = pa.schema([("user", pa.string()), ("action", pa.string()), ("price", pa.int64()), ("ts", pa.int64())])
ABANDONED = pa.schema(
    [
        ("user", pa.string()),
        ("started", pa.int64()),
        ("abandoned_at", pa.int64()),
        ("items", pa.int64()),
        ("value", pa.int64()),
    ]
)
TIMEOUT_MS = 10 * 60_000


class AbandonedCarts(KeyedProcessFunction):
    """Per user: the open cart (first and last item's time, items, value) and
    a timer at its deadline, ten minutes after its last item."""

    def process_rows(self, key, rows: list[dict], ctx: KeyContext) -> list[dict]:
        out = []
        for row in rows:
            cart = ctx.state
            if cart and row["ts"] > cart["last"] + TIMEOUT_MS:  # its deadline passed in event time
                out.append(self._abandoned(key, ctx))
                cart = ctx.state
            if row["action"] == "checkout":
                ctx.clear()
            elif row["action"] == "add":
                if cart:
                    ctx.delete_timer(cart["last"] + TIMEOUT_MS)
                started = cart["started"] if cart else row["ts"]
                items, value = (cart["items"], cart["value"]) if cart else (0, 0)
                ctx.state.update(started=started, last=row["ts"], items=items + 1, value=value + row["price"])
                ctx.register_timer(row["ts"] + TIMEOUT_MS)
        return out

    def on_timer(self, key, timestamp: int, ctx: KeyContext) -> list[dict]:
        return [self._abandoned(key, ctx)]

    @staticmethod
    def _abandoned(user, ctx: KeyContext) -> dict:
        cart = dict(ctx.state)
        ctx.clear()
        deadline = cart["last"] + TIMEOUT_MS
        return {
            "user": user,
            "started": cart["started"],
            "abandoned_at": deadline,
            "items": cart["items"],
            "value": cart["value"],
        }


def pipeline(job: str = "carts") -> Pipeline:
    events = f"{job}.cart-events"
    return Pipeline(
        job,
        (Ingress(events, 2, CART_EVENTS, event_time="ts", max_out_of_orderness=2_000, key="user"),),
        (
            Stage(
                "abandoned-carts",
                (events,),
                lambda: KeyedProcess("user", AbandonedCarts, time_column="ts", output_schema=ABANDONED),
                parallelism=2,
                sink=Sink("kafka", f"{job}.abandoned-carts"),
            ),
        ),
    )


def partition_of(user: str, partitions: int = 2) -> int:
    return zlib.crc32(user.encode()) % partitions


ROUND_MS = 3_600_000  # event time of one round of input (records(round=n))


def records(job: str = "carts", *, users: int = 60, seed: int = 13, round: int = 0) -> list[tuple[str, int, bytes]]:
    """Cart events of ``users`` users over about an hour of event time, in
    event-time order: items 10 s to 8 min apart, now and then a checkout,
    now and then a pause of 11 to 30 min (never exactly the timeout).
    Round ``n`` is the hour ``n * ROUND_MS`` later (a cart open at the end of
    a round goes on into the next, or is abandoned, as it would be in one
    longer stretch)."""
    rng = random.Random(seed if round == 0 else f"{seed}-{round}")
    events = []
    for u in range(users):
        start = round * ROUND_MS
        user, ts = f"shopper{u:03d}", start + rng.randint(0, 120_000)
        while ts < start + ROUND_MS:
            action = "checkout" if rng.random() < 0.15 else "add"
            events.append((ts, user, action, rng.randint(3, 120) if action == "add" else 0))
            ts += rng.randint(10_000, 480_000) if rng.random() < 0.8 else rng.randint(660_000, 1_800_000)
    topic = f"{job}.cart-events"
    return [
        (topic, partition_of(user), json.dumps({"user": user, "action": action, "price": price, "ts": ts}).encode())
        for ts, user, action, price in sorted(events)
    ]


def drill_workload():
    """This pipeline's workload for ``spark-abs drill`` (``spark_abs_examples.check.drill_workload``);
    its poison (``spark-abs drill --kinds poison``): an item added without a price, which
    ``AbandonedCarts`` does not expect (``value + None`` raises a ``TypeError``)."""
    from spark_abs_examples import check

    return check.drill_workload(records, REFERENCE, KEYS, poisoned=priceless)


def priceless(sent):
    """An item added to the cart of ``sent``'s user, ten minutes of event time after it (not late
    when it comes: the input's event time runs ahead fast), without a price (a drill's
    ``InputRecord``s): the user's function raises on it."""
    from streaming.tools.drill.workload import InputRecord

    event = json.loads(sent.value)
    added = {"user": event["user"], "action": "add", "price": None, "ts": event["ts"] + TIMEOUT_MS}
    return [InputRecord(sent.topic, sent.partition, json.dumps(added).encode())]


# the output, computed in batch from the same topic: a user's events cut into carts where one
# follows a checkout or comes more than the timeout after the one before; a cart without a checkout
# was abandoned at its last item plus the timeout
REFERENCE = f"""
WITH marked AS (
  SELECT *,
         LAG(ts) OVER (PARTITION BY user ORDER BY ts) AS prev_ts,
         LAG(action) OVER (PARTITION BY user ORDER BY ts) AS prev_action
  FROM `cart-events`
), numbered AS (
  SELECT *,
         SUM(CASE WHEN prev_ts IS NULL OR prev_action = 'checkout' OR ts - prev_ts > {TIMEOUT_MS} THEN 1 ELSE 0 END)
           OVER (PARTITION BY user ORDER BY ts ROWS UNBOUNDED PRECEDING) AS cart
  FROM marked
), carts AS (
  SELECT user, cart,
         MIN(CASE WHEN action = 'add' THEN ts END) AS started,
         MAX(CASE WHEN action = 'add' THEN ts END) AS last_item,
         SUM(CASE WHEN action = 'add' THEN 1 ELSE 0 END) AS items,
         SUM(CASE WHEN action = 'add' THEN price ELSE 0 END) AS value,
         MAX(CASE WHEN action = 'checkout' THEN 1 ELSE 0 END) AS bought
  FROM numbered GROUP BY user, cart
)
SELECT user, started, last_item + {TIMEOUT_MS} AS abandoned_at, items, value
FROM carts WHERE bought = 0 AND items > 0
"""
KEYS = ("user", "started")

"""Orders enriched from a customer table and summed per country in
10-second event-time windows, committed to a Kafka topic.

::

    <job>.orders     (3 partitions, event time ts) ─► valid-orders (2 tasks, by customer) ─┐
                                                                                          ├─► enriched-orders (2 tasks, by country)
    <job>.customers  (1 partition, a table)        ─► customers-by-id (1 task, by id) ────┘        │
                                                                                                   ▼
                                     country-totals (10 s windows per country) ─► Kafka topic <job>.country-totals

What it shows: a table whose records are Avro (decoded in Python, as no
Spark code reads them); a stage that is Spark SQL (Spark decodes the orders and
filters them on the executors; only the orders kept reach Python); a
stream-table join whose table side carries no event time (it holds no
window back), routed by the join key so that every task of the join sees
the customers of its orders; the join holding the watermark at
its earliest buffered order (``time_column``), so an order that waits for
its customer is never late for the window after it; and an idle partition
(no producer writes to partition 2 of the orders) that stops holding the
windows back once the partition read beside it moved on 3 s of event time
(``idle_after_event_time``: no clock, so a pause of every producer, as in a
broker outage, makes nothing late).

Run it on the local runtime (``spark-abs local up``)::

    spark-abs run orders --store file:///tmp/orders-store
"""

from __future__ import annotations

import json
import random

import pyarrow as pa

from operators import LatestValueJoin, TumblingWindowAggregate, count, select, sum_
from streaming import Ingress, Pipeline, Sink, Stage
from streaming.adapters.serde import avro

__all__ = ["ORDERS", "CUSTOMERS", "pipeline", "records", "REFERENCE", "KEYS", "drill_workload"]

ORDERS = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
# the customer table comes as Avro records (no Spark code reads it: Python decodes them)
CUSTOMERS = {
    "type": "record",
    "name": "Customer",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "country", "type": "string"},
    ],
}
WINDOW_MS = 10_000
COUNTRIES = ("fr", "de", "nl", "es", "it", "pl")


def pipeline(job: str = "orders-by-country") -> Pipeline:
    orders, customers = f"{job}.orders", f"{job}.customers"
    return Pipeline(
        job,
        (
            # partition 2 has no producer: once partition 0 moved on 3 s of event time it holds nothing back
            # (no clock: a pause of every producer, a broker outage, makes nothing idle)
            Ingress(orders, 3, ORDERS, event_time="ts", max_out_of_orderness=1_000, idle_after_event_time=3_000),
            Ingress(customers, 1, avro=CUSTOMERS),
        ),
        (
            # Spark code: Spark decodes the orders and filters them on the executors
            Stage(
                "valid-orders",
                (orders,),
                spark="SELECT _position, order_id, customer, amount, ts FROM {input} WHERE amount > 0",
                parallelism=2,
                key="customer",
            ),
            Stage("customers-by-id", (customers,), lambda: select("id", "country"), key="id"),
            Stage(
                "enriched-orders",
                ("valid-orders", "customers-by-id"),
                lambda: LatestValueJoin(
                    "customer", "id", left="valid-orders", right="customers-by-id", time_column="ts"
                ),
                parallelism=2,
                key="country",
            ),
            Stage(
                "country-totals",
                ("enriched-orders",),
                lambda: TumblingWindowAggregate(
                    "country", "ts", WINDOW_MS, {"orders": count(), "revenue": sum_("amount")}
                ),
                sink=Sink("kafka", f"{job}.country-totals"),
            ),
        ),
    )


def records(
    job: str = "orders-by-country", *, orders: int = 2_500, seed: int = 1, round: int = 0
) -> list[tuple[str, int, bytes]]:
    """The input, in the order it is produced: (topic, partition, JSON value).
    The customer table comes first; orders follow, 25 ms of event time apart,
    order i on partition i mod 2 (event-time order within a partition;
    partition 2 gets nothing),
    a few with amounts that are not positive (filtered out).  Round ``n``
    (``round=n``) is the ``n``-th such stretch of input, after the
    ``n - 1`` before it: its orders only (the customers came in round 0),
    their ids and event time following on."""
    rng = random.Random(seed)
    customers = [{"id": f"c{i:03d}", "name": f"customer {i}", "country": rng.choice(COUNTRIES)} for i in range(120)]
    out = []
    if round == 0:
        schema = avro.avro_schema(CUSTOMERS, what=f"{job}.customers")
        out = [(f"{job}.customers", 0, value) for value in avro.encode(customers, schema)]
    else:
        rng.seed(f"{seed}-{round}")
    for i in range(round * orders, (round + 1) * orders):
        order = {"order_id": i, "customer": rng.choice(customers)["id"], "amount": rng.randint(-20, 500), "ts": i * 25}
        out.append((f"{job}.orders", i % 2, json.dumps(order).encode()))
    return out


def drill_workload():
    """This pipeline's workload for ``spark-abs drill`` (``spark_abs_examples.check.drill_workload``)."""
    from spark_abs_examples import check

    return check.drill_workload(records, REFERENCE, KEYS)


# the output, computed in batch from the same topics (views named after the ingress topics' last part)
REFERENCE = f"""
SELECT c.country,
       CAST(FLOOR(o.ts / {WINDOW_MS}) * {WINDOW_MS} AS BIGINT) AS window_start,
       CAST(FLOOR(o.ts / {WINDOW_MS}) * {WINDOW_MS} + {WINDOW_MS} AS BIGINT) AS window_end,
       COUNT(*) AS orders,
       SUM(o.amount) AS revenue
FROM orders o JOIN customers c ON o.customer = c.id
WHERE o.amount > 0
GROUP BY c.country, FLOOR(o.ts / {WINDOW_MS})
"""
KEYS = ("country", "window_start")

"""Money in transit, the canonical example (docs/architecture/invariants.md, "Invariants"):
three stages on real Kafka, Spark and object storage.

    transfers (2 partitions) --> legs (2 tasks) --> accounts (2 tasks) --> windows (1 task) --> sink

- ``legs`` splits each transfer into its debit and its credit (stateless,
  ``transfer_legs``);
- ``accounts`` applies each leg to the balance of its account (keyed state,
  ``Balances``) and passes the leg on; a transfer's debit and credit usually
  go to different tasks, through Kafka;
- ``windows`` sums the legs per account and one-second event-time window
  (windowed state) and writes each closed window to the exactly-once sink.

Every transfer moves money, none creates it, so in every consistent snapshot
the balances in the ``accounts`` tasks' states (plus any legs recorded as
channel state) add up to zero (``money_in_checkpoint``).  The reference is
computed in batch by Spark SQL from the transfers topic (``money_reference``),
or in Python from the transfers themselves (``expected_output``).
``spark-abs demo`` runs it with a worker killed; ``spark-abs drill`` drills
it (``drill_workload``).

The operators are written as a user writes operators, on the public API of
``operators``: ``transfer_legs`` turns each transfer into a debit of its
source account and a credit of its target account; the stage routes each
leg to the task that owns its account, where ``Balances`` applies it.  While
a credit travels between tasks it is money in a channel, which is why a
consistent snapshot shows ``sum(balances in task states) + sum(credits in
channel state) = total``.  ``Balances`` is a keyed sum of signed deltas,
nothing more."""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from barriers.lineage import Lineage
from barriers.messages import ChannelId
from operators import (
    DeadLetters,
    KeyedAggregate,
    OperatorConfigError,
    Reason,
    Stateless,
    StateRestoreError,
    TumblingWindowAggregate,
    count,
    require_columns,
    row_index,
    sum_,
)
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.api.producing import end_input
from streaming.tools.checkpoints.inspection import channel_rows, classify_channel_records

__all__ = [
    "Balances",
    "TransferLegs",
    "transfer_legs",
    "TRANSFERS",
    "WINDOW_MS",
    "ApplyLegs",
    "pipeline",
    "kafka_pipeline",
    "make_transfers",
    "produce_transfers",
    "expected_output",
    "money_in_checkpoint",
    "drill_workload",
    "money_reference",
    "Money",
    "normalise",
    "normalise_rows",
    "row_key",
]


class Balances(KeyedAggregate):
    """Balance per account: the sum of the signed ``amount`` deltas applied
    to it.  ``process()`` returns ``(key, balance)`` for every account the
    batch touched, with its new balance.  A delta with a null amount is not
    money: it goes to the dead letters with reason ``null_value`` (and a null
    account with ``null_key``).

    State: ``{"state": table of (key, balance)}``."""

    # its dead letters are its input rows, which name the transfer they came from
    keeps_origin = True

    def __init__(
        self,
        key: str = "account",
        amount: str = "amount",
        *,
        balance: str = "balance",
        dead_letters: DeadLetters | None = None,
    ):
        if not (isinstance(amount, str) and amount):
            raise OperatorConfigError(f"Balances: amount must be a non-empty column name, got {amount!r}")
        super().__init__(key, {balance: sum_(amount)}, dead_letters=dead_letters)
        self.amount, self.balance_column = amount, balance

    def process(self, batch: pa.Table) -> pa.Table:
        require_columns(batch, [self.key, self.amount], type(self).__name__)
        if batch[self.amount].null_count:
            self.dead_letters.add(batch.filter(pc.is_null(batch[self.amount])), Reason.NULL_VALUE, type(self).__name__)
            batch = batch.filter(pc.is_valid(batch[self.amount]))
        return super().process(batch)

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        table = state.get(self.TABLE) if isinstance(state, Mapping) else None
        if (
            isinstance(table, pa.Table)
            and self.balance_column in table.column_names
            and table[self.balance_column].null_count
        ):
            raise StateRestoreError(f"Balances: snapshot has null balances in {self.balance_column!r}")
        super().restore(state)

    def total(self) -> int | float:
        """The sum of all balances (0 with no accounts)."""
        if len(self.state) == 0:
            return 0
        return pc.sum(self.state[self.balance_column]).as_py()

    def balance(self, account: object) -> int | float | None:
        """The balance of ``account``, or None if it was never touched."""
        if len(self.state) == 0:
            return None
        found = self.state.filter(
            pc.equal(self.state[self.key], pa.scalar(account, self.state.schema.field(self.key).type))
        )
        return found[self.balance_column][0].as_py() if found.num_rows else None

    def __repr__(self) -> str:
        return f"Balances(key={self.key!r}, amount={self.amount!r})"


class TransferLegs(Stateless):
    """Two rows per transfer, debit first: ``key`` = source account with
    ``-amount``, then ``key`` = target account with ``+amount``, and a
    ``leg`` column (``"debit"``/``"credit"``).  Other columns are kept; the
    source and target columns are dropped."""

    # each leg keeps its transfer's origin: a dead letter of a leg names the transfer
    keeps_origin = True

    def __init__(
        self,
        source: str = "source",
        target: str = "target",
        amount: str = "amount",
        *,
        key: str = "account",
        leg: str = "leg",
    ):
        names = {"source": source, "target": target, "amount": amount, "key": key, "leg": leg}
        for argument, value in names.items():
            if not (isinstance(value, str) and value):
                raise OperatorConfigError(f"transfer_legs: {argument} must be a non-empty column name, got {value!r}")
        if len({source, target, amount}) != 3 or len({key, leg, amount}) != 3:
            raise OperatorConfigError(f"transfer_legs: column names must differ, got {names}")
        self.source, self.target, self.amount, self.key, self.leg = source, target, amount, key, leg

    def process(self, batch: pa.Table) -> pa.Table:
        require_columns(batch, [self.source, self.target, self.amount], repr(self))
        n = batch.num_rows
        doubled = pc.divide(row_index(2 * n), 2)  # 0, 0, 1, 1, ...
        is_debit = pc.equal(pc.bit_wise_and(row_index(2 * n), 1), 0)
        rows = batch.take(doubled)
        account = pc.if_else(is_debit, rows[self.source], rows[self.target])
        amount = pc.if_else(is_debit, pc.negate_checked(rows[self.amount]), rows[self.amount])
        kept = [c for c in batch.column_names if c not in (self.source, self.target, self.amount, self.key, self.leg)]
        out = rows.select(kept)
        out = out.append_column(self.key, account).append_column(self.amount, amount)
        return out.append_column(self.leg, pc.if_else(is_debit, "debit", "credit"))

    def __repr__(self) -> str:
        return f"transfer_legs({self.source!r} -> {self.target!r}, {self.amount!r})"


def transfer_legs(
    source: str = "source", target: str = "target", amount: str = "amount", *, key: str = "account", leg: str = "leg"
) -> TransferLegs:
    """Split each transfer row into its debit and credit legs (see TransferLegs)."""
    return TransferLegs(source, target, amount, key=key, leg=leg)


TRANSFERS = pa.schema(
    [("id", pa.int64()), ("source", pa.string()), ("target", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())]
)
WINDOW_MS = 1_000
STEP_MS = 10  # event time between two transfers


class ApplyLegs(Balances):
    """Balances that pass the legs on: each leg changes its account's balance
    and goes downstream unchanged (the output does not depend on how the
    input was cut into batches)."""

    def process(self, batch: pa.Table) -> pa.Table:
        super().process(batch)
        return batch


def _windows() -> TumblingWindowAggregate:
    # windows close when the watermark of every input passed them (event time is the engine's)
    return TumblingWindowAggregate("account", "ts", WINDOW_MS, {"net": sum_("amount"), "legs": count()})


def pipeline(
    job: str = "money-demo",
    *,
    partitions: int = 2,
    legs_tasks: int = 2,
    account_tasks: int = 2,
    sink: Sink | None = None,
) -> Pipeline:
    return Pipeline(
        job,
        (Ingress(f"{job}.transfers", partitions, TRANSFERS, event_time="ts"),),
        (
            Stage("legs", (f"{job}.transfers",), lambda: transfer_legs(), parallelism=legs_tasks, key="account"),
            Stage(
                "accounts", ("legs",), lambda: ApplyLegs("account", "amount"), parallelism=account_tasks, key="account"
            ),
            Stage("windows", ("accounts",), _windows, key="account", sink=sink or Sink()),
        ),
    )


# the windows as Avro records, for a Kafka sink that registers its schema (kafka_pipeline(avro=True))
WINDOWS_AVRO = {
    "type": "record",
    "name": "Window",
    "namespace": "money",
    "fields": [
        {"name": "account", "type": "string"},
        {"name": "window_start", "type": "long"},
        {"name": "window_end", "type": "long"},
        {"name": "net", "type": "long"},
        {"name": "legs", "type": "long"},
    ],
}


def kafka_pipeline(job: str = "money-demo", *, avro: bool = False) -> Pipeline:
    """The demo with its windows committed to the Kafka topic ``<job>.windows`` in transactions:
    JSON, or with ``avro`` Avro records of ``WINDOWS_AVRO`` in the Confluent wire format, the
    schema registered under ``<job>.windows-value`` in the schema registry."""
    return pipeline(job, sink=Sink("kafka", f"{job}.windows", avro=WINDOWS_AVRO if avro else None))


def make_transfers(count_: int, *, accounts: int = 10, seed: int = 7) -> list[dict]:
    """``count_`` transfers between ``accounts`` accounts; event time grows with the id."""
    rng = random.Random(seed)
    names = [f"acct-{i:02d}" for i in range(accounts)]
    transfers = []
    for i in range(count_):
        source, target = rng.sample(names, 2)
        transfers.append(
            {"id": i, "source": source, "target": target, "amount": rng.randint(1, 500), "ts": i * STEP_MS}
        )
    return transfers


def produce_transfers(
    kafka: KafkaAccess, topic: str, transfers: list[dict], partitions: int, *, end: bool = True
) -> None:
    """Write the transfers (transfer i to partition i mod ``partitions``, so
    event time grows within each partition), then, with ``end``, the end of
    the input on every partition (``streaming.end_input``)."""
    from streaming.adapters.kafka import clients as kafka_clients

    producer = kafka_clients.raw_producer(kafka, acks="all", linger_ms=20)
    try:
        for transfer in transfers:
            producer.send(
                topic,
                value=json.dumps(transfer).encode(),
                key=transfer["source"].encode(),
                partition=transfer["id"] % partitions,
            )
        if end:
            end_input(producer, topic, partitions)
        producer.flush(60)
    finally:
        producer.close()


def expected_output(transfers: list[dict]) -> list[dict]:
    """The windows output computed directly from the transfers."""
    windows: dict[tuple[str, int], list[int]] = collections.defaultdict(lambda: [0, 0])
    for t in transfers:
        start = t["ts"] // WINDOW_MS * WINDOW_MS
        for account, amount in ((t["source"], -t["amount"]), (t["target"], t["amount"])):
            windows[(account, start)][0] += amount
            windows[(account, start)][1] += 1
    return sorted(
        (
            {"account": a, "window_start": s, "window_end": s + WINDOW_MS, "net": n, "legs": c}
            for (a, s), (n, c) in windows.items()
        ),
        key=row_key,
    )


def row_key(row: Mapping) -> tuple:
    return (row["account"], row["window_start"])


_COLUMNS = ("account", "window_start", "window_end", "net", "legs")


def normalise(table: pa.Table | None) -> list[dict]:
    """Committed window rows in a canonical order, to compare runs."""
    return [] if table is None else normalise_rows(table.to_pylist())


def normalise_rows(rows: list[Mapping]) -> list[dict]:
    return sorted(({c: row[c] for c in _COLUMNS} for row in rows), key=row_key)


@dataclass(frozen=True)
class Money:
    checkpoint_id: int
    balances: int
    in_flight: int
    accounts: int

    @property
    def total(self) -> int:
        return self.balances + self.in_flight


def money_in_checkpoint(
    store, checkpoint_id: int, read_range: Callable[[ChannelId, int, int], pa.Table] | None = None
) -> Money:
    """Sum of the balances in the ``accounts`` tasks' snapshots of a checkpoint,
    plus the amounts of the legs that are their channel state: copied into
    the snapshot, or (a range) read back from Kafka with ``read_range``."""
    manifest = store.read_manifest(checkpoint_id)
    balances = in_flight = accounts = 0
    for task in manifest.tasks:
        if not task.startswith("accounts-"):
            continue
        loaded = store.load_task(checkpoint_id, task)
        for table in loaded.state.values():
            if "balance" in table.column_names and table.num_rows:
                balances += pc.sum(table["balance"]).as_py() or 0
                accounts += table.num_rows
        records = dict(loaded.channel_records)
        lineage = Lineage.from_json(loaded.snapshot.metadata.get("lineage"))
        for channel, (start, end) in loaded.snapshot.in_flight.items():
            if channel not in records:
                if read_range is None:
                    raise ValueError(
                        f"checkpoint {checkpoint_id} task {task}: channel {channel} has in-flight "
                        f"records [{start}, {end}) kept as a range; give read_range to count them"
                    )
                records[channel] = read_range(ChannelId.parse(channel), start, end)
        for channel, table in records.items():
            in_flight += _amounts(table, ChannelId.parse(channel), loaded.snapshot.generation, lineage)
    return Money(checkpoint_id, balances, in_flight, accounts)


def drill_workload(*, accounts: int = 10, malformed_every: int = 997):
    """The money pipeline's ``streaming.tools.drill.workload.DrillWorkload``
    (``spark-abs drill``'s protocol): transfers between ``accounts``
    accounts, ``STEP_MS`` of event time apart, one record in
    ``malformed_every`` not JSON; the reference computed by Spark from the
    transfers topic (``money_reference``); every checkpoint must conserve
    money (``money_in_checkpoint``)."""
    from streaming.tools.drill.workload import DrillWorkload, InputRecord

    def records(pipeline: Pipeline, rng: random.Random):
        ingress = pipeline.ingress[0]
        names = [f"acct-{i:02d}" for i in range(accounts)]
        i = 0
        while True:
            partition = i % ingress.partitions
            if rng.randrange(malformed_every) == 0:
                yield InputRecord(ingress.topic, partition, b"{not json: %d" % i, malformed=True)
            source, target = rng.sample(names, 2)
            transfer = {"id": i, "source": source, "target": target, "amount": rng.randint(1, 500), "ts": i * STEP_MS}
            yield InputRecord(ingress.topic, partition, json.dumps(transfer).encode(), key=source.encode())
            i += 1

    def conserved(store, checkpoint_id: int, read_range: Callable) -> int:
        return money_in_checkpoint(store, checkpoint_id, read_range).total

    def output(table: pa.Table):
        import pandas as pd

        return pd.DataFrame(normalise(table), columns=list(_COLUMNS))

    return DrillWorkload(
        records,
        money_reference,
        ("account", "window_start"),
        ("net", "legs"),
        conserved=conserved,
        output=output,
        poison_ready=True,
    )


def money_reference(spark, pipeline: Pipeline, kafka: KafkaAccess):
    """The money pipeline's windows, computed in batch by Spark from the
    transfers topic: every JSON transfer's two legs, summed per account and
    one-second window (records that are not transfers are left out, as the
    pipeline sends them to the dead letters)."""
    from pyspark.sql import functions as F

    from streaming.tools.drill.workload import POISON_FILTER

    topic = pipeline.ingress[0].topic
    raw = (
        spark.read.format("kafka")
        .options(**kafka.spark_options())
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
    )
    schema = "id BIGINT, source STRING, target STRING, amount BIGINT, ts BIGINT"
    transfers = (
        raw.where(POISON_FILTER)  # records a drill sent to be dead letters (its poison kind): no transfers
        .select(F.from_json(F.col("value").cast("string"), schema).alias("t"))
        .select("t.*")
        .where("id IS NOT NULL AND source IS NOT NULL AND target IS NOT NULL AND amount IS NOT NULL AND ts IS NOT NULL")
    )
    legs = transfers.select(F.col("source").alias("account"), (-F.col("amount")).alias("amount"), "ts").unionByName(
        transfers.select(F.col("target").alias("account"), "amount", "ts")
    )
    start = (F.floor(F.col("ts") / WINDOW_MS) * WINDOW_MS).cast("long")
    windows = (
        legs.groupBy("account", start.alias("window_start"))
        .agg(F.sum("amount").alias("net"), F.count("*").alias("legs"))
        .withColumn("window_end", F.col("window_start") + WINDOW_MS)
        .select("account", "window_start", "window_end", "net", "legs")
    )
    return windows.toPandas()


def _amounts(records: pa.Table, channel: ChannelId, generation: int, lineage: Lineage) -> int:
    """The money in raw leg records that are channel state: control and
    watermark records carry none, and stale records of older generations are
    not channel state (the task skips them)."""
    problems: list[str] = []
    rows = channel_rows(classify_channel_records(records, channel, generation, lineage), problems)
    if problems:
        raise ValueError(f"channel {channel}: in-flight records that do not decode: {problems[:3]}")
    if "amount" not in rows.column_names:
        return 0
    return pc.sum(rows["amount"]).as_py() or 0

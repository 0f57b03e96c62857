"""The demo: money in transit (docs/architecture.md, "Invariants"), three stages on real Kafka, Spark
and object storage, with the worker running a stage killed and the job restored.

    transfers (2 partitions) --> legs (2 tasks) --> accounts (2 tasks) --> windows (1 task) --> sink

- ``legs`` splits each transfer into its debit and its credit (stateless);
- ``accounts`` applies each leg to the balance of its account (keyed state)
  and passes the leg on; a transfer's debit and credit usually go to
  different tasks, through Kafka;
- ``windows`` sums the legs per account and one-second event-time window
  (windowed state) and writes each closed window to the exactly-once sink.

Every transfer moves money, none creates it, so in every consistent snapshot
the balances in the ``accounts`` tasks' states (plus any legs recorded as
channel state) add up to zero.  The demo checks that for every completed
checkpoint, and at the end compares the committed output with what the
transfers give when computed directly (a run without failures)."""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from barriers.coordinator import CheckpointStatus
from barriers.lineage import Lineage
from barriers.messages import ChannelId
from operators import TumblingWindowAggregate, count, sum_
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.api.producing import end_input
from streaming.api.settings import IN_FLIGHT_FORMATS, MODES, WORKER_LAYOUTS, JobSettings, Mode
from streaming.tools.checkpoints import channel_rows, classify_channel_records
from streaming.tools.commands import add_state_snapshot_options
from streaming.tools.money import Balances, transfer_legs
from streaming.tools.views import as_text, titled_table

__all__ = [
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
    "main",
]

log = logging.getLogger(__name__)

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


def kafka_pipeline(job: str = "money-demo") -> Pipeline:
    """The demo with its windows committed to the Kafka topic ``<job>.windows`` in transactions."""
    return pipeline(job, sink=Sink("kafka", f"{job}.windows"))


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


def produce_transfers(bootstrap: str, topic: str, transfers: list[dict], partitions: int, *, end: bool = True) -> None:
    """Write the transfers (transfer i to partition i mod ``partitions``, so
    event time grows within each partition), then, with ``end``, the end of
    the input on every partition (``streaming.end_input``)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
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
        key=_row_key,
    )


def _row_key(row: Mapping) -> tuple:
    return (row["account"], row["window_start"])


_COLUMNS = ("account", "window_start", "window_end", "net", "legs")


def normalise(table: pa.Table | None) -> list[dict]:
    """Committed window rows in a canonical order, to compare runs."""
    return [] if table is None else normalise_rows(table.to_pylist())


def normalise_rows(rows: list[Mapping]) -> list[dict]:
    return sorted(({c: row[c] for c in _COLUMNS} for row in rows), key=_row_key)


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
    """The money pipeline's ``streaming.tools.drill_workload.DrillWorkload``
    (``spark-abs drill``'s protocol): transfers between ``accounts``
    accounts, ``STEP_MS`` of event time apart, one record in
    ``malformed_every`` not JSON; the reference computed by Spark from the
    transfers topic (``money_reference``); every checkpoint must conserve
    money (``money_in_checkpoint``)."""
    from streaming.tools.drill_workload import DrillWorkload, InputRecord

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
        records, money_reference, ("account", "window_start"), ("net", "legs"), conserved=conserved, output=output
    )


def money_reference(spark, pipeline: Pipeline, bootstrap: str):
    """The money pipeline's windows, computed in batch by Spark from the
    transfers topic: every JSON transfer's two legs, summed per account and
    one-second window (records that are not transfers are left out, as the
    pipeline sends them to the dead letters)."""
    from pyspark.sql import functions as F

    topic = pipeline.ingress[0].topic
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    schema = "id BIGINT, source STRING, target STRING, amount BIGINT, ts BIGINT"
    transfers = (
        raw.select(F.from_json(F.col("value").cast("string"), schema).alias("t"))
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


@dataclass
class DemoReport:
    mode: Mode
    job: str
    transfers: int
    money: list[Money]
    restores: list
    output_rows: int
    expected_rows: int
    output_matches: bool
    dead_letters: int
    checkpoints: list

    lost: int = 0

    @property
    def passed(self) -> bool:
        if self.mode is Mode.AT_LEAST_ONCE:  # replay may duplicate; nothing may be lost
            return self.lost == 0
        return self.output_matches and bool(self.money) and all(m.total == 0 for m in self.money)

    def render(self) -> str:
        money = {m.checkpoint_id: m for m in self.money}
        rows = []
        for record in self.checkpoints:
            m = money.get(record.checkpoint_id)
            seconds = f"{record.duration_s:.2f}" if record.duration_s is not None else None
            if m is None:
                status, reason = str(record.status), record.reason or None
                if record.status is CheckpointStatus.PENDING:  # triggered, then the job was stopped: never finished
                    status, reason = "stopped", "the job stopped before it completed"
                rows.append((record.checkpoint_id, status, seconds, None, None, None, reason))
            else:
                conserved = "yes" if m.total == 0 else f"NO: {m.total}"
                rows.append(
                    (record.checkpoint_id, str(record.status), seconds, m.balances, m.in_flight, m.accounts, conserved)
                )
        table = titled_table(
            f"job {self.job}: {self.transfers} transfers",
            ("checkpoint", "status", "seconds", "balances", "in flight", "accounts", "money conserved"),
            rows,
            right=("checkpoint", "seconds", "balances", "in flight", "accounts"),
        )
        lines = [as_text(table)]
        lines.append("")
        for restore in self.restores:
            origin = f"checkpoint {restore.checkpoint_id}" if restore.checkpoint_id else "the beginning"
            lines.append(f"restore: generation {restore.generation} from {origin} ({restore.reason})")
        lines.append(
            f"output: {self.output_rows} window rows committed, {self.expected_rows} expected from a "
            f"run without failures: {'identical' if self.output_matches else 'DIFFERENT'}"
        )
        if self.mode is Mode.AT_LEAST_ONCE:
            lines.append(f"at-least-once: replay may duplicate legs; windows missing legs: {self.lost}")
        lines.append(f"dead letters: {self.dead_letters}")
        return "\n".join(lines)


def run_demo(
    connection,
    *,
    store_uri: str,
    transfers: int = 2000,
    kill: str | None = "accounts",
    mode: Mode | str = Mode.ALIGNED,
    job: str | None = None,
    faults: str = "",
    interval_s: float = 1.0,
    timeout_s: float = 300.0,
    chunks: int = 2,
    workers: Mapping[str, list[str]] | str | None = None,
    **settings,
) -> DemoReport:
    """Run the demo on ``connection`` (see the module docstring): the
    transfers go in ``chunks`` parts, each after a checkpoint completed; with
    ``kill``, that worker is SIGKILLed after the first checkpoint; ``faults``
    arms ``SPARK_ABS_FAULT`` in the workers.  Its progress is logged (INFO)."""
    import uuid

    from streaming.engine.operations import run_until_caught_up

    job = job or f"money-demo-{uuid.uuid4().hex[:6]}"
    job_settings = JobSettings(store=store_uri, mode=mode, interval_s=interval_s, **settings)
    check = _MoneyCheck(connection, store_uri, job)
    runner = _demo_runner(connection, job_settings, job, faults, check, workers)
    data = make_transfers(transfers)
    deadline = time.monotonic() + timeout_s
    try:
        runner.prepare()
        _feed_in_chunks(
            runner,
            connection,
            data,
            chunks,
            kill=kill,
            money=check.money,
            deadline=deadline,
            checkpoints=f"{job_settings.mode} checkpoints every {interval_s:g} s",
        )
        run_until_caught_up(runner, max(1.0, deadline - time.monotonic()))
    finally:
        runner.close()
    return _demo_report(runner, connection, job_settings, data, check)


class _MoneyCheck:
    """``on_complete`` of the demo's job: the money in each checkpoint
    completed (``money``), counted and logged."""

    def __init__(self, connection, store_uri: str, job: str):
        from streaming.adapters.objects import open_store
        from streaming.adapters.snapshots import SnapshotStore

        self.connection = connection
        self.reader = SnapshotStore(open_store(store_uri, connection), job)
        self.money: list[Money] = []

    def __call__(self, checkpoint_id: int) -> None:
        from streaming.adapters.kafka_io import read_range

        connection = self.connection
        m = money_in_checkpoint(
            self.reader, checkpoint_id, lambda c, a, b: read_range(connection.kafka_bootstrap, c, a, b)
        )
        self.money.append(m)
        log.info(
            f"checkpoint {checkpoint_id}: balances {m.balances:+d}, in flight {m.in_flight:+d} -> "
            + ("money conserved" if m.total == 0 else f"MONEY NOT CONSERVED ({m.total:+d})")
        )


def _demo_runner(connection, job_settings: JobSettings, job: str, faults: str, check: _MoneyCheck, workers):
    from streaming.engine.faults import ENV as FAULT_ENV
    from streaming.engine.runner import JobRunner

    return JobRunner(
        "streaming.tools.demo:pipeline",
        job_settings,
        connection,
        job=job,
        worker_env={FAULT_ENV: faults} if faults else None,
        on_complete=check,
        workers=workers,
    )


def _feed_in_chunks(
    runner,
    connection,
    data: list[dict],
    chunks: int,
    *,
    kill: str | None,
    money: list[Money],
    deadline: float,
    checkpoints: str,
) -> None:
    """The transfers in ``chunks`` parts, each after a checkpoint completed
    (the last with the end of input); the job started after the first, and
    worker ``kill`` SIGKILLed after the first checkpoint."""
    from streaming.engine.operations import kill_worker

    ingress = runner.pipeline.ingress[0]
    parts = [data[i * len(data) // chunks : (i + 1) * len(data) // chunks] for i in range(chunks)]
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        log.info(f"producing {len(part)} transfers to {ingress.topic}" + (" and the end of input" if last else ""))
        produce_transfers(connection.kafka_bootstrap, ingress.topic, part, ingress.partitions, end=last)
        if index == 0:
            log.info(f"starting job {runner.job}: {len(runner.groups)} worker processes ({checkpoints})")
            runner.start()
        if last:
            break
        seen = len(money)
        while len(money) == seen and time.monotonic() < deadline:
            runner.step()
        if index == 0 and kill:
            worker = runner.supervisor.worker_of(kill)
            log.info(f"killing worker {worker.name!r} (tasks {', '.join(worker.tasks)}) with SIGKILL")
            kill_worker(runner, kill)


def _demo_report(runner, connection, job_settings: JobSettings, data: list[dict], check: _MoneyCheck) -> DemoReport:
    """The committed output against the expected, the dead letters and the money of every checkpoint."""
    from streaming.adapters.kafka_admin import end_offsets
    from streaming.adapters.kafka_io import dead_letter_topic_name
    from streaming.adapters.sinks import read_committed_output, sink_location

    job = runner.job
    output = normalise(read_committed_output(sink_location(job_settings, job, connection)))
    expected = expected_output(data)
    dead = sum(end_offsets(connection.kafka_bootstrap, dead_letter_topic_name(job), 1).values())
    check.reader.close()
    got = {_row_key(r): r["legs"] for r in output}
    lost = sum(1 for r in expected if got.get(_row_key(r), 0) < r["legs"])
    return DemoReport(
        job_settings.mode,
        job,
        len(data),
        check.money,
        runner.restores,
        len(output),
        len(expected),
        output == expected,
        dead,
        runner.checkpoints(),
        lost,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-abs demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transfers", type=int, default=2000, help="transfers to produce (default 2000)")
    mode, in_flight = JobSettings.default("mode"), JobSettings.default("in_flight").value
    parser.add_argument(
        "--mode",
        default=mode,
        choices=MODES,
        help=f"checkpoint mode (default {mode}; {Mode.ALIGNED_TIMEOUT} switches after 200 ms)",
    )
    parser.add_argument(
        "--in-flight",
        default=in_flight,
        choices=IN_FLIGHT_FORMATS,
        help=f"unaligned channel state: offset ranges or copied records (default {in_flight})",
    )
    parser.add_argument(
        "--kill",
        default="accounts",
        help="SIGKILL the worker running this stage after the first checkpoint; 'none' for no failure "
        "(default accounts)",
    )
    parser.add_argument(
        "--workers",
        default="one",
        choices=WORKER_LAYOUTS,
        help="one worker process (one Spark application) for the job, or one per stage (default one)",
    )
    parser.add_argument("--store", help="snapshot store URI (default file://<home>/demo-store)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints (default 1)")
    add_state_snapshot_options(parser, base_every=False)
    args = parser.parse_args(argv)
    import os

    from streaming import console
    from streaming.api.config import Connection, default_home
    from streaming.local import LocalRuntime

    console.install("[demo] ")
    connection = Connection.from_env(os.environ) or LocalRuntime(progress=log.info).up()
    store = args.store or f"file://{default_home() / 'demo-store'}"
    extra = {"alignment_timeout_ms": 200} if args.mode == Mode.ALIGNED_TIMEOUT else {}
    report = run_demo(
        connection,
        store_uri=store,
        transfers=args.transfers,
        mode=args.mode,
        kill=None if args.kill == "none" else args.kill,
        workers=args.workers,
        interval_s=args.interval,
        in_flight=args.in_flight,
        state_snapshots=args.state_snapshots,
        **extra,
    )
    print()
    print(report.render())
    return 0 if report.passed else 1

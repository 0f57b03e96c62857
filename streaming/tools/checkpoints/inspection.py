"""Looking inside a job's checkpoints: the Python API behind ``spark-abs
checkpoints list|show|diff|verify``, ``spark-abs state`` and ``spark-abs
restore --dry-run`` (``streaming.tools.checkpoints.gc`` keeps the store tidy).

A checkpoint is Parquet and JSON in a documented layout
(``streaming.adapters.snapshots``), so everything here is a read of those
files, every part checked against its checksum:

- ``detail(n)``: the manifest in words: what each task's checkpoint turned
  out to be, its timings, state tables, in-flight channels and watermarks;
- ``state(n)``: operator state tables as Arrow, one per table name, the
  task as a column;
- ``channel_state(n)``: unaligned channel state, one row per Kafka record,
  copied records and ranges read back from Kafka alike (``held``), each
  marked with the generation that wrote it and whether it is stale (records
  an older generation wrote after a restore's cut are not channel state),
  plus the rows those records carry, decoded;
- ``diff(a, b)``: which keys' state changed between two checkpoints (a
  table that names no key columns: which rows were added and removed);
- ``restore_plan(n)``: which checkpoint a restore picks, which generation it
  starts and what each task loads and replays; ``rescale_plan`` and
  ``change_plan``: a restore at other task counts, or into a changed pipeline.

``to_spark`` turns any of these tables into a Spark DataFrame, to be queried
with SQL.

``Checkpoints`` is the one handle; each job is a class of its own:
``CheckpointList`` (``listing``), ``checkpoint_detail``
(``detail``), ``StateTables`` (``state``),
``ChannelStateReader`` (``channels``) and ``RestorePlanner``
(``plans``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow as pa

from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore
from streaming.adapters.snapshots.jobs import jobs_in
from streaming.adapters.snapshots.signing import UNSIGNED, Unsigned
from streaming.api.config import ENV, Connection, KafkaAccess
from streaming.api.job_key import JobKey, read_secret_file
from streaming.api.pipeline import Pipeline
from streaming.engine.restore.changes import AllowDropped, PipelineChange
from streaming.engine.restore.rescale import RescalePlan
from streaming.errors import ConfigError, SnapshotCorruptError, names_like
from streaming.tools.checkpoints.channels import (
    ChannelState,
    ChannelStateReader,
    channel_rows,
    classify_channel_records,
)
from streaming.tools.checkpoints.detail import CheckpointDetail, TaskDetail, checkpoint_detail
from streaming.tools.checkpoints.listing import CheckpointList, CheckpointRow
from streaming.tools.checkpoints.plans import RestorePlanner, RestorePreview, TaskPlan
from streaming.tools.checkpoints.state import StateTables, TableDiff, state_keys

__all__ = [
    "Checkpoints",
    "CheckpointRow",
    "CheckpointDetail",
    "TaskDetail",
    "ChannelState",
    "TableDiff",
    "RestorePreview",
    "TaskPlan",
    "classify_channel_records",
    "channel_rows",
    "state_keys",
    "to_spark",
]

log = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoints of job ``job`` in ``store`` (a ``SnapshotStore``);
    ``kafka`` is the Kafka cluster channel-state ranges are read back
    from (without it, ranges are reported, not read).

    One job: the handle the command line and users hold.  Each method hands
    its work to the part that does it: ``listing``, ``tables`` (state),
    ``channels`` (channel state) and ``planner`` (restores)."""

    def __init__(self, store: SnapshotStore, *, kafka: KafkaAccess | None = None):
        self.store = store
        self.job = store.job
        self.kafka = kafka
        self.listing = CheckpointList(store)
        self.tables = StateTables(store)
        self.channels = ChannelStateReader(store, kafka)
        self.planner = RestorePlanner(store, kafka)

    @classmethod
    def open(cls, uri: str, job: str, connection: Connection | None = None, *, existing: bool = False) -> Checkpoints:
        """``uri`` is the store (``file:///dir`` or ``s3://bucket/prefix``);
        ``connection`` reaches S3 and Kafka.  With ``existing`` (the commands
        that look at a job) a store or job that does not exist is a
        ``ConfigError`` naming the jobs the store has, and nothing is made."""
        location = open_store(uri, connection, create=not existing)
        if existing:
            jobs = jobs_in(location)
            if job not in jobs:
                has = (
                    names_like(job, jobs, "jobs in the store") if jobs else "it holds no job at all (is --store right?)"
                )
                raise ConfigError(f"job {job!r} has no history or checkpoints in store {location.uri}; {has}")
        store = SnapshotStore(location, job, key=_store_key(job, connection))
        return cls(store, kafka=connection.kafka if connection else None)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- listing and verifying ----------------------------------------------

    def rows(self, *, checksums: bool = True) -> list[CheckpointRow]:
        """Every checkpoint of the job, ascending, each verified."""
        return self.listing.rows(checksums=checksums)

    def generation(self) -> int | None:
        """The job's current generation (None: the store has never seen the job)."""
        return self.listing.generation()

    def verify(
        self,
        checkpoint_id: int | None = None,
        *,
        checksums: bool = True,
        progress: Callable[[str], None] = lambda _: None,
    ) -> dict[int, list[str]]:
        """Problems per complete checkpoint (``checkpoint_id``, or every one);
        an empty list means it verifies.  A checkpoint that is not complete
        raises SnapshotMissingError."""
        return self.listing.verify(checkpoint_id, checksums=checksums, progress=progress)

    # -- one checkpoint ------------------------------------------------------

    def detail(self, checkpoint_id: int) -> CheckpointDetail:
        manifest, problems = self.store.verifier.verify(checkpoint_id)  # the manifest read once
        if manifest is None:
            raise SnapshotCorruptError(problems[0])
        return checkpoint_detail(manifest, problems)

    def state(self, checkpoint_id: int, *, task: str | None = None, table: str | None = None) -> dict[str, pa.Table]:
        """Operator state by table name, the rows of every task (or ``task``)
        with a ``task`` column first; only ``table`` when given."""
        return self.tables.state(checkpoint_id, task=task, table=table)

    def channel_state(
        self, checkpoint_id: int, *, task: str | None = None, progress: Callable[[str], None] = lambda _: None
    ) -> ChannelState:
        """The checkpoint's channel state (see ``ChannelState``): copied records
        as stored, ranges read back from Kafka while it still holds them."""
        return self.channels.read(checkpoint_id, task=task, progress=progress)

    def diff(self, a: int, b: int, *, table: str | None = None, sample: int = 10) -> list[TableDiff]:
        """How each task's state tables changed from checkpoint ``a`` to ``b``, by key."""
        return self.tables.diff(a, b, table=table, sample=sample)

    def restore_plan(
        self, checkpoint_id: int | None = None, *, progress: Callable[[str], None] = lambda _: None
    ) -> RestorePreview:
        """What ``run --restore`` would do now: the checkpoint it picks
        (``checkpoint_id`` if it verifies, else the newest that does), the
        generation it starts and what every task loads and replays."""
        return self.planner.restore_plan(checkpoint_id, progress=progress)

    def rescale_plan(
        self,
        pipeline: Pipeline,
        parallelism: Mapping[str, int],
        checkpoint_id: int | None = None,
        *,
        progress: Callable[[str], None] = lambda _: None,
    ) -> RescalePlan:
        """What ``run --restore N --parallelism ...`` would do with checkpoint
        ``checkpoint_id`` (or the newest that verifies): the state, channels
        and re-routed channel state of every task at the new task counts.
        Reads ranges from Kafka, writes nothing."""
        return self.planner.rescale_plan(pipeline, parallelism, checkpoint_id, progress=progress)

    def change_plan(
        self,
        pipeline: Pipeline,
        checkpoint_id: int | None = None,
        *,
        allow: AllowDropped | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ) -> PipelineChange:
        """What ``run --restore`` of ``pipeline`` as its code now declares it
        would do with checkpoint ``checkpoint_id`` (or the newest that
        verifies): each stage kept, added, removed, ..., and what is refused."""
        return self.planner.change_plan(pipeline, checkpoint_id, allow=allow, progress=progress)


def to_spark(spark, table: pa.Table, *, view: str | None = None):
    """``table`` as a Spark DataFrame (registered as temporary view ``view``
    when given), to be queried with Spark SQL."""
    frame = spark.createDataFrame(table.replace_schema_metadata(None))
    if view:
        frame.createOrReplaceTempView(view)
    return frame


def _store_key(job: str, connection: Connection | None) -> bytes | Unsigned:
    """Job ``job``'s store key, from the connection's job secret or, for a
    store read without a connection, ``SPARK_ABS_JOB_SECRET`` or
    ``SPARK_ABS_JOB_SECRET_FILE``; ``UNSIGNED`` without any (the job's files are
    then read without checking their signatures, which ``--verbose`` says)."""
    if connection is not None and (connection.job_secret or connection.job_secret_file):
        return connection.store_key(job)
    if os.environ.get(ENV["job_secret"]):
        return JobKey.store_key(os.environ[ENV["job_secret"]], job)
    if os.environ.get(ENV["job_secret_file"]):
        secret = read_secret_file(Path(os.environ[ENV["job_secret_file"]]), ENV["job_secret_file"])
        return JobKey.store_key(secret, job)
    log.debug(
        "no job secret (%s or %s): job %s's files in the store are read without checking their signatures",
        ENV["job_secret"],
        ENV["job_secret_file"],
        job,
    )
    return UNSIGNED

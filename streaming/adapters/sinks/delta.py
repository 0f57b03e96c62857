"""The Delta Lake sink, exactly once: each epoch appended by delta-rs in one
commit with the task's application transaction at the epoch's number (a
commit again writes nothing), rows naming their task and epoch
(``DELTA_COLUMNS``), output after a restored checkpoint deleted.
``read_delta_output`` reads the table without the sink's columns.

Each commit that sets the transaction's version also carries, in its
commit info, the version, the job's generation that set it and their
signature under the job's key (``abs.txn``, ``abs.txn.gen``,
``abs.txn.sig``).  Within a generation the sink only raises the version;
a restore's new generation may set it back (taking later epochs back).
So the newest signed commit of the sink's transaction must carry the
highest (generation, version) of all its signed commits, and the version
the table reports.  Before the sink takes an epoch as committed because the
table's version says so, it checks that; when it does not hold, someone
without the key wrote the table's log (a version raised, so that every later
epoch would look committed and be dropped; or an older signed commit copied,
setting the version back to one a restore took back), and the sink stops
with a ``SinkError`` naming the version, instead of losing epochs.  A
restore's take-back reads the version unchecked: a sink task idle for long
has its last signed commit past the newest ``_VOUCHING_COMMITS``, and must
not fail every restore for that."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError

from barriers.headers import EPOCH_HEADER
from barriers.messages import Unsigned
from streaming.adapters.objects import StoreLocation
from streaming.adapters.sinks.base import TwoPhaseSink, signing_key
from streaming.api.config import Connection
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Sink
from streaming.errors import ConfigError, SinkError, StoreError
from streaming.waits import WaitTimeout, retry

__all__ = ["DeltaSink", "delta_storage_options", "delta_table_uri", "read_delta_output", "DELTA_COLUMNS"]

log = logging.getLogger(__name__)


# the columns a Delta sink adds to every row: the sink task and the epoch that wrote it
DELTA_COLUMNS = ("_abs_task", "_abs_epoch")


# the commit info members that vouch for a transaction's version (DeltaSink._vouching)
TXN_MEMBER, TXN_GENERATION_MEMBER, TXN_SIGNATURE_MEMBER = "abs.txn", "abs.txn.gen", "abs.txn.sig"
# how far back in the table's history the commit that set a version is looked for
_VOUCHING_COMMITS = 2000


# Delta commits that lose a race with another task's commit (delta-rs retries plain appends
# itself; a delete meeting a concurrent append is refused) are tried again this often
_DELTA_ATTEMPTS = 5


def delta_storage_options(table_uri: str, connection: Connection | None) -> dict[str, str]:
    """How delta-rs reaches the table at ``table_uri``: on the job's S3
    server for an ``s3://`` table (none needed for a local path).  Commits
    are put-if-absent (``If-None-Match``), which the local S3 server honours:
    tasks committing at once each get their own table version."""
    if connection is None or not table_uri.startswith("s3://"):
        return {}
    endpoint = urlparse(connection.s3_endpoint)
    return {
        "AWS_ENDPOINT_URL": connection.s3_endpoint,
        "AWS_ACCESS_KEY_ID": connection.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": connection.s3_secret_key,
        "AWS_REGION": connection.s3_region,
        "AWS_ALLOW_HTTP": str(endpoint.scheme == "http").lower(),
    }


def delta_table_uri(sink: Sink, location: StoreLocation) -> str:
    """Where a Delta sink writes: its ``table``, or ``<sink location>/table``.
    A local path is made absolute (delta-rs and Spark read it alike)."""
    uri = sink.table or f"{location.uri}/table"
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return str(Path(parsed.path if parsed.scheme else uri).expanduser().resolve())
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ConfigError(f"delta sink table {uri!r}: give s3://bucket/path or a local path")
    return uri


class DeltaSink(TwoPhaseSink):
    """Each epoch's rows appended to the Delta table at ``table_uri`` in one
    commit carrying the application transaction ``app_id`` at the epoch's
    number; ``_abs_task`` (``<job>/<task>``) and ``_abs_epoch`` added to every row."""

    def __init__(
        self,
        staging: StoreLocation,
        task_id: str,
        *,
        table_uri: str,
        app_id: str,
        storage_options: dict[str, str],
        key: JobKey | Unsigned,
        generation: int,
        writer: str | None = None,
    ):
        super().__init__(staging, task_id)
        self.table_uri = table_uri
        self.app_id = app_id
        # signs each version of the transaction it sets (UNSIGNED, said explicitly: tests only)
        self._key = signing_key(key, "Delta")
        self.generation = generation  # the job's generation this sink writes in
        # (the table's log version, the transaction's version) last found vouched for
        self._vouched: tuple[int, int] | None = None
        # what the rows' _abs_task says: the job and the task, so that tables shared by jobs keep them apart
        self.writer = writer or task_id
        self._options = storage_options
        self._table: DeltaTable | None = None

    def _loaded(self) -> DeltaTable | None:
        """The table at its latest version, or None while nothing made it."""
        try:
            if self._table is None:
                if not DeltaTable.is_deltatable(self.table_uri, storage_options=self._options):
                    return None
                self._table = DeltaTable(self.table_uri, storage_options=self._options)
            else:
                self._table.update_incremental()
        except (OSError, DeltaError) as exc:
            self._table = None
            raise StoreError(f"sink task {self.task_id}: reading Delta table {self.table_uri} failed: {exc}") from exc
        return self._table

    def committed_version(self) -> int | None:
        """The last epoch this task committed to the table (its application transaction's version)."""
        table = self._loaded()
        return None if table is None else table.transaction_version(self.app_id)

    def _committed(self, epoch: int) -> bool:
        version = self.committed_version()
        if version is None or version < epoch:
            return False
        self._check_vouched(version)
        return True

    def _signed_parts(self, version: int, generation: int) -> tuple[bytes, ...]:
        """What the signature of the transaction's ``version`` set in ``generation`` covers."""
        return b"delta-txn", self.app_id.encode(), str(version).encode(), str(generation).encode()

    def _vouching(self, version: int) -> dict[str, str]:
        """The commit info members that vouch for the transaction's ``version``, set in this generation."""
        if self._key is None:
            return {}
        return {
            TXN_MEMBER: f"{self.app_id}:{version}",
            TXN_GENERATION_MEMBER: str(self.generation),
            TXN_SIGNATURE_MEMBER: self._key.sign(*self._signed_parts(version, self.generation)),
        }

    def _vouched_by(self, commit: dict) -> tuple[int, int] | None:
        """(generation, version) a commit's info vouches for, of this sink's transaction; None when
        it vouches for none (another task's, none at all, or not signed with the job's key)."""
        said, generation = commit.get(TXN_MEMBER), commit.get(TXN_GENERATION_MEMBER)
        prefix = f"{self.app_id}:"
        if not isinstance(said, str) or not said.startswith(prefix) or not isinstance(generation, str):
            return None
        try:
            found = (int(generation), int(said[len(prefix) :]))
        except ValueError:
            return None
        assert self._key is not None
        signature = commit.get(TXN_SIGNATURE_MEMBER)
        if not isinstance(signature, str) or not self._key.verify(signature, *self._signed_parts(found[1], found[0])):
            return None
        return found

    def _check_vouched(self, version: int) -> None:
        """A ``SinkError`` unless the newest commit of the table signed with the job's key for
        this transaction set it to ``version``, and no older one carries a higher (generation,
        version) (among the newest ``_VOUCHING_COMMITS`` commits)."""
        if self._key is None:
            return
        table = self._loaded()
        if table is None:
            return
        if self._vouched == (table.version(), version):
            return
        try:
            history = table.history(_VOUCHING_COMMITS)  # newest first
        except (OSError, DeltaError) as exc:
            raise StoreError(
                f"sink task {self.task_id}: reading the history of {self.table_uri} failed: {exc}"
            ) from exc
        vouched = [found for found in map(self._vouched_by, history) if found is not None]
        said = (
            f"sink task {self.task_id}: Delta table {self.table_uri} says application transaction {self.app_id} "
            f"is at version {version}, but "
        )
        fix = (
            "Take the commits after the sink's last signed one out of the table (restore the table to that "
            "version) and start the job again"
        )
        if not vouched or vouched[0][1] != version:
            raise SinkError(
                said + "no commit signed with the job's key set it: someone without the key wrote the table's "
                "log, and every epoch up to that version would look committed and be dropped (or, set back, "
                "be written twice). " + fix
            )
        if vouched[0] < max(vouched):
            raise SinkError(
                said + f"the commit that set it copies the signed commit info of generation {vouched[0][0]}, "
                f"older than a later commit's (generation {max(vouched)[0]}, version {max(vouched)[1]}): someone "
                "without the key set the version back to one the sink set before, so that epochs would be "
                "dropped as committed or written twice. " + fix
            )
        self._vouched = (table.version(), version)

    def _committed_elsewhere(self, epoch: int) -> bool:
        return self._committed(epoch)

    def _publish(self, epoch: int) -> None:
        rows = self._staging.read(epoch)
        if rows.num_rows == 0:  # nothing to add: no commit (the table's log grows only with output)
            return
        rows = rows.append_column(DELTA_COLUMNS[0], pa.array([self.writer] * rows.num_rows, pa.string()))
        rows = rows.append_column(DELTA_COLUMNS[1], pa.array([epoch] * rows.num_rows, pa.int64()))
        properties = CommitProperties(
            app_transactions=[Transaction(self.app_id, epoch)],
            custom_metadata={EPOCH_HEADER: self._marker(epoch), **self._vouching(epoch)},
        )

        def append() -> None:
            table = self._loaded()
            written = rows if table is None else _as_table_columns(rows, _columns(table), self)
            if table is None:
                _typed_columns(written, self)
            write_deltalake(
                table or self.table_uri,
                written,
                mode="append",
                storage_options=self._options,
                commit_properties=properties,
            )

        self._with_retries(append, f"committing epoch {epoch}", again=lambda: self._committed(epoch))

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """This task's rows of epochs after ``checkpoint`` deleted from the
        table, its transaction's version set back to ``checkpoint`` in the
        same commit (so epochs numbered again after it are written again)."""
        table = self._loaded()
        version = None if table is None else table.transaction_version(self.app_id)
        if table is None or version is None or version <= checkpoint:
            return [], []
        epochs = self._epochs_after(table, checkpoint)
        back = CommitProperties(
            app_transactions=[Transaction(self.app_id, checkpoint)], custom_metadata=self._vouching(checkpoint)
        )
        writer = self.writer.replace("'", "''")
        predicate = f"{DELTA_COLUMNS[0]} = '{writer}' AND {DELTA_COLUMNS[1]} > {int(checkpoint)}"

        def take_back() -> None:
            current = self._loaded()
            if current is None:
                return
            if epochs:
                current.delete(predicate, commit_properties=back)
            else:  # nothing to delete (the later epochs had no rows): a commit of no rows sets the version back
                empty = _columns(current).empty_table()
                write_deltalake(current, empty, mode="append", storage_options=self._options, commit_properties=back)

        self._with_retries(take_back, f"taking back epochs after {checkpoint}")
        if epochs:
            log.warning(
                "sink task %s: epochs %s were committed to %s after checkpoint %d, the restored one; "
                "their rows are deleted from the table (the new generation writes them again)",
                self.task_id,
                epochs,
                self.table_uri,
                checkpoint,
            )
        return epochs, []

    def _epochs_after(self, table: DeltaTable, checkpoint: int) -> list[int]:
        if not set(DELTA_COLUMNS) <= set(_columns(table).names):
            return []
        found = table.to_pyarrow_dataset().to_table(
            columns=[DELTA_COLUMNS[1]],
            filter=(pc.field(DELTA_COLUMNS[0]) == self.writer) & (pc.field(DELTA_COLUMNS[1]) > checkpoint),
        )
        return sorted(pc.unique(found[DELTA_COLUMNS[1]]).to_pylist())

    def _marker(self, epoch: int) -> str:
        return f"{self.task_id}:{epoch}"

    def _with_retries(self, commit: Callable[[], object], what: str, again: Callable[[], bool] = lambda: False) -> None:
        """``commit()``, again after a pause while another writer's commit
        wins the race for a table version (at most ``_DELTA_ATTEMPTS`` times,
        ``waits.retry``, with pauses of a random length so that racing
        writers do not try again in step; ``again()`` says whether a commit
        that failed went in after all).  Any other failure is a ``SinkError``
        or, when the store is, a ``StoreError``."""
        tried = False

        def once() -> None:
            nonlocal tried
            if tried and again():
                return
            tried = True
            try:
                commit()
            except CommitFailedError:
                self._table = None
                raise

        try:
            retry(
                once,
                None,
                f"sink task {self.task_id}: {what}",
                retry_on=CommitFailedError,
                attempts=_DELTA_ATTEMPTS,
                bound="_DELTA_ATTEMPTS",
                first_s=0.1,
                max_s=1.0,
                jitter_s=0.15,
                cause="another writer's commit won",
                level=logging.INFO,
                logger=log,
            )
        except WaitTimeout as lost:  # the wording names the last failure
            raise SinkError(
                f"sink task {self.task_id}: {what} to Delta table {self.table_uri} lost to other writers "
                f"{_DELTA_ATTEMPTS} times: {lost.__cause__}"
            ) from lost.__cause__
        except SchemaMismatchError as exc:
            raise SinkError(
                f"sink task {self.task_id}: {what}: the output's columns do not match Delta table "
                f"{self.table_uri}'s ({exc}); a pipeline whose output changes writes to a new table"
            ) from exc
        except (OSError, DeltaError) as exc:
            self._table = None
            raise StoreError(f"sink task {self.task_id}: {what} to Delta table {self.table_uri} failed: {exc}") from exc
        except (SinkError, StoreError):
            raise
        except Exception as exc:  # delta-rs raises plain exceptions too (an Arrow cast, a write)
            raise SinkError(
                f"sink task {self.task_id}: {what} to Delta table {self.table_uri} failed: {type(exc).__name__}: {exc}"
            ) from exc


def _columns(table: DeltaTable) -> pa.Schema:
    """The table's columns as an Arrow schema."""
    return pa.schema(table.schema().to_arrow())


def _as_table_columns(rows: pa.Table, columns: pa.Schema, sink: DeltaSink) -> pa.Table:
    """``rows`` with the table's columns: the same names and types (a column
    of nothing but nulls takes the table's type), else a ``SinkError`` that
    says what differs: nothing is cast silently."""
    if set(rows.column_names) != set(columns.names):
        missing, extra = (
            sorted(set(columns.names) - set(rows.column_names)),
            sorted(set(rows.column_names) - set(columns.names)),
        )
        raise SinkError(
            f"sink task {sink.task_id}: the output's columns do not match Delta table {sink.table_uri}'s "
            f"(missing {missing}, not in the table {extra}); a pipeline whose output changes writes to a new table"
        )
    out = []
    for target in columns:
        column = rows[target.name]
        if column.type == pa.null():
            column = pa.nulls(rows.num_rows, target.type)
        elif not column.type.equals(target.type) and not _same_kind(column.type, target.type):
            raise SinkError(
                f"sink task {sink.task_id}: column {target.name!r} of the output is {column.type}, Delta table "
                f"{sink.table_uri} has {target.type}; a pipeline whose output changes writes to a new table"
            )
        out.append(column.cast(target.type) if not column.type.equals(target.type) else column)
    return pa.table(out, schema=columns)


def _same_kind(given: pa.DataType, kept: pa.DataType) -> bool:
    """Types Delta stores alike (strings and timestamps in their large or zoned forms)."""

    def kind(t: pa.DataType) -> str:
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return "string"
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return "binary"
        if pa.types.is_timestamp(t):
            return "timestamp"
        return str(t)

    return kind(given) == kind(kept)


def _typed_columns(rows: pa.Table, sink: DeltaSink) -> None:
    """The first epoch makes the table: a column of nothing but nulls has no type to give it."""
    untyped = [f.name for f in rows.schema if f.type == pa.null()]
    if untyped:
        raise SinkError(
            f"sink task {sink.task_id}: the first epoch written to Delta table {sink.table_uri} has only nulls in "
            f"{untyped}, so they have no type; give them one in the stage's output (a cast in its operator or Spark code)"
        )


def read_delta_output(table_uri: str, connection: Connection | None = None) -> pa.Table | None:
    """What a Delta sink committed to ``table_uri``, without the sink's own
    columns (``DELTA_COLUMNS``), or None when no table is there yet."""
    options = delta_storage_options(table_uri, connection)
    if not DeltaTable.is_deltatable(table_uri, storage_options=options):
        return None
    table = DeltaTable(table_uri, storage_options=options).to_pyarrow_table()
    return table.drop_columns([c for c in DELTA_COLUMNS if c in table.column_names])

"""The Delta Lake sink on a local table and on the real S3 server: an
epoch appears only on commit, in one Delta commit that records the task's
application transaction at the epoch's number; a commit again (after a
crash between the Delta commit and the clean-up of its staged file) writes
nothing twice; a restore to an older checkpoint deletes what was committed
after it; tasks committing at once each get their own table version."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from barriers.messages import UNSIGNED
from streaming import read_delta_output  # what a user reads output with
from streaming.adapters.objects import open_store
from streaming.adapters.sinks.base import Recovery
from streaming.adapters.sinks.delta import DELTA_COLUMNS, DeltaSink, delta_storage_options
from streaming.adapters.sinks.factory import open_sink
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Sink
from streaming.errors import SinkError


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.integration)])  # s3: the real runtime
def place(request, tmp_path, unique_name):
    """(the sink's staging location, its table, the S3 connection or None)."""
    if request.param == "file":
        return open_store(str(tmp_path / "sink")), str(tmp_path / "table"), None
    connection = request.getfixturevalue("connection")
    root = f"s3://{connection.s3_bucket}/tests/{unique_name}"
    return open_store(f"{root}/sink", connection), f"{root}/table", connection


def _sink(place, task: str = "task-0", job: str = "j", key=UNSIGNED, generation: int = 1) -> DeltaSink:
    location, table, connection = place
    sink = open_sink(
        Sink("delta", table=table),
        location,
        task,
        job=job,
        kafka=KafkaAccess("unused:9092"),
        connection=connection,
        key=key,
        generation=generation,
    )
    assert isinstance(sink, DeltaSink)
    return sink


def _values(place) -> list[str]:
    _, table, connection = place
    output = read_delta_output(table, connection)
    return [] if output is None else sorted(output["value"].to_pylist())


def test_an_epoch_is_in_the_table_only_after_its_commit_and_once(place, epoch_rows):
    sink = _sink(place)
    sink.stage(1, epoch_rows(1))
    sink.stage(2, epoch_rows(2))
    assert _values(place) == []
    assert sink.commit(1) is True
    assert _values(place) == ["1:0", "1:1", "1:2"]
    assert sink.staged_epochs() == [2]
    assert sink.commit(1) is False
    assert sink.committed_version() == 1
    _, table, connection = place
    delta = DeltaTable(table, storage_options=delta_storage_options(table, connection))
    assert delta.transaction_version("spark-abs/j/task-0") == 1
    rows = delta.to_pyarrow_table()
    assert set(rows[DELTA_COLUMNS[0]].to_pylist()) == {"j/task-0"} and set(rows[DELTA_COLUMNS[1]].to_pylist()) == {1}
    assert [h.get("abs.epoch") for h in delta.history() if h.get("operation") == "WRITE"] == ["task-0:1"]


def test_a_commit_cut_short_before_its_staged_file_went_is_not_written_again(place, epoch_rows):
    sink = _sink(place)
    sink.stage(1, epoch_rows(1))
    sink.commit(1)
    sink.stage(1, epoch_rows(1))  # as the crash left it: the Delta commit made, the staged file still there
    restarted = _sink(place)
    assert restarted.recover(completed_checkpoint=1) == Recovery()
    assert restarted.staged_epochs() == []
    assert _values(place) == ["1:0", "1:1", "1:2"]


def test_recovery_commits_up_to_the_checkpoint_and_a_restore_deletes_what_came_after(place, epoch_rows):
    crashed, other = _sink(place), _sink(place, "task-1")
    for epoch in (1, 2, 3):
        crashed.stage(epoch, epoch_rows(epoch, 1))
    crashed.commit(1)
    other.stage(3, epoch_rows(30, 1))
    other.commit(3)
    # checkpoint 2 completed but the crash came before the sink's commit; epoch 3 is of the failed run
    assert _sink(place).recover(completed_checkpoint=2) == Recovery(committed=[2], discarded=[3])
    assert _values(place) == ["1:0", "2:0", "30:0"]
    # restored from checkpoint 1: task-0's epoch 2 and task-1's epoch 3 are deleted, each by its own task
    assert _sink(place).recover(completed_checkpoint=1) == Recovery(retracted=[2])
    assert _values(place) == ["1:0", "30:0"]
    assert _sink(place, "task-1").recover(completed_checkpoint=1) == Recovery(retracted=[3])
    assert _values(place) == ["1:0"]
    # the replay writes them again under the new generation's (higher) epochs
    again = _sink(place)
    again.stage(4, epoch_rows(2, 1))
    assert again.commit(4) is True
    assert _values(place) == ["1:0", "2:0"]


def test_a_restore_sets_the_version_back_and_leaves_other_jobs_rows_alone(place, tmp_path, epoch_rows):
    ours, theirs = _sink(place), _sink((open_store(str(tmp_path / "other")), *place[1:]), job="other")
    for epoch in (1, 2, 3):
        ours.stage(epoch, epoch_rows(epoch, 1))
        ours.commit(epoch)
    theirs.stage(2, epoch_rows(200, 1))
    theirs.commit(2)
    # the job's store was wiped and it starts afresh, its checkpoints numbered from 1 again
    fresh = _sink(place)
    assert fresh.recover(completed_checkpoint=0) == Recovery(retracted=[1, 2, 3])
    assert fresh.committed_version() == 0 and _values(place) == ["200:0"]  # the other job's row stays
    fresh.stage(1, epoch_rows(7, 1))
    assert fresh.commit(1) is True  # numbered 1 again, written again
    assert _values(place) == ["200:0", "7:0"]
    # later epochs without rows: the version goes back all the same
    fresh.stage(2, epoch_rows(2, 0))
    fresh.commit(2)
    fresh.stage(3, epoch_rows(3, 0))
    fresh.commit(3)
    assert _sink(place).recover(completed_checkpoint=1) == Recovery() and fresh.committed_version() == 1


def test_output_of_other_types_is_a_clear_error_not_a_cast(place):
    sink = _sink(place)
    sink.stage(1, pa.table({"key": ["a"], "value": [1]}))
    sink.commit(1)
    sink.stage(2, pa.table({"key": ["b"], "value": [1.5]}))
    with pytest.raises(SinkError, match="column 'value' of the output is double, Delta table .* has int64"):
        sink.commit(2)
    sink.stage(3, pa.table({"key": ["c"], "value": pa.nulls(1)}))  # nulls take the table's type
    assert sink.commit(3) is True
    fresh = _sink(place, job="nulls-first")
    fresh.table_uri += "-2"
    fresh.stage(1, pa.table({"key": ["a"], "value": pa.nulls(1)}))
    with pytest.raises(SinkError, match=r"only nulls in \['value'\]"):
        fresh.commit(1)


def test_tasks_committing_at_once_each_get_their_own_version(place, epoch_rows):
    sinks = [_sink(place, f"task-{i}") for i in range(4)]
    for i, sink in enumerate(sinks):
        sink.stage(1, epoch_rows(10 + i, 2))
    failures: list[BaseException] = []

    def commit(sink: DeltaSink) -> None:
        try:
            sink.commit(1)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=commit, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []
    assert len(_values(place)) == 8
    assert all(s.committed_version() == 1 for s in sinks)


def test_an_empty_epoch_adds_no_commit_and_output_of_other_columns_is_a_clear_error(place, epoch_rows):
    sink = _sink(place)
    sink.stage(1, epoch_rows(1, 1))
    sink.commit(1)
    sink.stage(2, epoch_rows(2, 0))
    assert sink.commit(2) is True
    assert sink.committed_version() == 1 and sink.staged_epochs() == []
    sink.stage(3, pa.table({"other": [1]}))
    with pytest.raises(SinkError, match="do not match Delta table"):
        sink.commit(3)
    assert _values(place) == ["1:0"]


def test_a_table_elsewhere_than_s3_or_a_path_is_refused(tmp_path):
    from streaming.errors import ConfigError

    with pytest.raises(ConfigError, match="give s3://bucket/path or a local path"):
        open_sink(
            Sink("delta", table="gs://b/t"),
            open_store(str(tmp_path)),
            "t",
            job="j",
            kafka=KafkaAccess("x:1"),
            key=UNSIGNED,
            generation=1,
        )


def test_where_each_sink_commits_its_output_is_said(tmp_path):
    from streaming.adapters.sinks.factory import sink_place
    from streaming.api.settings import JobSettings

    settings = JobSettings(store=str(tmp_path))
    assert sink_place(Sink("delta"), settings, "j", None) == (
        f"Delta table {tmp_path}/j/sink/table (spark.read.format('delta'), or read_delta_output)"
    )
    assert sink_place(Sink("kafka", "j.out"), settings, "j", None).startswith("Kafka topic j.out (read it with")
    assert "registered under j.out-value" in sink_place(
        Sink("kafka", "j.out", avro=READER_FOR_SAY), settings, "j", None
    )
    assert (
        sink_place(Sink(), settings, "j", None)
        == f"Parquet under file://{tmp_path}/j/sink/output (read_committed_output)"
    )


READER_FOR_SAY = {"type": "record", "name": "Out", "fields": [{"name": "k", "type": "string"}]}


def test_a_transaction_version_raised_by_a_writer_without_the_key_stops_the_sink_instead_of_dropping_epochs(
    tmp_path, epoch_rows
):
    """A writer of the table's log appends a commit setting the sink task's application
    transaction to 1,000,000: every later epoch would look committed and be skipped.  The
    sink's own versions are signed in their commit info; this one is not, and the sink stops
    saying so.  A sink without the key (UNSIGNED) takes the version as it is."""
    place = (open_store(str(tmp_path / "sink")), str(tmp_path / "table"), None)
    key = JobKey.derive("s" * 32, "j", cluster="test-cluster")
    sink = _sink(place, key=key)
    sink.stage(1, epoch_rows(1))
    assert sink.commit(1) is True
    sink.stage(2, epoch_rows(2))
    write_deltalake(
        str(tmp_path / "table"),
        pa.table({"value": ["forged"]}),
        mode="append",
        schema_mode="merge",
        commit_properties=CommitProperties(app_transactions=[Transaction("spark-abs/j/task-0", 1_000_000)]),
    )
    with pytest.raises(SinkError, match="is at version 1000000, but no commit signed with the job's key set it"):
        sink.commit(2)
    assert _values(place) == ["1:0", "1:1", "1:2", "forged"]  # epoch 2 neither written nor dropped as committed
    # the sink's own version, signed, is taken: a sink again after a restart finds epoch 1 committed
    again = _sink((place[0], str(tmp_path / "other-table"), None), key=key)
    again.stage(1, epoch_rows(1))
    assert again.commit(1) is True and again.commit(1) is False
    with pytest.raises(TypeError, match="UNSIGNED said explicitly"):
        _sink(place, key=None)  # a key left out is no unsigned sink
    # without the key (unit tests only), the version is taken as it is: epoch 2 looks committed
    unsigned = _sink(place)
    unsigned.stage(2, epoch_rows(2))
    assert unsigned.commit(2) is False


def test_a_signed_commit_copied_to_set_the_version_back_stops_the_sink_instead_of_dropping_epochs(tmp_path, epoch_rows):
    """Generation 1 commits epochs 1 to 3; generation 2 restores checkpoint 1 and takes 2
    and 3 back (the version set back to 1, signed).  A writer of the table's log then copies
    epoch 3's signed commit info onto a commit setting the version to 3 again: each of its
    members verifies, but it is older than the take-back.  Generation 2's epochs 2 and 3
    would look committed and be dropped; the sink stops saying why."""
    from deltalake import DeltaTable

    place = (open_store(str(tmp_path / "sink")), str(tmp_path / "table"), None)
    key = JobKey.derive("s" * 32, "j", cluster="test-cluster")
    first = _sink(place, key=key, generation=1)
    for epoch in (1, 2, 3):
        first.stage(epoch, epoch_rows(epoch))
        assert first.commit(epoch) is True
    info = {m: c[m] for c in DeltaTable(place[1]).history(1) for m in c if m.startswith("abs.txn")}
    assert info["abs.txn"] == "spark-abs/j/task-0:3" and info["abs.txn.gen"] == "1"
    second = _sink(place, key=key, generation=2)
    assert second.recover(1).retracted == [2, 3]

    def copy(table: str, version: int, members: dict) -> None:
        write_deltalake(
            table,
            pa.table({"value": ["copied"]}),
            mode="append",
            schema_mode="merge",
            commit_properties=CommitProperties(
                app_transactions=[Transaction("spark-abs/j/task-0", version)], custom_metadata=members
            ),
        )

    copy(place[1], 3, info)
    second.stage(2, epoch_rows(2))
    with pytest.raises(SinkError, match="copies the signed commit info of generation 1, older than a later commit"):
        second.commit(2)
    assert "2:0" not in _values(place)  # neither written nor dropped as committed

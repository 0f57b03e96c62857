"""Looking inside checkpoints on a local store: a checkpoint in words, state
tables with their task, channel state with stale and control records told
apart, diffs by key, restore plans, and the `checkpoints`/`state`/`restore`
commands' output and exit status."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from barriers.lineage import Lineage
from barriers.messages import Barrier, ChannelId, encode
from operators import KeyedAggregate, count, sum_
from operators.state import KeyedState
from streaming.adapters.objects import open_store
from streaming.adapters.serde.records import RECORD_SCHEMA
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskParts
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.api.settings import JobSettings
from streaming.engine.job.coordinator import CompletionHooks, CoordinatorIO, CoordinatorService
from streaming.engine.task.stage_task import StageTask, TaskIO, TaskOptions
from streaming.errors import SnapshotMissingError
from streaming.tools.checkpoints.inspection import Checkpoints, channel_rows, classify_channel_records, state_keys
from streaming.tools.views import render_checkpoints, render_detail, render_diff, render_restore_plan

JOB = "ledger"
CHANNEL = "legs:0"


def _records(rows: list[tuple[int, bytes, dict[str, bytes]]]) -> pa.Table:
    """Kafka records of channel legs:0: (offset, value, headers)."""
    return pa.table(
        {
            "topic": ["legs"] * len(rows),
            "partition": [0] * len(rows),
            "offset": [o for o, _, _ in rows],
            "key": [None] * len(rows),
            "value": [v for _, v, _ in rows],
            "headers": [[{"key": k, "value": v} for k, v in h.items()] for _, _, h in rows],
            "timestamp": [datetime(2026, 1, 1)] * len(rows),
        },
        schema=RECORD_SCHEMA,
    )


def _balances(values: dict[str, int]) -> pa.Table:
    state = KeyedState(["account"], ["balance"])
    state.upsert(pa.table({"account": list(values), "balance": list(values.values())}))
    return state.snapshot()


def _checkpoint(store: SnapshotStore, cid: int, balances: dict[str, int], *, generation: int = 2) -> None:
    # generation 2 restored at legs:0@100: generation-1 records from offset 100 on are stale
    lineage = Lineage().after_restore(2, {ChannelId.parse(CHANNEL): 100})
    copied = _records(
        [
            (101, b'{"account": "a", "amount": 5}', {"abs.gen": b"1"}),  # stale
            (102, b'{"account": "b", "amount": 7}', {"abs.gen": b"2"}),
            (103, b"", {"abs.kind": b"watermark", "abs.gen": b"2"}),
            (104, b'{"account": "c", "amount": -2}', {}),  # written outside spark-abs
        ]
    )
    snapshots = {
        "accounts-0": store.write_task(
            cid,
            generation,
            "accounts-0",
            TaskParts(
                state={"balances": _balances(balances)},
                positions={CHANNEL: 110},
                in_flight={CHANNEL: (101, 105)},
                channel_records={CHANNEL: copied},
                metadata={
                    "kind": "unaligned",
                    "first_barrier_s": 0.25,
                    "appended_s": 0.01,
                    "batch_began_s": 0.12,
                    "handed_s": 0.24,
                    "forwarded_s": 0.26,
                    "alignment_s": 0.0,
                    "sync_snapshot_s": 0.002,
                    "watermarks": {CHANNEL: 1000},
                    "lineage": lineage.to_json(),
                },
            ),
        ),
        "accounts-1": store.write_task(
            cid, generation, "accounts-1", TaskParts(state={"balances": _balances({"z": 1})}, positions={"legs:1": 40})
        ),
    }
    store.write_manifest(
        cid,
        generation,
        snapshots,
        options={"alignment": "unaligned", "in_flight": "records", "guarantee": "exactly-once"},
        metrics={
            "trigger_to_complete_s": 0.8,
            "kinds": ["unaligned"],
            "tasks": {"accounts-0": {"async_snapshot_s": 0.1, "acked_s": 0.4}},
        },
    )


SECRET = "a-secret-of-the-tests-own-0123456789"


@pytest.fixture
def store(tmp_path):
    # signed as a job's runner signs it: the commands verify with the same secret (``_cli``)
    store = SnapshotStore(open_store(f"file://{tmp_path}/store"), JOB, key=JobKey.store_key(SECRET, JOB))
    store.next_generation(None)
    store.next_generation(3)  # generation 2, restored from checkpoint 3
    _checkpoint(store, 4, {"a": 10, "b": -10, "c": 0})
    _checkpoint(store, 5, {"a": 12, "b": -10, "d": 3})
    yield store
    store.close()


def test_a_checkpoint_in_words(store):
    detail = Checkpoints(store).detail(5)
    assert detail.problems == [] and detail.alignment == "unaligned" and detail.trigger_to_complete_s == 0.8
    task = {t.task: t for t in detail.tasks}["accounts-0"]
    assert (task.kind, task.first_barrier_s, task.async_snapshot_s) == ("unaligned", 0.25, 0.1)
    assert task.in_flight == {CHANNEL: (101, 105)} and task.copied_rows == {CHANNEL: 4}
    assert task.state_tables["balances"][0] == 3 and task.watermarks == {CHANNEL: 1000}
    assert task.path == {"appended": 0.01, "batch_began": 0.12, "handed": 0.24, "forwarded": 0.26, "acked": 0.4}
    text = render_detail(detail)
    path_row = next(line for line in text.splitlines() if line.lstrip().startswith("accounts-0") and "0.010" in line)
    assert path_row.split()[1:] == ["0.010", "0.120", "0.240", "0.250", "0.260", "0.400"]
    assert "checkpoint 5 of job ledger: generation 2" in text and "verifies" in text
    assert "[101, 105)" in text and "accounts-0" in text and "unaligned" in text
    assert json.loads(json.dumps(detail.to_dict()))["tasks"][0]["task"] == "accounts-0"


def test_state_tables_carry_their_task_and_keys(store):
    tables = Checkpoints(store).state(5)
    balances = tables["balances"]
    assert balances.column_names[:2] == ["task", "account"]
    assert sorted(zip(balances["task"].to_pylist(), balances["account"].to_pylist())) == [
        ("accounts-0", "a"),
        ("accounts-0", "b"),
        ("accounts-0", "d"),
        ("accounts-1", "z"),
    ]
    assert state_keys(balances) == ("account",)
    assert Checkpoints(store).state(5, task="accounts-1")["balances"].num_rows == 1
    with pytest.raises(SnapshotMissingError, match="no state table 'windows'.*tables: balances"):
        Checkpoints(store).state(5, table="windows")
    with pytest.raises(SnapshotMissingError, match="no task 'nope'"):
        Checkpoints(store).state(5, task="nope")


def test_channel_state_marks_stale_and_control_records_and_decodes_the_rest(store):
    channels = Checkpoints(store).channel_state(5)
    records = channels.records
    assert records["offset"].to_pylist() == [101, 102, 103, 104]
    assert records["held"].to_pylist() == ["copied"] * 4
    assert records["stale"].to_pylist() == [True, False, False, False]
    assert records["kind"].to_pylist() == ["data", "data", "watermark", "data"]
    assert records["written_by"].to_pylist() == [1, 2, 2, None]
    rows = channels.rows
    assert rows.column_names[:3] == ["task", "channel", "offset"]
    assert list(zip(rows["offset"].to_pylist(), rows["amount"].to_pylist())) == [(102, 7), (104, -2)]
    assert channels.problems == []


def test_a_range_without_kafka_is_reported_not_dropped(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED)
    snap = store.write_task(1, 0, "t-0", TaskParts(positions={CHANNEL: 9}, in_flight={CHANNEL: (3, 9)}))
    store.write_manifest(1, 0, {"t-0": snap})
    channels = Checkpoints(store).channel_state(1)
    store.close()
    assert channels.records.num_rows == 0
    assert channels.problems == ["t-0 legs:0: [3, 9) kept as a range; no Kafka to read it"]


def test_records_that_do_not_decode_are_problems():
    records = _records([(1, b"{not json", {}), (2, b'{"x": 1}', {})])
    described = classify_channel_records(records, ChannelId.parse(CHANNEL), 0, Lineage(), task="t")
    assert described["stale"].to_pylist() == [False, False]
    problems: list[str] = []
    rows = channel_rows(described, problems)
    assert rows["x"].to_pylist() == [1]
    assert len(problems) == 1 and problems[0].startswith("legs:0 offset 1:")


def test_diff_by_key(store):
    diffs = {(d.task, d.table): d for d in Checkpoints(store).diff(4, 5)}
    d = diffs[("accounts-0", "balances")]
    assert (d.keys, d.added, d.removed, d.changed, d.unchanged) == (("account",), 1, 1, 1, 1)
    assert sorted(zip(d.sample["change"].to_pylist(), d.sample["account"].to_pylist())) == [
        ("added", "d"),
        ("changed", "a"),
        ("removed", "c"),
    ]
    same = diffs[("accounts-1", "balances")]
    assert (same.added, same.removed, same.changed, same.unchanged) == (0, 0, 0, 1)
    assert "state changes from checkpoint 4 to 5" in render_diff(4, 5, list(diffs.values()), 10)


def test_restore_plan_skips_what_does_not_verify(store, tmp_path):
    part = next((tmp_path / "store" / JOB / "checkpoints" / "chk-00000005").rglob("balances.parquet"))
    part.write_bytes(b"broken")
    plan = Checkpoints(store).restore_plan()
    assert plan.checkpoint_id == 4 and [c for c, _ in plan.skipped] == [5]
    assert "size mismatch" in plan.skipped[0][1][0]
    assert plan.generation == 3
    task = {t.task: t for t in plan.tasks}["accounts-0"]
    assert task.state_rows == {"balances": 3} and task.replayed_records == {CHANNEL: 4}
    assert task.query_start == {CHANNEL: 110} and task.reread_ranges == {}
    text = render_restore_plan(plan)
    assert "checkpoint 5 skipped" in text and "a restore picks checkpoint 4 and starts generation 3" in text
    with pytest.raises(SnapshotMissingError, match="checkpoint 5 cannot be restored"):
        Checkpoints(store).restore_plan(5)


def _cli(*args: str, secret: str | None = None) -> subprocess.CompletedProcess:
    """The command; with ``secret`` (the one the ``store`` fixture signed with) as the job secret and no
    local runtime to take another from."""
    env = dict(os.environ)
    if secret is not None:
        env |= {"SPARK_ABS_JOB_SECRET": secret, "SPARK_ABS_HOME": tempfile.mkdtemp()}
        env.pop("SPARK_ABS_KAFKA_BOOTSTRAP", None)
    return subprocess.run(
        [sys.executable, "-m", "streaming.tools.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_commands(store, tmp_path):
    where = ("--store", f"file://{tmp_path}/store", "--job", JOB)
    shown = _cli("checkpoints", "show", "5", *where, "--json", secret=SECRET)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["checkpoint_id"] == 5
    assert _cli("checkpoints", "verify", *where, secret=SECRET).returncode == 0
    state = _cli("state", "5", *where, "--channels", secret=SECRET)
    assert state.returncode == 0, state.stderr
    assert "channel state: 4 records, 2 rows" in state.stdout
    out = tmp_path / "out" / "balances.parquet"
    exported = _cli("state", "4", *where, "--table", "balances", "--output", str(out), secret=SECRET)
    assert exported.returncode == 0, exported.stderr
    assert pq.read_table(out).num_rows == 4
    csv = _cli("state", "5", *where, "--channels", "--output", str(tmp_path / "out" / "channels.csv"), secret=SECRET)
    assert csv.returncode == 0, csv.stderr
    assert (tmp_path / "out" / "channels-records.csv").read_text().count("\n") == 5
    assert _cli("checkpoints", "diff", "4", *where, secret=SECRET).returncode == 2  # diff takes two ids
    part = next((tmp_path / "store" / JOB / "checkpoints" / "chk-00000004").rglob("balances.parquet"))
    part.write_bytes(part.read_bytes()[:-3] + b"xyz")
    verify = _cli("checkpoints", "verify", *where, secret=SECRET)
    assert verify.returncode == 1
    assert "1 of 2 checkpoint(s) verify" in verify.stdout and "checksum mismatch" in verify.stdout
    dry = _cli("restore", *where, "4", "--dry-run", secret=SECRET)
    assert dry.returncode == 2 and "checkpoint 4 cannot be restored" in dry.stderr
    dry = _cli("restore", *where, "--dry-run", secret=SECRET)
    assert dry.returncode == 0 and "a restore picks checkpoint 5" in dry.stdout
    # a writer of the store without the job's key edits checkpoint 5's manifest: it no longer verifies
    manifest = tmp_path / "store" / JOB / "checkpoints" / "chk-00000005" / "_MANIFEST.json"
    manifest.write_text(manifest.read_text().replace('"generation": 2', '"generation": 3'))
    verify = _cli("checkpoints", "verify", *where, secret=SECRET)
    assert verify.returncode == 1 and "0 of 2 checkpoint(s) verify" in verify.stdout
    # (the table wraps its cells at the terminal's width)
    assert "its signature does not match job ledger's key" in " ".join(verify.stdout.split())


def test_a_table_without_named_keys_is_compared_row_by_row(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED)
    for cid, marks in ((1, [5, 7, None]), (2, [7, 9, None])):
        snap = store.write_task(cid, 0, "w-0", TaskParts(state={"watermark": pa.table({"watermark": marks})}))
        store.write_manifest(cid, 0, {"w-0": snap})
    (d,) = Checkpoints(store).diff(1, 2)
    store.close()
    assert (d.keys, d.added, d.removed, d.changed, d.unchanged) == (("watermark",), 1, 1, 0, 2)  # null matches null


def test_an_empty_state_with_placeholder_types_does_not_break_reading_a_stage(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED)
    empty = KeyedState(["account"], ["balance"]).snapshot()  # no rows yet: placeholder int64 columns
    snaps = {
        "accounts-0": store.write_task(1, 0, "accounts-0", TaskParts(state={"balances": empty})),
        "accounts-1": store.write_task(1, 0, "accounts-1", TaskParts(state={"balances": _balances({"a": 1})})),
    }
    store.write_manifest(1, 0, snaps)
    balances = Checkpoints(store).state(1)["balances"]
    (d,) = [d for d in Checkpoints(store).diff(1, 1) if d.task == "accounts-1"]
    store.close()
    assert balances["account"].to_pylist() == ["a"] and d.unchanged == 1


def test_equal_rows_of_a_table_without_keys_count_one_by_one(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED)
    for cid, marks in ((1, [7, 7]), (2, [7])):
        snap = store.write_task(cid, 0, "w-0", TaskParts(state={"watermark": pa.table({"watermark": marks})}))
        store.write_manifest(cid, 0, {"w-0": snap})
    (d,) = Checkpoints(store).diff(1, 2)
    store.close()
    assert (d.keys, d.added, d.removed, d.unchanged) == (("watermark",), 0, 1, 1)
    assert d.sample.column_names == ["change", "task", "watermark"]


def test_channels_of_different_stages_decode_each_with_its_own_columns(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED)
    legs = _records([(1, b'{"account": "a", "amount": 5}', {})])
    transfers = _records([(1, b'{"id": 9, "source": "a", "target": "b"}', {})])
    snaps = {
        name: store.write_task(
            1,
            0,
            name,
            TaskParts(positions={CHANNEL: 2}, in_flight={CHANNEL: (1, 2)}, channel_records={CHANNEL: records}),
        )
        for name, records in (("accounts-0", legs), ("legs-0", transfers))
    }
    store.write_manifest(1, 0, snaps)
    channels = Checkpoints(store).channel_state(1)
    store.close()
    assert channels.problems == []
    rows = {r["task"]: r for r in channels.rows.to_pylist()}
    assert rows["accounts-0"]["amount"] == 5 and rows["legs-0"]["id"] == 9


def test_a_restore_with_nothing_to_restore_from_says_so(tmp_path):
    SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED).close()
    done = _cli("restore", "--store", f"file://{tmp_path}/s", "--job", JOB, "--pipeline", "x:y")
    assert done.returncode == 2 and "it holds no job at all" in done.stderr, done.stderr  # a job never run here
    with SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED) as store:
        store.first_generation()  # a job that started, and never completed a checkpoint
    done = _cli("restore", "--store", f"file://{tmp_path}/s", "--job", JOB, "--pipeline", "x:y")
    assert done.returncode == 2 and "no checkpoint verifies, nothing to restore from" in done.stderr, done.stderr


# ---- what is stored: names, and checkpoints written before names were stored

PROSE = pathlib.Path(__file__).parent / "fixtures" / "prose_checkpoint"


@pytest.fixture
def prose_store(tmp_path, monkeypatch) -> str:
    """A copy of the checkpoint the fixture keeps (see its README), and
    tables drawn 200 columns wide as when piped."""
    monkeypatch.setattr(shutil, "get_terminal_size", lambda *_, **__: os.terminal_size((200, 24)))
    shutil.copytree(PROSE / "store", tmp_path / "store")
    return f"file://{tmp_path}/store"


def test_a_checkpoint_written_before_names_were_stored_shows_as_it_did(prose_store):
    with Checkpoints.open(prose_store, "legacy") as checkpoints:
        detail = checkpoints.detail(1)
        listed = render_checkpoints("legacy", checkpoints.rows(), checkpoints.generation())
    assert render_detail(detail) + "\n" == (PROSE / "show.txt").read_text()
    assert json.loads(json.dumps(detail.to_dict())) == json.loads((PROSE / "show.json").read_text())
    assert listed + "\n" == (PROSE / "list.txt").read_text()
    shown = _cli("checkpoints", "show", "1", "--store", prose_store, "--job", "legacy")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (PROSE / "show.txt").read_text()


def _batch(*records: tuple[str, int, int, dict | Barrier]) -> pa.Table:
    """Records as a stage query hands them over: (topic, partition, offset, row or barrier)."""
    return pa.table(
        {
            "topic": [t for t, _, _, _ in records],
            "partition": [p for _, p, _, _ in records],
            "offset": [o for _, _, o, _ in records],
            "key": [None] * len(records),
            "value": [b"" if isinstance(v, Barrier) else json.dumps(v).encode() for _, _, _, v in records],
            "headers": [
                [{"key": k, "value": h} for k, h in encode(v, key=UNSIGNED)] if isinstance(v, Barrier) else []
                for _, _, _, v in records
            ],
            "timestamp": [None] * len(records),
        },
        schema=RECORD_SCHEMA,
    )


def test_a_checkpoint_written_now_stores_names_and_shows_the_same_words(tmp_path, prose_store):
    """The fixture's checkpoint taken again: two tasks, the second seeing its
    first barrier after the alignment timeout."""
    schema = pa.schema([("account", pa.string()), ("amount", pa.int64())])
    stage = Stage(
        "count",
        ("in",),
        lambda: KeyedAggregate("account", {"n": count(), "total": sum_("amount")}),
        key="account",
        parallelism=2,
        sink=Sink(),
    )
    pipeline = Pipeline("legacy", (Ingress("in", 4, schema),), (stage,))
    store = SnapshotStore(open_store(f"file://{tmp_path}/now"), "legacy", key=UNSIGNED)
    acks: list = []
    coordinator = CoordinatorService(
        pipeline,
        CoordinatorIO(
            inject=lambda markers: {c: 3 for c in markers},
            publish=lambda event: None,
            poll=lambda timeout_s: [acks.pop(0) for _ in range(len(acks))],
        ),
        store,
        JobSettings(
            store=f"file://{tmp_path}/now", mode="aligned-timeout", alignment_timeout_ms=200, held_bytes_budget=1000000
        ),
        hooks=CompletionHooks(progress_log=tmp_path / "checkpoints.jsonl"),
        job_key=UNSIGNED,
    )
    barrier = coordinator.trigger()
    tasks = [
        StageTask(
            pipeline,
            pipeline.task(name),
            TaskIO(
                send=lambda *_: None,
                append_barrier=lambda markers: {c: 0 for c in markers},
                publish=acks.append,
                dead_letter=lambda *_: None,
                write_snapshot=store.write_task,
                stage_epoch=lambda epoch, rows: None,
            ),
            options=TaskOptions(job_key=UNSIGNED),
        )
        for name in ("count-0", "count-1")
    ]
    tasks[0].process_batch(
        _batch(("in", 0, 0, {"account": "x", "amount": 1}), ("in", 0, 3, barrier), ("in", 2, 3, barrier))
    )
    late = replace(barrier, timestamp_ms=barrier.timestamp_ms - 1000)  # taken a second before the task sees it
    tasks[1].process_batch(_batch(("in", 1, 3, late), ("in", 3, 0, {"account": "w", "amount": 7})))
    tasks[1].process_batch(_batch(("in", 3, 3, late)))
    for task in tasks:
        task.wait_for_uploads()
    coordinator.poll()
    assert store.completed() == [1]

    manifest = json.loads(next((tmp_path / "now").rglob("_MANIFEST.json")).read_text())
    stored = {"alignment": "aligned", "alignment_timeout_ms": 200, "held_bytes_budget": 1000000, "in_flight": "range"}
    assert manifest["options"] == stored
    assert manifest["metrics"]["kinds"] == ["aligned", "timed_out_to_unaligned"]
    switched = json.loads(next((tmp_path / "now").rglob("count-1/_TASK.json")).read_text())["metadata"]
    assert (switched["kind"], switched["switch"]) == ("timed_out_to_unaligned", "late_barrier")
    assert "switch_reason" not in switched and manifest["tasks"]["count-1"]["metadata"] == switched
    assert manifest["metrics"]["tasks"]["count-1"]["kind"] == "timed_out_to_unaligned"
    (line,) = (tmp_path / "checkpoints.jsonl").read_text().splitlines()
    assert json.loads(line)["options"] == stored
    assert json.loads(line)["kinds"] == ["aligned", "timed_out_to_unaligned"]

    # in words, what the version before printed (the fixture is the same checkpoint, taken then)
    with Checkpoints(store) as checkpoints:
        now, now_listed = checkpoints.detail(1), checkpoints.rows()[0].kinds
    with Checkpoints.open(prose_store, "legacy") as checkpoints:
        then, then_listed = checkpoints.detail(1), checkpoints.rows()[0].kinds
    assert (now.alignment, now.guarantee, now.in_flight_format, now_listed) == (
        then.alignment,
        then.guarantee,
        then.in_flight_format,
        then_listed,
    )
    assert [(t.kind, t.switch_reason) for t in now.tasks] == [(t.kind, t.switch_reason) for t in then.tasks]

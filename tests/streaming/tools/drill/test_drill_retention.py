"""The drill's failure kind ``retention``, without services: what it deletes
(every internal partition up to where the newest complete checkpoint reads
it again, ingress topics whole), what it expects of the restore after it,
and that it is drawn only when named."""

from __future__ import annotations

import types

import pytest

from barriers.messages import ChannelId
from spark_abs_examples import money as money_example
from streaming.adapters.snapshots import Manifest, PartInfo, TaskSnapshot
from streaming.api.config import KafkaAccess
from streaming.api.settings import Mode
from streaming.errors import KafkaUnavailableError
from streaming.tools.drill import checks as drill_checks
from streaming.tools.drill import failures as drill_failures
from streaming.tools.drill import run as drill
from streaming.tools.drill.failures import FailureInjector, retention_cut
from streaming.tools.drill.run import FailureKind, FailureOutcome
from streaming.tools.drill.verify import DrillVerification

INGRESS = {"m.transfers:0", "m.transfers:1"}


def _manifest(checkpoint_id: int) -> Manifest:
    legs = TaskSnapshot(
        "legs-0", checkpoint_id, 0, positions={"m.transfers:0": 900}, in_flight={"m.transfers:0": (700, 899)}
    )
    accounts = TaskSnapshot(
        "accounts-0",
        checkpoint_id,
        0,
        positions={"m.legs:0": 41, "m.legs:2": 17},
        in_flight={"m.legs:0": (30, 40), "m.legs:2": (9, 16)},
        channel_parts=(PartInfo("m.legs:2", "accounts-0/channels/m.legs%3A2.parquet", 7, 1, "x"),),
    )
    return Manifest("m", checkpoint_id, 0, {"legs-0": legs, "accounts-0": accounts}, "2026-11-26T00:00:00+00:00")


def test_the_cut_is_where_the_checkpoint_reads_each_internal_partition_again():
    assert retention_cut(_manifest(7), INGRESS) == {
        ChannelId("m.legs", 0): 30,  # its channel state starts there
        ChannelId("m.legs", 2): 17,  # copied: it resumes after the barrier
    }


def _injector(problems: list[str], job=None, watch=None) -> FailureInjector:
    return FailureInjector(
        job, watch, runtime=None, wait=lambda c, t: True, log=print, problems=problems, started=0.0, recover_timeout_s=1
    )


def test_records_are_deleted_up_to_the_newest_checkpoint_and_a_restore_before_it_is_a_problem(monkeypatch):
    deleted = []
    monkeypatch.setattr(drill_failures, "earliest_offsets", lambda kafka, channels: {c: 5 for c in channels})
    monkeypatch.setattr(drill_failures, "delete_records", lambda kafka, cut: deleted.append((kafka, cut)))
    job = types.SimpleNamespace(
        completed=lambda: [6, 7],
        store=types.SimpleNamespace(read_manifest=_manifest),
        connection=types.SimpleNamespace(kafka=KafkaAccess("broker:9092")),
    )
    problems: list[str] = []
    injector = _injector(problems, job, types.SimpleNamespace(ingress=frozenset(INGRESS)))
    failure = drill.plan_failures(1, 1, [FailureKind.RETENTION], {}, 1.0)[0]
    assert failure.describe() == "records only older checkpoints need deleted (DeleteRecords), a worker SIGKILLed"
    outcome = FailureOutcome(failure, 0.0)
    injector._retention(outcome)
    assert deleted == [(KafkaAccess("broker:9092"), {ChannelId("m.legs", 0): 30, ChannelId("m.legs", 2): 17})]
    assert outcome.kept_from == 7
    assert outcome.note == "37 records of 2 internal partitions deleted, up to what checkpoint 7 needs"

    for restored, wrong in (([7], False), ([9], False), ([6], True), ([None], True), ([], False)):
        problems.clear()
        outcome.restored_from = restored
        injector._deleted_not_restored(outcome)
        assert bool(problems) is wrong, (restored, problems)
    outcome.restored_from = [None]
    injector._deleted_not_restored(outcome)
    assert "the restore used the beginning, whose records the drill deleted (checkpoint 7" in problems[-1]


def test_without_a_complete_checkpoint_nothing_is_deleted(monkeypatch):
    monkeypatch.setattr(drill_failures, "delete_records", lambda *a: (_ for _ in ()).throw(AssertionError("deleted")))
    job = types.SimpleNamespace(completed=lambda: [])
    outcome = FailureOutcome(drill.plan_failures(1, 1, [FailureKind.RETENTION], {}, 1.0)[0], 0.0)
    _injector([], job)._retention(outcome)
    assert outcome.kept_from is None and outcome.note == "no complete checkpoint: nothing deleted"


def test_retention_is_drawn_when_named_only():
    assert FailureKind.RETENTION not in drill.KINDS
    pools = drill.fault_pools(money_example.pipeline("plan"), Mode.ALIGNED)
    plan = drill.plan_failures(4, 2, [FailureKind.RETENTION, FailureKind.RUNNER], pools, 1.0)
    assert sorted(f.kind for f in plan) == [FailureKind.RETENTION] * 2 + [FailureKind.RUNNER] * 2


def test_checkpoints_older_than_the_one_kept_count_as_deleted_by_the_drill_when_their_ranges_are_gone(tmp_path):
    """The checkpoints suite reads each checkpoint's channel state ranges
    back to count its money: one older than the checkpoint the drill kept
    records for may find them gone; a newer one may not."""
    (tmp_path / "checkpoints.jsonl").write_text("".join(f'{{"checkpoint": {c}}}\n' for c in (5, 6, 7, 8)))

    def conserved(store, checkpoint_id, reader):
        if checkpoint_id in (5, 8):
            raise KafkaUnavailableError(f"checkpoint {checkpoint_id}: offsets no longer in Kafka")
        return 0

    job = types.SimpleNamespace(store=types.SimpleNamespace(verify=lambda c: []), log_dir=tmp_path)
    outcome = FailureOutcome(drill.plan_failures(1, 1, [FailureKind.RETENTION], {}, 1.0)[0], 0.0, kept_from=7)
    verification = DrillVerification(
        types.SimpleNamespace(kafka=KafkaAccess("broker:9092")),
        job,
        pipeline=money_example.pipeline("m"),
        workload=types.SimpleNamespace(conserved=conserved),
        outcomes=[outcome],
        malformed=[],
        log=print,
    )
    with pytest.raises(KafkaUnavailableError, match="checkpoint 8"):  # newer than the one kept: a real loss
        verification._checkpoint_frame()
    outcome.kept_from = 9
    frame = verification._checkpoint_frame()
    assert frame["state"].tolist() == [
        "records deleted by the drill",
        "verifies",
        "verifies",
        "records deleted by the drill",
    ]
    assert set(frame["state"]) <= set(drill_checks.CHECKPOINT_OK)

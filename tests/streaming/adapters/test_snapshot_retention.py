"""Retention's one rule (``plan_retention``) over every shape of store
Hypothesis makes up, and on a store in a local directory: the newest
checkpoint that verifies is never deleted, though the newest ``retain``
completions do not verify, and each complete checkpoint is verified once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.adapters.snapshots import SnapshotStore, TaskParts
from streaming.adapters.snapshots.retention import plan_retention
from streaming.errors import ConfigError

JOB = "kept"


@st.composite
def _stores(draw):
    """Checkpoint ids, the complete ones among them, what each complete one
    links to (earlier ids; as a chain does, also all that an earlier complete
    one it links to links to), the one that verifies, the pinned ones, retain."""
    checkpoints = sorted(draw(st.sets(st.integers(1, 12), max_size=10)))
    completed = sorted(draw(st.sets(st.sampled_from(checkpoints))) if checkpoints else set())
    links: dict[int, set[int]] = {}
    for c in completed:
        earlier = [e for e in checkpoints if e < c]
        drawn = draw(st.sets(st.sampled_from(earlier))) if earlier else set()
        links[c] = drawn.union(*(links[e] for e in drawn if e in links))
    verified = draw(st.none() | st.sampled_from(completed)) if completed else None
    pinned = draw(st.sets(st.integers(1, 14), max_size=2))
    return checkpoints, completed, links, verified, pinned, draw(st.integers(1, 4))


@settings(max_examples=300, database=None, deadline=None)
@given(_stores())
def test_the_rule_keeps_what_a_restore_may_need_and_deletes_the_rest(shape):
    checkpoints, completed, links, verified, pinned, retain = shape
    plan = plan_retention(
        checkpoints, completed, retain=retain, verified=verified, pinned=pinned, needs=lambda c: links[c]
    )
    doomed = set(plan.doomed)
    assert list(plan.doomed) == sorted(doomed) and doomed <= set(checkpoints)
    if not completed:
        assert plan.doomed == () and plan.kept == {}
        return
    newest = set(completed[-retain:])
    # never deleted: the newest retain, the one that verifies, the pinned, what may be in progress
    assert not doomed & (newest | {verified} | set(pinned))
    assert all(c <= completed[-1] for c in doomed)
    # nor what a complete checkpoint kept links to
    assert not any(links[c] & doomed for c in completed if c not in doomed)
    # every other checkpoint goes, and each one kept beyond the newest retain says why, truly
    older_kept = {c for c in checkpoints if c <= completed[-1] and c not in doomed and c not in newest}
    assert set(plan.kept) == older_kept
    for c, why in plan.kept.items():
        holders = [h for h in completed if h not in doomed and c in links[h]]
        assert c == verified or c in pinned or (holders and why == f"checkpoint {max(holders)} links to its parts")


def test_retain_below_one_is_refused():
    with pytest.raises(ConfigError, match="keep must be at least 1"):
        plan_retention([1], [1], retain=0, verified=1)


def _complete(store: SnapshotStore, cid: int, generation: int = 1) -> None:
    snapshot = store.write_task(cid, generation, "A", TaskParts(state={"counts": pa.table({"n": [cid]})}))
    store.write_manifest(cid, generation, {"A": snapshot})


def _damage(store: SnapshotStore, cid: int, how: str) -> None:
    """Checkpoint ``cid`` made one that does not verify: its manifest unreadable,
    its part missing, or one byte of its part flipped (its size unchanged)."""
    chk = Path(store.layout.checkpoint_dir(cid))
    part = chk / "A" / "state" / "counts.parquet"
    if how == "manifest":
        (chk / "_MANIFEST.json").write_text("not json")
    elif how == "missing":
        part.unlink()
    else:
        data = bytearray(part.read_bytes())
        data[20] ^= 0xFF
        part.write_bytes(bytes(data))


def test_three_completions_that_do_not_verify_leave_the_one_that_does(store):
    """Retention runs after every completion, as the coordinator runs it."""
    deleted = []
    for cid in (1, 2, 3, 4):
        _complete(store, cid)
        deleted.append(store.apply_retention(3))
    assert deleted == [[], [], [], [1]]
    for cid, how in ((5, "manifest"), (6, "missing"), (7, "checksum")):
        _complete(store, cid)
        _damage(store, cid, how)
        deleted.append(store.apply_retention(3))
    assert deleted[4:] == [[2], [3], []]  # 4 verifies: kept, older than the newest 3
    assert store.completed() == [4, 5, 6, 7]
    assert store.retention_plan(3).kept == {4: "a restore would pick it (the newest that verifies)"}
    assert store.latest_verified()[0].checkpoint_id == 4

    _complete(store, 8)  # verifies: 4 is one more old checkpoint
    assert store.apply_retention(3) == [4, 5]
    assert store.latest_verified()[0].checkpoint_id == 8


def test_a_complete_checkpoint_is_verified_at_most_once_and_only_when_retention_needs_it(store, monkeypatch):
    verified = Counter()
    verify = store.verifier.verify

    def counting(checkpoint_id, **options):
        verified[checkpoint_id] += 1
        return verify(checkpoint_id, **options)

    monkeypatch.setattr(store.verifier, "verify", counting)
    for cid in range(1, 9):
        _complete(store, cid)
        if cid in (4, 5, 7):
            _damage(store, cid, "missing")
        store.apply_retention(2)
    # a checkpoint known to verify is looked past only once it is not among the newest two: 2 and 7 were
    # never needed (1, then 6, was kept by count anyway); 5 and 4 did not verify, so 3 stayed the one kept
    assert verified == Counter([1, 3, 5, 4, 6, 8])
    assert store.retention_plan(2).doomed == ()
    assert verified == Counter([1, 3, 5, 4, 6, 8])  # nothing new: nothing verified again
    assert store.completed() == [7, 8]


def test_a_new_generation_looks_for_the_newest_that_verifies_again(store):
    """Generation 1 restored from checkpoint 2: checkpoint 3 verifies but is
    off the job's line, so it is not what retention keeps for a restore."""
    store.first_generation()
    for cid in (1, 2, 3):
        _complete(store, cid, generation=0)
    assert store.apply_retention(3) == []  # 3 verifies
    assert store.next_generation(2) == 1
    _complete(store, 4, generation=1)
    _damage(store, 4, "missing")
    assert store.apply_retention(1) == [1, 3]
    assert store.latest_verified()[0].checkpoint_id == 2


def test_a_known_good_checkpoint_deleted_meanwhile_is_looked_for_again(store):
    for cid in (1, 2, 3):
        _complete(store, cid)
    assert store.apply_retention(3) == []  # 3 verifies
    store.delete(3)  # gone behind retention's back
    _complete(store, 4)
    _damage(store, 4, "missing")
    assert store.apply_retention(1) == [1]  # 2 verifies now

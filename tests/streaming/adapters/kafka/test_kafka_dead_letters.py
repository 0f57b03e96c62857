"""The dead-letter topic on a real broker: a dead letter keeps the record and
its reason, one too large to send is cut with a note of what it was, and a
letter a restore's replay sends again supersedes the first: readers see each once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest

from barriers.messages import ChannelId
from streaming.adapters.kafka.dead_letters import (
    DeadLetterTopic,
    Restored,
    fit_dead_letter,
    read_dead_letters,
    restore_mark,
    sort_dead_letters,
)
from streaming.api.job_key import JobKey

KEY = JobKey.derive("s" * 32, "orders", cluster="test-cluster")


def _sent(generation: int, after: int) -> list[tuple[str, bytes]]:
    return [("spark-abs-generation", str(generation).encode()), ("spark-abs-after-checkpoint", str(after).encode())]


@pytest.mark.integration
def test_dead_letters_keep_the_record_and_its_reason(connection, unique_name, read_partition):
    letters = DeadLetterTopic(connection.kafka, unique_name)
    letters.send(ChannelId("in", 1), 42, b"k", b"{broken", [("h", b"v")], "value is not JSON")
    # a record larger than the producer may send is kept truncated, with a note, not lost and
    # not failing the task (before: kafka-python refused it, MessageSizeTooLargeError)
    huge = bytes(range(256)) * 8192  # 2 MiB
    letters.send(ChannelId("in", 0), 7, b"k", huge, [("h", b"v")], "value is not JSON")
    letters.flush()
    assert letters.count == 2
    record, cut = read_partition(connection.kafka, letters.topic, 0)
    headers = dict(record.headers)
    assert (record.key, record.value) == (b"k", b"{broken")
    assert headers["spark-abs-reason"] == b"value is not JSON" and "spark-abs-truncated" not in headers
    assert (headers["spark-abs-source"], headers["spark-abs-source-offset"], headers["h"]) == (b"in:1", b"42", b"v")

    headers = dict(cut.headers)
    assert 900_000 < len(cut.value) < 1 << 20 and huge.startswith(cut.value)
    assert headers["spark-abs-truncated"] == b"value"
    assert headers["spark-abs-original-bytes"] == str(len(huge)).encode()
    assert headers["spark-abs-original-sha256"] == hashlib.sha256(huge).hexdigest().encode()
    assert headers["spark-abs-reason"] == b"value is not JSON" and headers["h"] == b"v"

    # generation 0 sent one after checkpoint 4; generation 1 starts from 3 and sends it again: read
    # back, each record is one letter, the newest (the two above had no notes: never superseded)
    key = JobKey.derive("s" * 32, unique_name, cluster="test-cluster")
    letters.send(ChannelId("in", 0), 8, b"k", b"first", [], "value is not JSON", _sent(0, 4))
    letters.mark_restore(Restored(1, 3), key)
    letters.send(ChannelId("in", 0), 7, b"k", b"again", [], "value is not JSON", _sent(1, 3))
    letters.flush()
    found = read_dead_letters(connection.kafka, unique_name, key)
    assert [r.value for r in found.letters] == [b"{broken", cut.value, b"again"]
    assert found.restores == [Restored(1, 3)] and [r.value for r in found.superseded] == [b"first"]
    letters.close()


@dataclass
class _Record:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    offset: int = 0


def _mark(restored: Restored, key: JobKey = KEY) -> _Record:
    return _Record(*restore_mark(restored, key))


def test_a_restore_supersedes_the_letters_older_generations_sent_after_its_checkpoint():
    letter = {
        name: _Record(None, name.encode(), _sent(*at))
        for name, at in {
            "before": (0, 2),  # gen 0 after checkpoint 2: covered by checkpoint 3, not read again
            "replayed": (0, 3),  # gen 0 after checkpoint 3: read again from 3
            "later": (0, 5),  # a snapshot the restore did not keep (5 never completed)
            "own": (1, 3),  # generation 1's own, from 3: covered by checkpoint 4, which generation 2 restores
            "next": (2, 4),  # generation 2's: no restore after it
        }.items()
    }
    # a mark counts wherever it is: a worker of an older generation may still send after it
    records = [letter["before"], _mark(Restored(1, 3)), letter["replayed"], letter["own"], letter["later"]]
    found = sort_dead_letters([*records, _mark(Restored(2, 4)), letter["next"]], KEY)
    assert [r.value for r in found.letters] == [b"before", b"own", b"next"]
    assert [r.value for r in found.superseded] == [b"replayed", b"later"]
    assert found.restores == [Restored(1, 3), Restored(2, 4)]
    # from the beginning (no complete checkpoint): every older letter is superseded
    assert Restored(1, 0).supersedes(0, 0) and not Restored(1, 0).supersedes(1, 0)


def test_only_the_jobs_own_restore_marks_count():
    letter = _Record(None, b"x", _sent(0, 7))
    forged = _mark(Restored(9, 0), JobKey.derive("other" * 8, "orders", cluster="test-cluster"))
    unsigned = _Record(b"spark-abs-restored", b'{"generation": 9, "checkpoint": 0}', [], offset=12)
    tampered = _mark(Restored(1, 8))
    tampered.value = b'{"generation": 1, "checkpoint": 0}'
    found = sort_dead_letters([letter, forged, unsigned, tampered], KEY)
    assert found.letters == [letter] and found.restores == [] and len(found.ignored) == 3
    assert "offset 12: a restore mark not signed by job orders" in found.ignored
    # a letter whose notes do not read (someone else wrote it) is never superseded
    odd = _Record(None, b"y", [("spark-abs-generation", b"zz"), ("spark-abs-after-checkpoint", b"9")])
    assert sort_dead_letters([odd, _mark(Restored(1, 0))], KEY).letters == [odd]


def test_a_dead_letter_too_large_to_send_is_cut_with_a_note_of_what_it_was():
    notes = [("spark-abs-reason", b"value is not JSON")]
    assert fit_dead_letter(b"k", b"v" * 100, [("h", b"x")], notes, 1000) == (b"k", b"v" * 100, [("h", b"x"), *notes])

    value = bytes(range(256)) * 40
    key, cut, headers = fit_dead_letter(b"k", value, [("h", b"x")], notes, 4000)
    said = dict(headers)
    assert key == b"k" and value.startswith(cut) and 3000 < len(cut) < 4000
    assert said["spark-abs-truncated"] == b"value" and said["h"] == b"x"
    assert said["spark-abs-original-bytes"] == b"10240"
    assert said["spark-abs-original-sha256"] == hashlib.sha256(value).hexdigest().encode()

    # headers alone over the size: they go too, and the key is cut
    key, cut, headers = fit_dead_letter(b"k" * 5000, value, [("h", b"x" * 5000)], notes, 4000)
    said = dict(headers)
    assert said["spark-abs-truncated"] == b"value,headers,key" and "h" not in said
    assert len(key) == 1000 and value.startswith(cut)
    assert sum(len(k) + len(v) for k, v in headers) + len(key) + len(cut) < 4000

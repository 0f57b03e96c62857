"""What a task does with records its stage's code raises on
(``streaming.engine.task.record_errors.RecordErrors``): the job's policy
(``fail`` stops the job naming the records) and its brake (past a count,
or a share of the records of a checkpoint interval, the job stops naming
the first records), counted per checkpoint interval."""

from __future__ import annotations

import pytest
from task_cases import batch, make_task

from barriers.messages import ChannelId
from spark_abs_examples import carts
from streaming.engine.task.record_errors import FAIL, RecordErrors
from streaming.errors import RecordErrorsStop

IN = ChannelId("in", 0)


def test_with_record_errors_fail_the_first_raise_stops_the_job_naming_the_records():
    errors = RecordErrors("s-0", FAIL)
    with pytest.raises(RecordErrorsStop, match=r"stage s raised ValueError: bad on the records at in:0 offsets 4\.\.9"):
        errors.met(IN, [4, 5, 9], ValueError("bad"), "s")


def test_the_brake_stops_the_job_past_a_count_in_one_interval_naming_the_first_records():
    errors = RecordErrors("s-0", max_records=3, max_share=1.0)
    errors.processed(1000)
    for offset in range(3):
        errors.isolate(IN, offset, ValueError(f"bad {offset}"))
    with pytest.raises(RecordErrorsStop) as stopped:
        errors.isolate(IN, 3, ValueError("bad 3"))
    message = str(stopped.value)
    assert "more than max_isolated_records (3)" in message
    assert "in:0 offset 0: ValueError: bad 0" in message and "in:0 offset 3: ValueError: bad 3" in message


def test_the_brake_counts_per_checkpoint_interval():
    errors = RecordErrors("s-0", max_records=3, max_share=1.0)
    for _ in range(5):
        errors.processed(100)
        for offset in range(3):
            errors.isolate(IN, offset, ValueError("bad"))
        assert errors.interval_ended() is False  # nothing said a state was put back


def test_the_brake_stops_a_job_whose_code_fails_on_most_records_from_the_tenth_on():
    errors = RecordErrors("s-0", max_records=1000, max_share=0.5)
    errors.processed(12)
    for offset in range(9):
        errors.isolate(IN, offset, ValueError("bad"))  # 9 of 12: below the floor of ten
    with pytest.raises(RecordErrorsStop, match=r"10 of 12 records, more than max_isolated_share \(0\.5\)"):
        errors.isolate(IN, 9, ValueError("bad"))


def test_a_state_put_back_is_said_once_at_the_end_of_its_interval():
    errors = RecordErrors("s-0")
    errors.met(IN, [1], ValueError("bad"), "s")  # isolate: goes on
    assert errors.interval_ended() is False
    errors.rolled_back = True
    assert errors.interval_ended() is True
    assert errors.interval_ended() is False


def test_a_task_whose_code_fails_on_every_record_stops_at_the_brake_naming_the_first_records():
    pipeline = carts.pipeline("braked")
    task, io = make_task(pipeline, "abandoned-carts-0", sink=True, job_key=b"k" * 32)
    # a bug that breaks every record: every item comes without a price
    events = [{"user": f"u{i}", "action": "add", "price": None, "ts": 1_000 + i} for i in range(40)]
    with pytest.raises(RecordErrorsStop) as stopped:
        task.process_batch(batch(*((pipeline.ingress[0].topic, 0, i, e) for i, e in enumerate(events))))
    said = str(stopped.value)
    assert "21 of 40 records, more than max_isolated_share (0.5)" in said
    assert "the job stops rather than send the stream" in said and "offset 0: TypeError: unsupported operand" in said
    assert [offset for _, offset, _ in io.dead] == list(range(21))  # set aside up to the brake, then the job stops

"""What an error says of the names there are, when a name given is not one of them."""

from __future__ import annotations

from streaming.errors import RecordsFailed, failed_at, names_like


def test_the_names_spelt_like_the_one_given_come_first():
    assert names_like("ordres", ["orders", "payments"], "jobs in the store") == (
        "did you mean 'orders'? jobs in the store: orders, payments"
    )


def test_no_names_and_no_close_name():
    assert names_like("x", [], "jobs in the store") == "there are no jobs in the store"
    assert names_like("zzz", ["orders"], "jobs") == "jobs: orders"


def test_many_names_are_counted_not_all_listed():
    names = [f"job-{i:02d}" for i in range(20)]
    said = names_like("job-7", names, "jobs", listed=3)
    assert said.startswith("did you mean ")
    assert "20 jobs, the first: job-00, job-01, job-02, ..." in said
    assert "job-19" not in said.split("the first:")[1]


def test_where_a_task_failed_is_read_back_from_the_last_words_of_its_worker():
    said = RecordsFailed("legs-0", "money.transfers:1", 40, 199, "ZeroDivisionError: division by zero")
    log = f"26/11/28 ERROR a line\nTraceback ...\nstreaming.errors.RecordsFailed: {said}\n  | more"
    assert failed_at(log) == ("legs-0", "money.transfers:1", 40, 199, "ZeroDivisionError: division by zero")
    assert failed_at("worker: stage query failed: something else") is None

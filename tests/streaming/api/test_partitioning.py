"""A pipeline checked before it runs (``streaming.api.partitioning.check``): each partitioning that
gives wrong answers without a failure is refused with the stage, the input
and the fix; legitimate partitionings, and the explicit opt-in, pass."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import Chain, KeyedAggregate, LatestValueJoin, TumblingWindowAggregate, count, filter_rows, sum_
from streaming.api.partitioning import check
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.errors import ConfigError

ORDERS = Ingress("orders", 2, event_time="ts")
CUSTOMERS = Ingress("customers", 1)


def keep():
    return filter_rows(lambda t: pc.greater(t["amount"], 0))


def by_customer():
    return KeyedAggregate("customer", {"n": count()})


def join():
    return LatestValueJoin("customer", "id", left="valid", right="customers")


def enrich_pipeline(*, customers=CUSTOMERS, join_tasks=2, stages=()) -> Pipeline:
    return Pipeline(
        "shop",
        (ORDERS, customers),
        (
            Stage("valid", ("orders",), keep, parallelism=2, key="customer"),
            Stage("enrich", ("valid", "customers"), join, parallelism=join_tasks, key="country", sink=Sink()),
            *stages,
        ),
    )


def refused(pipeline: Pipeline, *fragments: str) -> str:
    with pytest.raises(ConfigError) as failure:
        check(pipeline)
    message = str(failure.value)
    for fragment in fragments:
        assert fragment in message
    return message


def test_a_join_whose_table_side_cannot_reach_every_task_is_refused():
    refused(
        enrich_pipeline(),
        "stage enrich: input customers has 1 partition(s) for 2 tasks",
        "tasks 1..1 never see it",
        "give customers at least 2 partitions",
    )


def test_a_table_side_not_partitioned_by_the_join_key_is_refused():
    message = refused(
        enrich_pipeline(customers=Ingress("customers", 2)),
        "stage enrich: keeps state by 'id' with 2 tasks but reads ingress customers by partition",
        "does not say how it is partitioned",
        "route customers through a stage keyed by 'id'",
    )
    assert "trust_partitioning=True" in message


def test_a_table_side_partitioned_by_the_key_still_does_not_meet_rows_routed_by_a_stage():
    # Kafka partitions the table by its own hash, the stage routes orders by ours: keys do not meet
    refused(
        enrich_pipeline(customers=Ingress("customers", 2, key="id")),
        "reads ingress customers by partition beside inputs routed otherwise",
    )


def test_a_table_side_routed_through_a_stage_keyed_by_the_join_key_passes():
    pipeline = Pipeline(
        "shop",
        (ORDERS, Ingress("customers", 1)),
        (
            Stage("valid", ("orders",), keep, parallelism=2, key="customer"),
            Stage("by-id", ("customers",), lambda: filter_rows(lambda t: pc.is_valid(t["id"])), key="id"),
            Stage(
                "enrich",
                ("valid", "by-id"),
                lambda: LatestValueJoin("customer", "id", left="valid", right="by-id"),
                parallelism=2,
                sink=Sink(),
            ),
        ),
    )
    check(pipeline)


def test_keyed_state_read_by_partition_is_refused_unless_the_producers_partition_by_its_key():
    def pipeline(ingress: Ingress, **stage) -> Pipeline:
        return Pipeline(
            "p", (ingress,), (Stage("count", ("orders",), by_customer, parallelism=2, sink=Sink(), **stage),)
        )

    refused(pipeline(Ingress("orders", 2)), "does not say how it is partitioned")
    refused(pipeline(Ingress("orders", 2, key="account")), "says producers partition it by 'account'")
    check(pipeline(Ingress("orders", 2, key="customer")))
    check(pipeline(Ingress("orders", 2), trust_partitioning=True))  # the explicit opt-in
    check(Pipeline("p", (Ingress("orders", 2),), (Stage("count", ("orders",), by_customer, sink=Sink()),)))


def test_an_upstream_stage_routing_by_another_column_is_refused():
    pipeline = Pipeline(
        "p",
        (ORDERS,),
        (
            Stage("valid", ("orders",), keep, parallelism=2, key="account"),
            Stage("count", ("valid",), by_customer, parallelism=2, sink=Sink()),
        ),
    )
    refused(pipeline, "input valid routes its rows by 'account'", "keeps state by 'customer'", "key='customer'")


def test_one_stage_keeping_state_by_two_keys_with_several_tasks_is_refused():
    def enrich_and_window():
        return Chain(
            LatestValueJoin("customer", "id", left="valid", right="by-id"),
            TumblingWindowAggregate("country", "ts", 10_000, {"total": sum_("amount")}),
        )

    pipeline = Pipeline(
        "shop",
        (ORDERS, Ingress("customers", 1)),
        (
            Stage("valid", ("orders",), keep, parallelism=2, key="customer"),
            Stage("by-id", ("customers",), lambda: filter_rows(lambda t: pc.is_valid(t["id"])), key="id"),
            Stage("enrich", ("valid", "by-id"), enrich_and_window, parallelism=2, sink=Sink()),
        ),
    )
    refused(pipeline, "stage enrich: its operators keep state by 'customer' and by 'country'", "split it")


def test_event_time_operators_without_event_time_are_refused():
    def windows():
        return TumblingWindowAggregate("customer", "ts", 1_000, {"n": count()})

    pipeline = Pipeline(
        "p",
        (Ingress("orders", 1),),
        (Stage("valid", ("orders",), keep, key="customer"), Stage("w", ("valid",), windows, sink=Sink())),
    )
    refused(
        pipeline,
        "stage w: its operator follows event time, but none of its inputs (valid) carries event time",
        "ingress upstream: orders",
        "event_time='<column>'",
    )


def test_an_operator_that_does_not_say_its_key_may_not_read_by_partition_with_several_tasks():
    class Custom:
        def process(self, batch: pa.Table) -> pa.Table:
            return batch

        def snapshot(self):
            return {"seen": pa.table({"n": [0]})}

        def restore(self, state):
            pass

    pipeline = Pipeline("p", (Ingress("orders", 2),), (Stage("c", ("orders",), Custom, parallelism=2, sink=Sink()),))
    refused(pipeline, "keeps state whose key it does not declare (no state_keys)")
    check(Pipeline("p", (Ingress("orders", 2),), (Stage("c", ("orders",), keep, parallelism=2, sink=Sink()),)))


def test_every_problem_is_listed_at_once():
    message = refused(enrich_pipeline(customers=Ingress("customers", 1), join_tasks=3))
    assert message.count("\n  - ") == 2  # the table side reaches 1 of 3 tasks, and is not partitioned by id


def unreachable_table() -> Pipeline:
    return enrich_pipeline()


def test_run_refuses_the_pipeline_before_it_starts(capsys, tmp_path):
    from streaming.tools.cli import main

    assert main(["run", "test_partitioning:unreachable_table", "--store", tmp_path.as_uri()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spark-abs: error: pipeline shop cannot run as declared:")
    assert "stage enrich: input customers has 1 partition(s) for 2 tasks" in err and "Traceback" not in err

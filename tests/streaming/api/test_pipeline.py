"""Pipeline definitions: validation with clear errors, and the channels every
task reads and writes (one writer per internal partition)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from barriers.messages import ChannelId
from operators import filter_rows
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage, route
from streaming.errors import ConfigError


def _op():
    return filter_rows(lambda t: pa.array([True] * t.num_rows))


def three_stages(**changes) -> Pipeline:
    stages = {
        "a": Stage("a", ("transfers",), _op, parallelism=2, key="account"),
        "b": Stage("b", ("a",), _op, parallelism=3, key="window"),
        "c": Stage("c", ("b",), _op, sink=Sink()),
    }
    stages.update(changes)
    return Pipeline("money", (Ingress("transfers", 4),), tuple(s for s in stages.values() if s is not None))


def test_tasks_read_their_channels_and_are_the_only_writers_of_theirs():
    pipeline = three_stages()
    tasks = {t.name: t for t in pipeline.tasks()}
    assert sorted(tasks) == ["a-0", "a-1", "b-0", "b-1", "b-2", "c-0"]
    assert set(tasks["a-1"].inputs) == {ChannelId("transfers", 1), ChannelId("transfers", 3)}
    assert pipeline.internal_topics() == {"spark-abs.money.a": 6, "spark-abs.money.b": 3}
    written = [c for t in tasks.values() for c in t.outputs]
    read = [c for t in tasks.values() for c in t.inputs if c.topic.startswith("spark-abs.")]
    assert sorted(written) == sorted(read) and len(set(written)) == len(written)
    assert tasks["b-2"].inputs == {ChannelId("spark-abs.money.a", 2): "a", ChannelId("spark-abs.money.a", 5): "a"}
    assert tasks["c-0"].outputs == ()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"b": Stage("b", ("nope",), _op, key="w")}, "neither an ingress topic nor a stage"),
        ({"b": Stage("b", (), _op, key="w")}, "has no input"),
        ({"b": Stage("b", ("a", "c"), _op, key="w")}, "cycle"),
        ({"b": Stage("b", ("b",), _op, key="w")}, "reads its own output"),
        ({"c": Stage("c", ("b",), _op)}, "goes nowhere"),
        ({"c": Stage("c", ("b", "a"), _op, sink=Sink())}, "read by both"),
        ({"a": Stage("a", ("transfers",), _op, parallelism=2)}, "needs a key column"),
        ({"a": Stage("a", ("transfers",), _op, parallelism=0, key="k")}, "parallelism"),
        ({"a": Stage("a b", ("transfers",), _op, key="k")}, "stage name"),
        ({"a": Stage("a", ("transfers",), "not callable", key="k")}, "factory"),
    ],
)
def test_bad_pipelines_fail_at_start_with_a_clear_message(changes, message):
    with pytest.raises(ConfigError, match=message):
        three_stages(**changes)


def test_more_tasks_than_ingress_partitions_is_an_error():
    pipeline = Pipeline("j", (Ingress("in", 1),), (Stage("s", ("in",), _op, parallelism=2, sink=Sink()),))
    with pytest.raises(ConfigError, match="more tasks than its ingress topics have partitions"):
        pipeline.tasks()


def test_sinks_validate_their_options():
    with pytest.raises(ConfigError, match="needs a topic"):
        Sink("kafka")
    with pytest.raises(ConfigError, match="use one of 'object-store', 'kafka', 'delta'"):
        Sink("ftp")
    with pytest.raises(ConfigError, match="a kafka sink takes no table"):
        Sink("kafka", "t", table="/tmp/t")
    with pytest.raises(ConfigError, match="three slashes"):
        Sink("delta", table="file://tables/t")
    assert Sink("delta").table is None and Sink("delta", table="s3://lake/t").table == "s3://lake/t"


def test_route_is_a_stable_hash_of_the_key():
    table = pa.table({"account": ["x", "y", "x", None]})
    targets = route(table, "account", 3).to_pylist()
    assert targets[0] == targets[2] and all(0 <= t < 3 for t in targets)
    assert route(table, "account", 3).to_pylist() == targets
    assert route(table, None, 1).to_pylist() == [0, 0, 0, 0]
    with pytest.raises(ConfigError, match="no key column"):
        route(table, "missing", 2)


def test_a_reference_passes_keyword_arguments_to_the_pipeline_function():
    from streaming.api.pipeline import load_pipeline

    pipeline = load_pipeline("streaming.tools.compare.slow:slow_pipeline?ms_per_record=10", "slow-x")
    assert pipeline.job == "slow-x" and pipeline.stages[0].name == "slow"
    with pytest.raises(ConfigError, match="unexpected keyword argument 'speed'"):
        load_pipeline("streaming.tools.compare.slow:slow_pipeline?speed=3", "slow-x")
    with pytest.raises(ConfigError, match="'job' cannot be a keyword argument"):
        load_pipeline("streaming.tools.compare.slow:slow_pipeline?job=other", "slow-x")
    with pytest.raises(ConfigError, match="name=value"):
        load_pipeline("streaming.tools.compare.slow:slow_pipeline?ms_per_record", "slow-x")
    with pytest.raises(ConfigError, match="non-negative"):
        load_pipeline("streaming.tools.compare.slow:slow_pipeline?ms_per_record=fast", "slow-x")


SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64())])
SQL = "SELECT _position, user FROM {input}"


@pytest.mark.parametrize(
    ("ingress", "stage", "message"),
    [
        ((Ingress("a", 1, SCHEMA),), Stage("s", ("a",), sink=Sink()), "give it an operator, Spark code"),
        ((Ingress("a", 1, SCHEMA),), Stage("s", ("a",), spark="SELECT * FROM orders", sink=Sink()), "reading {input}"),
        ((Ingress("a", 1),), Stage("s", ("a",), spark=SQL, sink=Sink()), "Spark decodes a with its schema"),
        (
            (Ingress("a", 1, SCHEMA), Ingress("b", 1, SCHEMA)),
            Stage("s", ("a", "b"), spark=SQL, sink=Sink()),
            "not both and not two topics",
        ),
    ],
)
def test_a_stage_of_spark_code_reads_one_ingress_topic_with_a_schema(ingress, stage, message):
    with pytest.raises(ConfigError, match="stage s") as refused:
        Pipeline("job", ingress, (stage,))
    assert message in str(refused.value)


def _op():
    from operators.stateless import Passthrough

    return Passthrough()


OTHER = pa.schema([("user", pa.string()), ("amount", pa.float64())])


@pytest.mark.parametrize(
    ("upstream", "inputs", "message"),
    [
        ((Stage("u", ("a",), _op),), ("u",), "give Stage('u', ..., schema=pa.schema([...]))"),
        ((Stage("u", ("a",), _op, spark=SQL),), ("u",), "give Stage('u', ..., schema=pa.schema([...]))"),
        ((Stage("u", ("a",), _op, schema=SCHEMA),), ("u", "a"), "not both"),
        (
            (Stage("u", ("a",), _op, schema=SCHEMA), Stage("v", ("a",), _op, schema=OTHER)),
            ("u", "v"),
            "their rows must have one schema",
        ),
    ],
)
def test_spark_code_after_stages_needs_their_rows_schema_and_one_for_a_union(upstream, inputs, message):
    with pytest.raises(ConfigError, match="stage s") as refused:
        Pipeline("job", (Ingress("a", 1, SCHEMA),), (*upstream, Stage("s", inputs, spark=SQL, sink=Sink())))
    assert message in str(refused.value)


def test_spark_code_may_follow_declared_stages_and_spark_code_without_an_operator():
    Pipeline(
        "job",
        (Ingress("a", 1, SCHEMA),),
        (
            Stage("u", ("a",), _op, schema=SCHEMA),
            Stage("v", ("a",), _op, schema=SCHEMA.with_metadata({"from": "v"})),  # metadata is not the rows
            Stage("w", ("a",), spark=SQL),
            Stage("s", ("u", "v"), spark=SQL, sink=Sink()),
            Stage("t", ("w",), spark=SQL, sink=Sink()),
        ),
    )


def test_a_stage_of_spark_code_alone_passes_its_rows_on():
    pipeline = Pipeline("job", (Ingress("a", 1, SCHEMA),), (Stage("s", ("a",), spark=SQL, sink=Sink()),))
    rows = pa.table({"user": ["x"]})
    assert pipeline.stage("s").make_operator().process(rows) is rows


@pytest.mark.parametrize(
    "options, message",
    [
        ({"idle_after_event_time": 1_000}, "name the event-time column too"),
        ({"event_time": "ts", "idle_after_event_time": 0}, "idle_after_event_time must be > 0"),
        ({"event_time": "ts", "idle_after_event_time": -5}, "idle_after_event_time must be milliseconds"),
    ],
)
def test_idleness_by_event_time_is_declared_with_the_event_time_column(options, message):
    with pytest.raises(ConfigError, match=message):
        Ingress("orders", 2, pa.schema([("ts", pa.int64())]), **options)
    ingress = Ingress("orders", 2, event_time="ts", idle_after_event_time=dt.timedelta(seconds=3))
    assert ingress.idle_after_event_time == 3_000


def test_a_pipeline_is_loaded_by_its_name_and_an_unknown_name_lists_the_known():
    from streaming.api.pipeline import load_pipeline, pipeline_reference

    assert pipeline_reference("changing?shape=added") == "spark_abs_examples.changing:pipeline?shape=added"
    pipeline = load_pipeline("changing?shape=added", "named")
    assert pipeline.job == "named" and [s.name for s in pipeline.stages] == ["clean", "seen", "counts"]
    with pytest.raises(ConfigError, match=r"no pipeline of that name \(known: .*money.*orders.*\).*module:attribute"):
        load_pipeline("ordres", "named")

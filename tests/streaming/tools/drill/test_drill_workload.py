"""The drill's workload protocol, without services: every pipeline of
``examples/`` and the money pipeline provide a ``DrillWorkload`` from their
module (``drill_workload()``), found from the pipeline's reference or its
short name; the examples' input goes on without end in rounds, each after
the one before in event time, with new ids; a module without one is refused
naming the protocol."""

from __future__ import annotations

import collections
import itertools
import json
import random

import pyarrow as pa
import pytest

import spark_abs_examples as examples
from spark_abs_examples import money as money_example
from streaming.adapters.serde import avro
from streaming.api.pipeline import load_pipeline, named_pipelines, pipeline_reference
from streaming.api.producing import MAX_WATERMARK
from streaming.errors import ConfigError
from streaming.tools.drill import run as drill
from streaming.tools.drill.workload import workload_for

# per example, the column that names an input row, per ingress topic's last part
IDS = {
    "orders": {"orders": "order_id", "customers": "id"},
    "clickstream": {"clicks": None},
    "payments": {"payments": "payment_id", "authorisations": "auth_id"},
    "devices": {"events": None},  # a resent event carries its id again
    "carts": {"cart-events": None},
}

# the pipelines known by name
PIPELINES = named_pipelines()


def _rows(pipeline, records) -> list[tuple[str, int, dict]]:
    """(topic's last part, partition, decoded row) of each record."""
    ingress = {i.topic: i for i in pipeline.ingress}
    out = []
    for r in records:
        spec = ingress[r.topic]
        if spec.avro is None:
            row = json.loads(r.value)
        else:
            table, _, rejected = avro.decode(pa.array([r.value], pa.binary()), spec.avro)
            assert rejected == []
            row = table.to_pylist()[0]
        out.append((r.topic.removeprefix(f"{pipeline.job}."), r.partition, row))
    return out


def test_every_named_pipeline_but_the_changing_one_has_a_module_that_provides_a_drill_workload():
    assert set(PIPELINES) == {"money", "broken-money", "changing", *examples.NAMES}
    for name, ref in PIPELINES.items():
        assert pipeline_reference(name) == ref
        if name == "changing":
            with pytest.raises(ConfigError, match=r"defines no drill_workload\(\)"):
                workload_for(ref)
            continue
        workload = workload_for(ref)
        assert isinstance(workload, drill.DrillWorkload), name
        assert workload.keys, name
    assert workload_for("spark_abs_examples.money:pipeline").sums == ("net", "legs")
    # arguments after ? are the pipeline's; the broken money pipelines take the money workload
    assert workload_for("spark_abs_examples.broken_money:pipeline?broken=lose").keys == ("account", "window_start")
    assert pipeline_reference("shop:pipeline") == "shop:pipeline"


def test_a_module_without_the_protocol_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"defines no drill_workload\(\).*--workload module:function"):
        workload_for("streaming.tools.smoke.run:pipeline")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        workload_for("no_such_module:pipeline")


def test_a_workload_named_module_colon_function_must_be_a_drill_workload():
    assert drill.load_workload("spark_abs_examples.money:drill_workload").sums == ("net", "legs")
    with pytest.raises(ConfigError, match="expected module:function"):
        drill.load_workload("nocolon")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        drill.load_workload("streaming.tools.drill.run:no_such_workload")
    with pytest.raises(ConfigError, match="not a DrillWorkload"):
        drill.load_workload("spark_abs_examples.money:pipeline")


class _SchemasInMemory:
    """What the devices example's producer and the Avro decoder ask of a
    schema registry, kept in this process (the real one is the local
    runtime's, in the integration tests)."""

    def __init__(self):
        self.schemas: list[str] = []

    def register(self, subject: str, schema: str) -> int:
        if schema not in self.schemas:
            self.schemas.append(schema)
        return self.schemas.index(schema) + 1

    def parsed(self, schema_id: int):
        import fastavro

        return fastavro.parse_schema(json.loads(self.schemas[schema_id - 1]))

    def writer(self, schema_id: int, subject: str):
        return self.parsed(schema_id)


@pytest.fixture
def schemas(monkeypatch):
    from streaming.adapters.serde import schema_registry as registry

    kept = _SchemasInMemory()
    monkeypatch.setattr(registry, "_current", kept)
    return kept


@pytest.mark.parametrize("name", examples.NAMES)
def test_an_example_workload_goes_on_in_rounds_in_event_time_order_with_new_ids(name, schemas):
    module = examples.example(name)
    pipeline = load_pipeline(PIPELINES[name], "drillw")
    seed = random.Random(4).randrange(1 << 30)  # the seed the workload draws from the drill's
    one_round = len(module.records("drillw", seed=seed))
    records = list(itertools.islice(workload_for(PIPELINES[name]).records(pipeline, random.Random(4)), 3 * one_round))
    rows = _rows(pipeline, records)
    # the rounds follow on: within a partition event time never goes back further than the ingress allows
    bound = {i.topic.removeprefix("drillw."): i.max_out_of_orderness for i in pipeline.ingress}
    latest: dict[tuple[str, int], int] = {}
    for topic, partition, row in rows:
        if "ts" in row:
            seen = latest.get((topic, partition), row["ts"])
            assert row["ts"] >= seen - bound[topic], (topic, partition, row, seen)
            latest[(topic, partition)] = max(seen, row["ts"])
    # a row's id is never used again by a later round
    for topic, column in IDS[name].items():
        if column is not None:
            ids = collections.Counter(row[column] for t, _, row in rows if t == topic)
            assert ids and max(ids.values()) == 1, (topic, ids.most_common(3))
    # round 0 is the example's own input, and later rounds bring more event time
    first = [(r.topic, r.partition, r.value) for r in records[:one_round]]
    assert first == module.records("drillw", seed=seed)
    times = [row["ts"] for _, _, row in rows if "ts" in row]
    assert max(times[len(times) // 2 :]) > max(times[: len(times) // 3])


def test_an_example_workload_closes_every_ingress_partition():
    pipeline = load_pipeline(PIPELINES["orders"], "drillw")
    closing = workload_for(PIPELINES["orders"]).closing(pipeline)
    assert {(r.topic, r.partition) for r in closing} == {
        ("drillw.orders", 0),
        ("drillw.orders", 1),
        ("drillw.orders", 2),
        ("drillw.customers", 0),
    }
    assert all(r.value == b"" and str(MAX_WATERMARK).encode() in dict(r.headers).values() for r in closing)


def test_the_money_workload_makes_transfers_and_a_few_malformed_records():
    records = money_example.drill_workload(malformed_every=50).records(money_example.pipeline("w"), random.Random(1))
    first = [next(records) for _ in range(2000)]
    malformed = [r for r in first if r.malformed]
    assert 20 <= len(malformed) <= 70 and all(not r.value.startswith(b'{"') for r in malformed)
    transfers = [json.loads(r.value) for r in first if not r.malformed]
    assert [t["id"] for t in transfers] == list(range(len(transfers)))
    assert all(r.partition == json.loads(r.value)["id"] % 2 for r in first if not r.malformed)


def test_a_workload_names_the_reasons_its_pipeline_quarantines_by_design():
    from streaming.tools.drill.workload import DrillWorkload

    def records(pipeline, rng):
        yield from ()

    def reference(spark, pipeline, kafka):
        return None

    plain = DrillWorkload(records, reference, keys=("k",), sums=("n",))
    assert not plain.by_design("Validate: amount below zero")
    validating = DrillWorkload(records, reference, keys=("k",), sums=("n",), quarantined=(r"^Validate: amount",))
    assert validating.by_design("Validate: amount below zero")
    assert not validating.by_design("value is not JSON") and not validating.by_design("TumblingWindowAggregate: late")
    with pytest.raises(ConfigError, match=r"quarantined: '\(' is not a regular expression"):
        DrillWorkload(records, reference, keys=("k",), sums=("n",), quarantined=("(",))
    with pytest.raises(ConfigError, match=r"a tuple of patterns, e.g. \('\^Validate',\), not a string"):
        DrillWorkload(records, reference, keys=("k",), sums=("n",), quarantined="^Validate")
    for everything in ("", ".*", "^"):  # each would accept every dead letter
        with pytest.raises(ConfigError, match="matches an empty reason, so it would accept every dead letter"):
            DrillWorkload(records, reference, keys=("k",), sums=("n",), quarantined=(everything,))

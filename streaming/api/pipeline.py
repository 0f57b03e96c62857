"""A pipeline: ingress topics, stages (each an operator over the records of
one epoch plus its state) and the topics between them, a sink at the end.

Validated when built (unknown topic, cycle, a stage without input, a stage
output read twice, bad parallelism), and turned into *tasks*: each task of a
stage reads its own set of channels and is the only writer of its own
partitions downstream.  An internal topic between stage U (``p_U`` tasks) and
stage S (``p_S`` tasks) has ``p_U * p_S`` partitions: task ``u`` writes
partition ``u * p_S + s`` for rows routed to task ``s`` (by the hash of the
stage's ``key`` column), and task ``s`` reads ``{u * p_S + s}``.  One writer
per partition keeps every channel FIFO with exactly one barrier n."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import importlib
import importlib.metadata
import json
import re
import urllib.parse
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from barriers.messages import ChannelId
from streaming.api.avro_schema import AvroSchema, avro_schema, subject_of
from streaming.api.settings import check_store_uri
from streaming.api.topics import stage_topic
from streaming.errors import ConfigError, parse_choice

__all__ = [
    "Ingress",
    "Stage",
    "SparkCode",
    "Sink",
    "SinkKind",
    "Pipeline",
    "Scale",
    "TaskSpec",
    "route",
    "duration_ms",
    "load_pipeline",
    "pipeline_module",
    "same_pipeline",
    "named_pipelines",
    "pipeline_reference",
    "parse_parallelism",
    "PIPELINE_ENTRY_POINTS",
]

# the entry-point group of pipelines known by name (``spark-abs run orders``):
# spark-abs registers its examples there, and any installed package may add its own
PIPELINE_ENTRY_POINTS = "spark_abs.pipelines"

_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")

OperatorFactory = Callable[[], object]


def duration_ms(value: int | dt.timedelta | None, what: str) -> int | None:
    """``value`` (whole milliseconds, or a ``timedelta``) as an int >= 0;
    None stays None.  Anything else is a ``ConfigError`` naming ``what``."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        whole, rest = divmod(value, dt.timedelta(milliseconds=1))
        if rest:
            raise ConfigError(f"{what} must be whole milliseconds, got {value}")
        value = whole
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} must be milliseconds (an int >= 0) or a timedelta, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Ingress:
    """An ingress topic fed by external producers: JSON values, or Avro.

    - ``schema``: the Arrow schema of its rows (JSON values are decoded to
      it: missing fields are null, extra ones ignored).  A field declared
      not null (``pa.field("amount", pa.int64(), nullable=False)``) is
      required: a record without it, or with it null, is a dead letter
      naming the field.  None: inferred per batch.
    - ``avro``: an Avro record schema (JSON text or a dict): the values are
      Avro records of it (``streaming.adapters.serde.avro``) and ``schema`` is
      taken from it.  ``confluent_wire``: each value starts with the five
      bytes of Confluent's serializers (a zero, the schema id).
      ``registry``: that id names the schema the producer wrote the value
      with, looked up in the job's schema registry (``Connection.schema_registry``)
      and resolved to ``avro``, the reader's schema, by Avro's rules: a
      producer may evolve its schema compatibly mid-stream (add a field
      with a default, drop one, widen a type).  A value whose id the
      registry does not have, or whose schema does not resolve, is a dead
      letter saying so.

    Event time is declared here, where the data enters, as Flink's
    ``WatermarkStrategy`` and Spark's ``withWatermark`` declare it:

    - ``event_time``: the column (int milliseconds, or a timestamp) that
      event-time operators (windows, interval joins, deduplication, timers)
      follow.  Without it the topic carries no event time (a table, a
      changelog) and never holds a watermark back.
    - ``max_out_of_orderness``: how far behind the newest event time of its
      partition a record may still come (ms or a ``timedelta``); a
      partition's watermark is its highest event time minus this.  A record
      further behind is late wherever its window already closed.
    - ``idle_timeout``: a partition that brought no record for this long (ms
      or a ``timedelta``, wall clock) stops holding the watermark back once
      a micro-batch comes without its records (Kafka had none: a slow batch
      is not silence), and takes part again when records come (Flink's
      ``withIdleness``).  None:
      a silent partition holds event time back until it speaks or ends
      (``streaming.end_input``).  As in Flink it is a trade: when every
      partition a task reads pauses longer than this, the records after the
      pause may find event time moved on by other tasks and be late, so
      choose it above the pauses your producers make.
    - ``idle_after_event_time``: a partition that brought no record while
      the other event-time inputs of its task moved on by this much event
      time (ms or a ``timedelta``) stops holding the watermark back, and
      takes part again when records come.  Unlike ``idle_timeout`` it reads
      no clock: a pause of every producer (a broker outage, a restore) makes
      nothing idle, as nothing else moved on, so the records after it are
      never late for it and the output is what a run without the pause
      gives.  A partition further behind the others than this, silent, is
      left out; a task with no other event-time input never goes idle by it
      (use ``idle_timeout`` too where a whole topic can go quiet).
    - ``key``: the column producers partition the topic by (records of one
      key always in one partition).  Only then may a stateful stage with
      several tasks read the topic directly (each task reads whole
      partitions); otherwise route it through a stage keyed by that column.
    """

    topic: str
    partitions: int = 1
    schema: pa.Schema | None = None  # None: inferred per batch
    event_time: str | None = None
    max_out_of_orderness: int | dt.timedelta = 0
    idle_timeout: int | dt.timedelta | None = None
    idle_after_event_time: int | dt.timedelta | None = None
    key: str | None = None
    avro: str | Mapping[str, Any] | AvroSchema | None = None
    confluent_wire: bool = False
    registry: bool = False

    def __post_init__(self) -> None:
        if self.schema is not None and not isinstance(self.schema, pa.Schema):  # {name: type} or [(name, type)]
            try:
                object.__setattr__(self, "schema", pa.schema(self.schema))
            except (TypeError, ValueError, pa.ArrowException) as exc:
                raise ConfigError(f"ingress {self.topic}: schema is not an Arrow schema: {exc}") from exc
        self._avro_schema()
        delay = duration_ms(self.max_out_of_orderness, f"ingress {self.topic}: max_out_of_orderness")
        idle = duration_ms(self.idle_timeout, f"ingress {self.topic}: idle_timeout")
        behind = duration_ms(self.idle_after_event_time, f"ingress {self.topic}: idle_after_event_time")
        if self.event_time is None and (delay or idle is not None or behind is not None):
            raise ConfigError(
                f"ingress {self.topic}: max_out_of_orderness, idle_timeout and idle_after_event_time describe "
                "event time; name the event-time column too (event_time=...)"
            )
        if idle == 0:
            raise ConfigError(f"ingress {self.topic}: idle_timeout must be > 0 (or None: never idle)")
        if behind == 0:
            raise ConfigError(f"ingress {self.topic}: idle_after_event_time must be > 0 (or None: never idle)")
        object.__setattr__(self, "max_out_of_orderness", delay)
        object.__setattr__(self, "idle_timeout", idle)
        object.__setattr__(self, "idle_after_event_time", behind)

    @property
    def value_schema(self) -> AvroSchema | pa.Schema | None:
        """How its values are read: Avro records of ``avro``, or JSON objects
        decoded to ``schema`` (None: inferred)."""
        return self.avro or self.schema

    def _avro_schema(self) -> None:
        """``avro`` parsed (an ``AvroSchema``), and ``schema`` taken from it."""
        what = f"ingress {self.topic}"
        if self.avro is None:
            if self.confluent_wire or self.registry:
                raise ConfigError(
                    f"{what}: confluent_wire and registry describe Avro values; give the Avro schema too (avro=...)"
                )
            return
        parsed = self.avro
        if not isinstance(parsed, AvroSchema):
            parsed = avro_schema(
                parsed,
                confluent_wire=self.confluent_wire,
                registry=self.registry,
                subject=subject_of(self.topic),
                what=what,
            )
        if self.schema is not None and not self.schema.equals(parsed.arrow):
            raise ConfigError(
                f"{what}: the schema is taken from the Avro schema ({parsed.arrow.to_string()!r}); "
                f"leave schema= out, or make it that (got {self.schema.to_string()!r})"
            )
        object.__setattr__(self, "avro", parsed)
        object.__setattr__(self, "schema", parsed.arrow)


class SinkKind(enum.StrEnum):
    OBJECT_STORE = "object-store"  # Parquet files under <store>/<job>/sink/output
    KAFKA = "kafka"  # a topic, written in transactions (read with read_committed)
    DELTA = "delta"  # a Delta Lake table, one commit per epoch and task (application transactions)


@dataclass(frozen=True, slots=True)
class Sink:
    """Where the last stage's output goes, exactly once (see ``SinkKind``;
    a name such as ``"kafka"`` is taken too).  ``topic``: a Kafka sink's
    topic.  ``avro``: a Kafka sink's values as Avro records of this schema
    (JSON text or a dict) in Confluent's wire format, the schema registered
    under ``<topic>-value`` in the job's schema registry (None: JSON).
    ``table``: a Delta sink's table, ``s3://bucket/path`` on the
    job's S3 server or a local path; None: ``<store>/<job>/sink/table``."""

    kind: SinkKind | str = SinkKind.OBJECT_STORE  # a name becomes its SinkKind
    topic: str | None = None
    table: str | None = None
    avro: str | Mapping[str, Any] | AvroSchema | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_choice(SinkKind, self.kind, "sink kind"))
        if (self.kind is SinkKind.KAFKA) != bool(self.topic):
            raise ConfigError("a kafka sink needs a topic; an object-store or delta sink takes none")
        if self.table is not None and self.kind is not SinkKind.DELTA:
            raise ConfigError(f"a {self.kind} sink takes no table: only a delta sink writes to one")
        if self.table is not None:
            check_store_uri(self.table)
        if self.avro is not None:
            if self.kind is not SinkKind.KAFKA:
                raise ConfigError(f"a {self.kind} sink takes no avro schema: only a kafka sink writes Avro values")
            if not isinstance(self.avro, AvroSchema):
                parsed = avro_schema(
                    self.avro,
                    confluent_wire=True,
                    registry=True,
                    subject=subject_of(self.topic or ""),
                    what=f"sink {self.topic}",
                )
                object.__setattr__(self, "avro", parsed)


# Spark code of a stage: a function from DataFrame to DataFrame, or a SQL query over ``{input}``
SparkCode = Callable[[Any], Any] | str


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage: ``operator()`` builds a fresh operator per task (an
    ``operators.Operator``, or a ``MultiInputOperator`` whose ``inputs`` are the
    stage's input names).  ``inputs``: ingress topics or other stages' names.
    ``key``: the output column that routes rows to the next stage's tasks.

    ``spark``: Spark code run on the executors for each micro-batch before
    anything reaches Python (``streaming.adapters.spark.stage``): a function
    from DataFrame to DataFrame, or SQL over ``{input}``.  Its input is the
    ingress records decoded by Spark with the ingress schema, plus
    ``_position`` (the record's topic, partition and offset), which every
    output row must keep; its output rows are what ``operator`` receives
    (no operator: they go on as they are).  Spark code may read other
    stages' outputs too (several of them: their union), when each says
    what its rows are: ``schema`` declared, or derived from a stage of
    Spark code without an operator.

    ``schema``: the columns of this stage's output rows, for a stage of
    Spark code that reads them (Spark reads the Arrow batches of the
    output topic with it)."""

    name: str
    inputs: tuple[str, ...]
    operator: OperatorFactory | None = None
    parallelism: int = 1
    key: str | None = None
    sink: Sink | None = None
    # the explicit opt-in for a partitioning ``Pipeline.check`` cannot see is right:
    # records of one key reach one task however the inputs are partitioned
    trust_partitioning: bool = False
    spark: SparkCode | None = None
    schema: pa.Schema | None = None

    def make_operator(self) -> Any:
        """A fresh operator for one task (rows as they are, for a stage of Spark code alone)."""
        if self.operator is None:
            from operators.stateless import Passthrough

            return Passthrough()
        return self.operator()


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task: its stage, index, input channels (by input name) and output channels."""

    stage: str
    index: int
    inputs: Mapping[ChannelId, str]
    outputs: tuple[ChannelId, ...]

    @property
    def name(self) -> str:
        return f"{self.stage}-{self.index}"


@dataclass(frozen=True)
class Scale:
    """What a restore may change about a pipeline (docs/architecture/restore.md,
    "Rescaling"): how many tasks each stage runs, and which topic carries each
    stage's output to the next (a new one whenever the task counts at either
    end change, since the topic has ``p_U * p_S`` partitions)."""

    parallelism: Mapping[str, int]
    topics: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"parallelism": dict(sorted(self.parallelism.items())), "topics": dict(sorted(self.topics.items()))}

    @classmethod
    def from_json(cls, data: Any) -> Scale:
        try:
            return cls(
                {str(k): int(v) for k, v in data["parallelism"].items()},
                {str(k): str(v) for k, v in (data.get("topics") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"scale {data!r} is not {{'parallelism': {{stage: tasks}}, 'topics': ...}}") from exc

    def describe(self) -> str:
        return ", ".join(f"{stage}={tasks}" for stage, tasks in sorted(self.parallelism.items()))


def parse_parallelism(text: str) -> dict[str, int]:
    """``"accounts=3,windows=2"`` -> ``{"accounts": 3, "windows": 2}``."""
    parallelism: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        stage, sep, tasks = item.partition("=")
        if not sep or not stage.strip() or not tasks.strip().isdigit() or int(tasks) < 1:
            raise ConfigError(f"parallelism {item!r}: expected stage=tasks with tasks a whole number >= 1")
        parallelism[stage.strip()] = int(tasks)
    return parallelism


@dataclass(frozen=True)
class Pipeline:
    job: str
    ingress: tuple[Ingress, ...]
    stages: tuple[Stage, ...]
    # a stage's output topic other than spark-abs.<job>.<stage> (set by a rescaling restore)
    topics: Mapping[str, str] = field(default_factory=dict)
    _downstream: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ingress", tuple(self.ingress))
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "topics", dict(self.topics))
        self._validate()

    # ---- validation

    def _validate(self) -> None:
        """Checked in order, the first problem raising ConfigError: the job's
        name and that it has a stage, the ingress topics, the stages, their
        inputs (recording which stage reads each stage), where each stage's
        output goes, and the topics given for stages."""
        if not _NAME.match(self.job or ""):
            raise ConfigError(f"job name {self.job!r}: use letters, digits, '-' and '_'")
        if not self.stages:
            raise ConfigError(f"pipeline {self.job}: no stage")
        names: dict[str, str] = {}
        self._validate_ingress(names)
        self._validate_stages(names)
        self._validate_inputs(names)
        self._validate_outputs()
        self._validate_topics()

    def _validate_ingress(self, names: dict[str, str]) -> None:
        for ingress in self.ingress:
            if not _NAME.match(ingress.topic.replace(".", "_")):
                raise ConfigError(f"ingress topic {ingress.topic!r} has characters Kafka does not allow")
            if ingress.partitions < 1:
                raise ConfigError(f"ingress topic {ingress.topic}: partitions must be >= 1")
            names.setdefault(ingress.topic, "ingress topic")

    def _validate_stages(self, names: dict[str, str]) -> None:
        for stage in self.stages:
            if not _NAME.match(stage.name):
                raise ConfigError(f"stage name {stage.name!r}: use letters, digits, '-' and '_'")
            if stage.name in names:
                raise ConfigError(f"stage {stage.name!r}: the name is already used by a {names[stage.name]}")
            names[stage.name] = "stage"
            if stage.parallelism < 1:
                raise ConfigError(f"stage {stage.name}: parallelism must be >= 1, got {stage.parallelism}")
            if stage.operator is None and stage.spark is None:
                raise ConfigError(f"stage {stage.name}: give it an operator, Spark code (spark=...), or both")
            if stage.operator is not None and not callable(stage.operator):
                raise ConfigError(
                    f"stage {stage.name}: operator must be a factory (a callable), got {stage.operator!r}"
                )
            if stage.spark is not None:
                self._validate_spark_stage(stage)

    def _validate_spark_stage(self, stage: Stage) -> None:
        """Spark code reads one ingress topic that has a schema (Spark decodes
        its records with it); the code itself is checked where Spark runs
        (``streaming.adapters.spark.stage``)."""
        if not (callable(stage.spark) or (isinstance(stage.spark, str) and "{input}" in stage.spark)):
            raise ConfigError(
                f"stage {stage.name}: spark must be a function from DataFrame to DataFrame or a SQL "
                f'query reading {{input}} (e.g. "SELECT _position, user FROM {{input}} WHERE amount > 0"), '
                f"got {stage.spark!r}"
            )
        ingress = [self.ingress_named(name) for name in stage.inputs]
        if any(i is None for i in ingress):
            self._validate_spark_after_stages(stage, ingress)
            return
        if len(ingress) != 1 or ingress[0] is None:
            raise ConfigError(
                f"stage {stage.name}: Spark code reads one ingress topic or the outputs of other stages, not "
                f"both and not two topics (it reads {', '.join(stage.inputs)}); put it in a stage of its own"
            )
        if ingress[0].schema is None:
            raise ConfigError(
                f"stage {stage.name}: Spark decodes {ingress[0].topic} with its schema: give "
                f"Ingress({ingress[0].topic!r}, schema=...)"
            )

    def _validate_spark_after_stages(self, stage: Stage, ingress: list[Ingress | None]) -> None:
        """Spark code after other stages reads their output rows with the
        schema each declares (or that their own Spark code gives); several
        inputs are one union, so their schemas are one."""
        if any(i is not None for i in ingress):
            raise ConfigError(
                f"stage {stage.name}: Spark code reads one ingress topic or the outputs of other stages, not "
                f"both (it reads {', '.join(stage.inputs)}); put the ingress in a stage of its own in front"
            )
        schemas = []
        for name in stage.inputs:
            upstream = self.stage(name)
            if upstream.schema is None and (upstream.spark is None or upstream.operator is not None):
                raise ConfigError(
                    f"stage {stage.name}: Spark reads the rows of stage {name} as Arrow batches, and needs to "
                    f"know their columns: give Stage({name!r}, ..., schema=pa.schema([...]))"
                )
            if upstream.schema is not None:
                schemas.append((name, upstream.schema))
        if any(not schema.equals(schemas[0][1]) for _, schema in schemas[1:]):  # metadata aside
            said = "; ".join(f"{name}: {schema.to_string(show_schema_metadata=False)}" for name, schema in schemas)
            raise ConfigError(
                f"stage {stage.name}: Spark code over several stages reads their union, so their rows must "
                f"have one schema ({said})"
            )

    def _validate_inputs(self, names: dict[str, str]) -> None:
        for stage in self.stages:
            if not stage.inputs:
                raise ConfigError(f"stage {stage.name} has no input")
            for name in stage.inputs:
                if name not in names:
                    raise ConfigError(
                        f"stage {stage.name}: input {name!r} is neither an ingress topic nor a stage "
                        f"(known: {', '.join(sorted(names))})"
                    )
                if name == stage.name:
                    raise ConfigError(f"stage {stage.name} reads its own output: cycles are not supported")
                if names[name] == "stage":
                    if name in self._downstream:
                        raise ConfigError(
                            f"stage {name} is read by both {self._downstream[name]} and "
                            f"{stage.name}: a stage's output feeds one stage"
                        )
                    self._downstream[name] = stage.name
            if len(set(stage.inputs)) != len(stage.inputs):
                raise ConfigError(f"stage {stage.name} names an input twice")

    def _validate_outputs(self) -> None:
        by_name = {s.name: s for s in self.stages}
        for stage in self.stages:
            seen, current = {stage.name}, stage.name
            while current in self._downstream:
                current = self._downstream[current]
                if current in seen:
                    raise ConfigError(f"stages {' -> '.join(sorted(seen))} form a cycle: cycles are not supported")
                seen.add(current)
            downstream = self._downstream.get(stage.name)
            if downstream is None and stage.sink is None:
                raise ConfigError(f"stage {stage.name}: its output goes nowhere (no stage reads it and it has no sink)")
            if downstream is not None and stage.sink is not None:
                raise ConfigError(f"stage {stage.name} has a sink but stage {downstream} also reads it")
            if downstream is not None and by_name[downstream].parallelism > 1 and not stage.key:
                raise ConfigError(
                    f"stage {stage.name}: stage {downstream} runs {by_name[downstream].parallelism} "
                    f"tasks, so {stage.name} needs a key column to route its output"
                )

    def _validate_topics(self) -> None:
        for name, topic in self.topics.items():
            if name not in self._downstream:
                raise ConfigError(f"topic {topic!r} is given for {name!r}, which is not a stage another stage reads")
            if not _NAME.match(topic.replace(".", "_")):
                raise ConfigError(f"topic {topic!r} of stage {name} has characters Kafka does not allow")

    # ---- topology

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ConfigError(f"pipeline {self.job} has no stage {name!r}")

    def ingress_named(self, name: str) -> Ingress | None:
        """The ingress topic called ``name`` (None: ``name`` is a stage)."""
        return next((i for i in self.ingress if i.topic == name), None)

    def carries_event_time(self, name: str) -> bool:
        """Whether input ``name`` carries event time: an ingress topic with an
        ``event_time`` column, or a stage with such an input, however far up."""
        ingress = self.ingress_named(name)
        if ingress is not None:
            return ingress.event_time is not None
        return any(self.carries_event_time(upstream) for upstream in self.stage(name).inputs)

    def topic_of(self, name: str) -> str:
        """The Kafka topic behind an input name: the ingress topic, or a stage's output topic."""
        if any(i.topic == name for i in self.ingress):
            return name
        return self.topics.get(name) or stage_topic(self.job, name)

    @property
    def scale(self) -> Scale:
        """Each stage's task count and each stage-to-stage topic."""
        return Scale(
            {s.name: s.parallelism for s in self.stages},
            {s.name: self.topic_of(s.name) for s in self.stages if s.name in self._downstream},
        )

    def rescaled(self, scale: Scale) -> Pipeline:
        """This pipeline with ``scale``'s task counts and topics (stages it
        does not name keep theirs)."""
        unknown = sorted(set(scale.parallelism) - {s.name for s in self.stages})
        if unknown:
            raise ConfigError(
                f"pipeline {self.job} has no stage {', '.join(unknown)} "
                f"(stages: {', '.join(s.name for s in self.stages)})"
            )
        stages = tuple(
            dataclasses.replace(s, parallelism=scale.parallelism.get(s.name, s.parallelism)) for s in self.stages
        )
        return Pipeline(self.job, self.ingress, stages, {**self.topics, **scale.topics})

    def downstream(self, stage: str) -> Stage | None:
        name = self._downstream.get(stage)
        return self.stage(name) if name else None

    def internal_topics(self) -> dict[str, int]:
        """Every stage-to-stage topic and its partition count."""
        return {
            self.topic_of(stage.name): stage.parallelism * downstream.parallelism
            for stage in self.stages
            if (downstream := self.downstream(stage.name)) is not None
        }

    def ingress_channels(self) -> list[ChannelId]:
        return [ChannelId(i.topic, p) for i in self.ingress for p in range(i.partitions)]

    def tasks(self) -> list[TaskSpec]:
        partitions = {i.topic: i.partitions for i in self.ingress}
        specs: list[TaskSpec] = []
        for stage in self.stages:
            downstream = self.downstream(stage.name)
            for index in range(stage.parallelism):
                inputs: dict[ChannelId, str] = {}
                for name in stage.inputs:
                    topic = self.topic_of(name)
                    if name in partitions:
                        owned = [p for p in range(partitions[name]) if p % stage.parallelism == index]
                    else:
                        upstream = self.stage(name).parallelism
                        owned = [u * stage.parallelism + index for u in range(upstream)]
                    inputs.update({ChannelId(topic, p): name for p in owned})
                outputs: tuple[ChannelId, ...] = ()
                if downstream is not None:
                    topic = self.topic_of(stage.name)
                    outputs = tuple(
                        ChannelId(topic, index * downstream.parallelism + s) for s in range(downstream.parallelism)
                    )
                specs.append(TaskSpec(stage.name, index, inputs, outputs))
        for spec in specs:
            if not spec.inputs:
                stage = self.stage(spec.stage)
                topics = ", ".join(n for n in stage.inputs if n in partitions)
                most = max(partitions[n] for n in stage.inputs if n in partitions)
                raise ConfigError(
                    f"task {spec.name} would read no channel: stage {spec.stage} has more tasks "
                    f"than its ingress topics have partitions. Fix: give {topics} at least "
                    f"{stage.parallelism} partitions, or run {spec.stage} with parallelism={most}"
                )
        return specs

    def task(self, name: str) -> TaskSpec:
        for spec in self.tasks():
            if spec.name == name:
                return spec
        raise ConfigError(f"pipeline {self.job} has no task {name!r}")


def route(table: pa.Table, key: str | None, targets: int) -> pa.Array:
    """The downstream task index of every row: crc32 of the key's text, modulo ``targets``."""
    if targets == 1 or key is None:
        return pa.array([0] * table.num_rows, pa.int64())
    if key not in table.column_names:
        raise ConfigError(f"output has no key column {key!r} (columns: {table.column_names})")
    texts = pc.cast(table[key], pa.string()).to_pylist()
    return pa.array([zlib.crc32((t or "").encode()) % targets for t in texts], pa.int64())


def named_pipelines() -> dict[str, str]:
    """The pipelines known by name: ``PIPELINE_ENTRY_POINTS`` of every
    installed package, name -> ``module:attribute``."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=PIPELINE_ENTRY_POINTS)}


def pipeline_reference(reference: str) -> str:
    """``reference`` as ``module:attribute`` (arguments after ``?`` kept): a
    name (``orders``, ``changing?shape=added``) is looked up among
    ``named_pipelines()``; anything with a ``:`` is returned as it is."""
    name, sep, query = reference.partition("?")
    if ":" in name:
        return reference
    known = named_pipelines()
    if name not in known:
        raise ConfigError(
            f"pipeline {reference!r}: no pipeline of that name (known: {', '.join(sorted(known))}); "
            "name one as 'module:attribute'"
        )
    return known[name] + sep + query


def pipeline_module(reference: str) -> ModuleType:
    """The module that defines the pipeline ``reference`` names (a name or
    ``module:attribute``), for tools that use what else that module offers
    (the demo's checks, a drill's workload); a ``ConfigError`` when it
    cannot be imported."""
    module_name = pipeline_reference(reference).partition("?")[0].partition(":")[0]
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"pipeline {reference!r}: its module {module_name} cannot be imported: {exc}") from exc


def load_pipeline(reference: str, job: str | None = None) -> Pipeline:
    """``module:attribute``: a Pipeline, or a function ``(job=..., **kwargs)``
    returning one; or the name of one (``pipeline_reference``).  A
    function's keyword arguments may follow as a query string,
    ``module:function?ms_per_record=10&keys=100`` (values read as JSON
    numbers, booleans or null where they parse, else as text), so the same
    reference reaches every worker process."""
    reference = pipeline_reference(reference)
    target_ref, _, query = reference.partition("?")
    module_name, sep, attribute = target_ref.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"pipeline {reference!r}: expected 'module:attribute' (optionally '?name=value&...')")
    kwargs = _reference_arguments(reference, query)
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"pipeline {reference!r} cannot be loaded: {exc}") from exc
    if kwargs and not callable(target):
        raise ConfigError(f"pipeline {reference!r}: {attribute} is not a function, it takes no arguments")
    try:
        pipeline = target(**({"job": job} if job else {}), **kwargs) if callable(target) else target
    except (TypeError, ValueError) as exc:
        if kwargs:
            raise ConfigError(f"pipeline {reference!r}: {exc}") from exc
        raise
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(f"pipeline {reference!r} gave {type(pipeline).__name__}, not a Pipeline")
    if job and pipeline.job != job:
        raise ConfigError(f"pipeline {reference!r} named its job {pipeline.job!r}, not {job!r}")
    return pipeline


def same_pipeline(first: str, second: str) -> bool:
    """Whether two references name the same pipeline with the same arguments
    (a name and its ``module:attribute``, arguments in any order).  Nothing
    is imported."""

    def canonical(reference: str) -> tuple[str, dict[str, Any]]:
        target, _, query = pipeline_reference(reference).partition("?")
        return target, _reference_arguments(reference, query)

    try:
        return canonical(first) == canonical(second)
    except ConfigError:
        return False


def _reference_arguments(reference: str, query: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"pipeline {reference!r}: arguments must read 'name=value&name=value'") from None
    for name, text in pairs:
        if not name.isidentifier() or name == "job":
            raise ConfigError(f"pipeline {reference!r}: {name!r} cannot be a keyword argument")
        try:
            arguments[name] = json.loads(text)
        except ValueError:
            arguments[name] = text
    return arguments

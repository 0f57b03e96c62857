"""What a restore drill checks at its end, gathered and checked
(``streaming.tools.drill.run``): the committed output beside the reference Spark
computes in batch, every checkpoint a coordinator reported complete (does it
verify, what does it conserve) and the dead letters (of the records made
malformed, and any other, which the drill did not cause), as tables the great-expectations suites of
``streaming.tools.drill.checks`` run on."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable

import pandas as pd

from barriers.headers import DEAD_LETTER_REASON, DEAD_LETTER_SOURCE, DEAD_LETTER_SOURCE_OFFSET
from streaming.adapters.kafka.admin import job_key
from streaming.api.config import Connection
from streaming.api.pipeline import Pipeline
from streaming.errors import ConfigError, KafkaUnavailableError, SnapshotMissingError
from streaming.tools.drill.job import DrilledJob
from streaming.tools.drill.plan import FailureOutcome
from streaming.tools.drill.workload import DrillWorkload

__all__ = ["DrillVerification", "dead_letter_frame"]


class DrillVerification:
    """The tables of a drained drill and the suites run on them (``run``)."""

    def __init__(
        self,
        connection: Connection,
        job: DrilledJob,
        *,
        pipeline: Pipeline,
        workload: DrillWorkload,
        outcomes: list[FailureOutcome],
        malformed: list[tuple[str, int]],
        spark=None,
        log: Callable[[str], None],
    ):
        self.connection = connection
        self.job = job
        self.pipeline = pipeline
        self.workload = workload
        self.outcomes = outcomes
        self.malformed = malformed
        self.spark = spark
        self.log = log

    def run(self) -> tuple[dict[str, pd.DataFrame], list]:
        """The tables (``output``, ``checkpoints``, ``dead_letters``) and GX's results on them."""
        from streaming.tools.drill import checks as drill_checks

        self.log("checking: the reference in batch with Spark, the output, every checkpoint, the dead letters")
        reference = self.workload.reference(self._spark(), self.pipeline, self.connection.kafka)
        keys = self.workload.keys
        sums = self.workload.sums or tuple(c for c in reference.columns if c not in keys)
        joined = drill_checks.output_frame(self._output(reference), reference, keys)
        checkpoints = self._checkpoint_frame()
        letters = self._dead_letter_frame()
        frames = {"output": joined, "checkpoints": checkpoints, "dead_letters": letters}
        suites = {
            "output": (
                functools.partial(
                    drill_checks.output_suite,
                    expected_rows=len(reference),
                    keys=keys,
                    sums=sums,
                ),
                joined,
            ),
            "checkpoints": (
                functools.partial(drill_checks.checkpoint_suite, conserved=self.workload.conserved is not None),
                checkpoints,
            ),
            "dead_letters": (drill_checks.dead_letter_suite, letters),
        }
        index = {"output": keys, "checkpoints": ["checkpoint"], "dead_letters": ["source", "offset", "reason"]}
        return frames, drill_checks.validate(suites, index)

    def _spark(self):
        if self.spark is not None:
            return self.spark
        from streaming.adapters.spark.session import spark_session

        return spark_session(self.connection.spark_settings(app_name=f"{self.job.job}-reference"))

    def _output(self, reference: pd.DataFrame) -> pd.DataFrame:
        """The committed output as a frame (empty, with the reference's
        columns, when there is none): an object-store sink's epochs, a Delta
        sink's table, or the JSON values a Kafka sink committed to its topic."""
        from streaming.adapters.sinks.delta import delta_table_uri, read_delta_output
        from streaming.adapters.sinks.factory import sink_location
        from streaming.adapters.sinks.object_store import read_committed_output
        from streaming.api.pipeline import SinkKind
        from streaming.api.settings import JobSettings

        sink = next(s.sink for s in self.pipeline.stages if s.sink is not None)
        location = sink_location(JobSettings(store=self.job.store_uri), self.job.job, self.connection)
        if sink.kind is SinkKind.KAFKA:
            if sink.topic is None:  # Sink refuses a Kafka sink without one
                raise ConfigError("the pipeline's Kafka sink names no topic")
            table = self._kafka_output(sink.topic)
        elif sink.kind is SinkKind.DELTA:
            table = read_delta_output(delta_table_uri(sink, location), self.connection)
        else:
            table = read_committed_output(location)
        to_frame = self.workload.output or (lambda t: t.to_pandas())
        return to_frame(table) if table is not None else reference.iloc[0:0]

    def _checkpoint_frame(self) -> pd.DataFrame:
        """One row per checkpoint reported complete: its state and, where the workload says, what it conserves."""
        from streaming.adapters.kafka.ranges import read_range

        store = self.job.store
        damaged = {o.damaged for o in self.outcomes if o.damaged is not None}
        # failure kind retention: checkpoints older than one whose records the drill kept lost theirs
        kept_from = max((o.kept_from for o in self.outcomes if o.kept_from is not None), default=None)
        rows = []

        def reader(channel, start: int, end: int):
            return read_range(self.connection.kafka, channel, start, end)

        for checkpoint_id in self._reported_complete():
            try:
                problems = store.verify(checkpoint_id)
            except SnapshotMissingError as exc:  # reported complete, and gone
                problems = [str(exc)]
            state = (
                "verifies"
                if not problems
                else ("damaged by the drill" if checkpoint_id in damaged else "; ".join(problems))
            )
            total = None
            if not problems and self.workload.conserved is not None:
                try:
                    total = self.workload.conserved(store, checkpoint_id, reader)
                except KafkaUnavailableError:  # its channel state ranges: read only while Kafka holds them
                    if kept_from is None or checkpoint_id >= kept_from:
                        raise
                    state = "records deleted by the drill"
            rows.append({"checkpoint": checkpoint_id, "state": state, "total": total})
        return pd.DataFrame(rows, columns=["checkpoint", "state", "total"])

    def _reported_complete(self) -> list[int]:
        """Every checkpoint a coordinator reported complete (its progress log), in order."""
        done = set()
        try:
            for line in (self.job.log_dir / "checkpoints.jsonl").read_text().splitlines():
                if line.strip():
                    done.add(int(json.loads(line)["checkpoint"]))
        except OSError:
            pass
        return sorted(done)

    def _dead_letter_frame(self) -> pd.DataFrame:
        from streaming.adapters.kafka.dead_letters import read_dead_letters

        found = read_dead_letters(self.connection.kafka, self.job.job, job_key(self.connection, self.job.job))
        if found.superseded:
            self.log(
                f"dead letters: {len(found.superseded)} sent again by a restore's replay ("
                + "; ".join(str(r) for r in found.restores)
                + "), the first ones left out as superseded"
            )
        seen: dict[tuple[str, int], list[str]] = {}
        for record in found.letters:
            headers = {k: v.decode(errors="replace") for k, v in record.headers}
            source = (headers.get(DEAD_LETTER_SOURCE, ""), int(headers.get(DEAD_LETTER_SOURCE_OFFSET, -1)))
            seen.setdefault(source, []).append(headers.get(DEAD_LETTER_REASON, ""))
        frame = dead_letter_frame(self.malformed, seen, self.workload.by_design)
        unmade = frame[~frame["made_malformed"]]
        designed = Counter(zip(unmade[unmade["expected"]]["reason"], unmade[unmade["expected"]]["source"]))
        others = Counter(zip(unmade[~unmade["expected"]]["reason"], unmade[~unmade["expected"]]["source"]))
        if designed:
            self.log(
                f"dead letters: {sum(designed.values())} records quarantined by design (the workload's quarantined): "
                + "; ".join(f"{n} from {channel}: {reason}" for (reason, channel), n in designed.most_common(5))
            )
        if others:
            self.log(
                f"dead letters: {sum(others.values())} records quarantined that the drill did not make malformed "
                "and the workload does not quarantine by design: "
                + "; ".join(f"{n} from {channel}: {reason}" for (reason, channel), n in others.most_common(5))
            )
            if any(reason.endswith(": late") for reason, _ in others):
                self.log(
                    "dead letters: records late for their window are missing from the output; an ingress "
                    "idle_timeout shorter than a pause of every producer (a broker outage) lets event time move "
                    "on without them (docs/concepts/event-time.md, 'Idle partitions')"
                )
        return frame

    def _kafka_output(self, topic: str):
        """The JSON values a Kafka sink committed to ``topic`` as a pyarrow
        table (None when there is none), without the epochs it marked
        superseded: committed after the checkpoint a fallback restored, and
        written again by the restored job (said in the drill's log)."""
        import pyarrow as pa

        from streaming.adapters.sinks.kafka import read_kafka_output

        # only the superseded marks the job signed count
        output = read_kafka_output(self.connection.kafka, topic, key=job_key(self.connection, self.job.job))
        if output.superseded:
            self.log(
                f"output: {sum(output.superseded.values())} records of {len(output.superseded)} epochs the Kafka "
                f"sink committed after the checkpoint a restore went back to, marked superseded, left out "
                f"({', '.join(list(output.superseded)[:5])}{', ...' if len(output.superseded) > 5 else ''})"
            )
        rows = [json.loads(v) for v in output.values]
        return pa.Table.from_pylist(rows) if rows else None


def dead_letter_frame(
    malformed: list[tuple[str, int]], seen: dict[tuple[str, int], list[str]], by_design: Callable[[str], bool]
) -> pd.DataFrame:
    """The ``dead_letters`` suite's table: a row per record the drill made
    malformed (``malformed``: source channel and offset) with the reason of
    its first dead letter and how many it got (``seen``: the reasons of the
    job's dead letters by source), then a row per dead letter of any other
    record, ``expected`` only when ``by_design`` says the pipeline
    quarantines for its reason on purpose."""
    rows = []
    for channel, offset in malformed:
        reasons = seen.get((channel, offset), [])
        rows.append(
            {
                "source": channel,
                "offset": offset,
                "letters": len(reasons),
                "reason": reasons[0] if reasons else None,
                "made_malformed": True,
                "expected": True,
            }
        )
    made = set(malformed)
    for (channel, offset), reasons in seen.items():
        if (channel, offset) in made:
            continue
        for reason in reasons:
            rows.append(
                {
                    "source": channel,
                    "offset": offset,
                    "letters": 1,
                    "reason": reason,
                    "made_malformed": False,
                    "expected": by_design(reason),
                }
            )
    columns = ["source", "offset", "letters", "reason", "made_malformed", "expected"]
    return pd.DataFrame(rows, columns=columns).astype({"made_malformed": bool, "expected": bool})

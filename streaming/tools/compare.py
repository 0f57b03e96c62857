"""What aligned and unaligned checkpoints cost, measured side by side in one run.

One copy of a deliberately slow stage (``streaming.testing.slow_pipeline``)
runs per variant, all at once, fed the same records.  Each round produces a
backlog (one count of ``--backlogs``, records per partition) into every
copy, triggers a checkpoint in all of them at the same moment and waits
until each is complete.  All variants share the machine and its load in
every round, so the ratios to the first variant (aligned by default) are
taken round by round.

What the columns mean (per task, from the checkpoint's manifest):

- trigger->complete: from the barrier's injection to the manifest;
- first barrier: from the injection until the task started its snapshot;
- alignment: how long the task held channels that had delivered the barrier;
- held bytes: the most the task held during alignment;
- in flight: offsets recorded as channel state (unaligned: the backlog in
  front of the barrier, replayed on restore instead of being waited for);
- copied bytes: channel state copied into the snapshot (``unaligned-records``);
- state bytes: the operator state written to the store.

An aligned task snapshots only once it has processed the backlog in front
of the barrier (its first-barrier time is nearly the whole checkpoint
time); an unaligned one snapshots at the barrier's announcement and records
the backlog as channel state, so its time does not depend on the backlog."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from barriers.coordinator import CheckpointStatus
from streaming.errors import ConfigError, SparkAbsError

__all__ = ["VARIANTS", "RoundResult", "Comparison", "check_arguments", "run_compare", "main"]

# variant name -> JobSettings keyword arguments
VARIANTS: Mapping[str, Mapping[str, object]] = {
    "aligned": {"mode": "aligned"},
    "unaligned": {"mode": "unaligned", "in_flight": "range"},
    "unaligned-records": {"mode": "unaligned", "in_flight": "records"},
    "aligned-timeout": {"mode": "aligned-timeout", "alignment_timeout_ms": 200},
    "at-least-once": {"mode": "at-least-once"},
}

_TASK = "slow-0"


@dataclass(frozen=True)
class RoundResult:
    """One variant's checkpoint in one round."""

    variant: str
    round: int
    checkpoint_id: int
    backlog: int  # records produced in front of this round's barriers
    trigger_to_complete_s: float
    kind: str  # what the checkpoint turned out to be (aligned, unaligned, ...)
    first_barrier_s: float
    alignment_s: float
    held_bytes_max: int
    in_flight_records: int
    in_flight_bytes_copied: int
    state_bytes: int

    @classmethod
    def from_metrics(
        cls, variant: str, round_: int, checkpoint_id: int, backlog: int, duration_s: float, task: Mapping[str, object]
    ) -> RoundResult:
        return cls(
            variant,
            round_,
            checkpoint_id,
            backlog,
            duration_s,
            str(task.get("kind", "")),
            float(task.get("first_barrier_s") or 0.0),
            float(task.get("alignment_s") or 0.0),
            int(task.get("held_bytes_max") or 0),
            int(task.get("in_flight_records_referenced") or 0),
            int(task.get("in_flight_bytes_copied") or 0),
            int(task.get("state_bytes") or 0),
        )


@dataclass
class Comparison:
    """Every round of every variant, and the tables built from them."""

    variants: list[str]
    slow_ms: float
    rounds: list[RoundResult] = field(default_factory=list)

    def of(self, variant: str) -> list[RoundResult]:
        return [r for r in self.rounds if r.variant == variant]

    def ratios(self, variant: str) -> list[float]:
        """Per round: this variant's trigger-to-complete time over the first
        variant's in the same round."""
        base = {r.round: r.trigger_to_complete_s for r in self.of(self.variants[0])}
        return [r.trigger_to_complete_s / base[r.round] for r in self.of(variant) if base.get(r.round, 0) > 0]

    def render(self) -> str:
        base, others = self.variants[0], self.variants[1:]
        by_round: dict[int, dict[str, RoundResult]] = {}
        for r in self.rounds:
            by_round.setdefault(r.round, {})[r.variant] = r
        lines = [
            f"trigger -> complete, seconds ({self.slow_ms:g} ms per record in the slow stage; "
            f"backlog: records per partition in front of the barriers)",
            "",
        ]
        header = (
            f"{'round':>5} {'backlog':>8} "
            + " ".join(f"{v:>18}" for v in self.variants)
            + "".join(f" {v + '/' + base:>26}" for v in others)
        )
        lines += [header, "-" * len(header)]
        for round_, row in sorted(by_round.items()):
            backlog = next(iter(row.values())).backlog
            cells = [f"{row[v].trigger_to_complete_s:>18.2f}" if v in row else f"{'-':>18}" for v in self.variants]
            ratios = [
                f"{row[v].trigger_to_complete_s / row[base].trigger_to_complete_s:>26.3g}"
                if v in row and base in row and row[base].trigger_to_complete_s > 0
                else f"{'-':>26}"
                for v in others
            ]
            lines.append(f"{round_:>5} {backlog:>8} " + " ".join(cells) + "".join(f" {c}" for c in ratios))
        lines += ["", "per task, medians over the rounds (held bytes: the most in any round)", ""]
        header = (
            f"{'variant':<18} {'rounds':>6} {'first barrier s':>15} {'alignment s':>11} {'held bytes':>11} "
            f"{'in flight':>9} {'copied bytes':>12} {'state bytes':>11}  kinds"
        )
        lines += [header, "-" * len(header)]
        for variant in self.variants:
            rows = self.of(variant)
            if not rows:
                lines.append(f"{variant:<18} {0:>6}  (no completed checkpoint)")
                continue
            lines.append(
                f"{variant:<18} {len(rows):>6} {_median(r.first_barrier_s for r in rows):>15.2f} "
                f"{_median(r.alignment_s for r in rows):>11.2f} {max(r.held_bytes_max for r in rows):>11} "
                f"{_median(r.in_flight_records for r in rows):>9.0f} "
                f"{_median(r.in_flight_bytes_copied for r in rows):>12.0f} "
                f"{_median(r.state_bytes for r in rows):>11.0f}  {', '.join(sorted({r.kind for r in rows}))}"
            )
        lines.append("")
        for variant in others:
            ratios = self.ratios(variant)
            if ratios:
                lines.append(
                    f"{variant} took {statistics.median(ratios):.3g} x the time of {base} "
                    f"(median over {len(ratios)} round(s), each measured side by side)"
                )
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {"variants": self.variants, "slow_ms": self.slow_ms, "rounds": [asdict(r) for r in self.rounds]}, indent=2
        )


def _median(values) -> float:
    return statistics.median(list(values))


def check_arguments(variants: Sequence[str], backlogs: Sequence[int]) -> None:
    """Fail at once, naming the option, on what the comparison cannot run."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ConfigError(f"--variants {', '.join(unknown) or '(none)'}: use some of {', '.join(VARIANTS)}")
    if len(set(variants)) != len(variants):
        raise ConfigError(f"--variants {', '.join(variants)}: each at most once")
    if not backlogs or any(b < 1 for b in backlogs):
        raise ConfigError(f"--backlogs {','.join(map(str, backlogs)) or '(none)'}: one or more counts, each at least 1")


def run_compare(
    connection,
    *,
    store_uri: str,
    variants: Sequence[str] = ("aligned", "unaligned"),
    backlogs: Sequence[int] = (500, 1000, 2000),
    warmup: int = 100,
    timeout_s: float = 300.0,
    say: Callable[[str], None] = print,
) -> Comparison:
    """Run the comparison on ``connection`` (see the module docstring).  A
    first checkpoint over ``warmup`` records per partition lets every job's
    Spark warm up; it is not counted."""
    from streaming import testing
    from streaming.api.settings import JobSettings
    from streaming.engine.runner import JobRunner

    check_arguments(variants, backlogs)
    stamp = uuid.uuid4().hex[:6]
    comparison = Comparison(list(variants), testing.SLOW_SECONDS_PER_RECORD * 1000)
    runners: dict[str, JobRunner] = {}
    jobs = _SideBySide(runners, connection.kafka_bootstrap, time.monotonic() + timeout_s)
    try:
        for variant in variants:
            settings = JobSettings(
                store=store_uri, interval_s=3600, max_records_per_batch=1000, timeout_s=timeout_s, **VARIANTS[variant]
            )
            runners[variant] = JobRunner(
                "streaming.testing:slow_pipeline",
                settings,
                connection,
                job=f"cmp-{variant}-{stamp}",
                say=lambda line, v=variant: say(f"{v}: {line}"),
            )
            runners[variant].prepare()
        say(f"starting {len(runners)} jobs side by side: {', '.join(variants)}")
        for runner in runners.values():
            runner.start()
        jobs.wait(lambda: all(r.coordinator.all_ready for r in runners.values()), "the jobs' tasks to start")
        if warmup:
            say(f"warm-up (not counted): {warmup} records per partition, then a checkpoint")
            jobs.produce(warmup)
            jobs.checkpoint("the warm-up checkpoints")
        for round_, backlog in enumerate(backlogs, start=1):
            say(f"round {round_}/{len(backlogs)}: {backlog} records per partition into each job, then a checkpoint")
            jobs.produce(backlog)
            # alternate who is triggered first, so no variant is always a few milliseconds ahead
            records = jobs.checkpoint(f"round {round_}'s checkpoints", reverse=round_ % 2 == 0)
            for variant in variants:
                record = records[variant]
                manifest = runners[variant].store.read_manifest(record.checkpoint_id)
                result = RoundResult.from_metrics(
                    variant, round_, record.checkpoint_id, backlog, record.duration_s, manifest.metrics["tasks"][_TASK]
                )
                comparison.rounds.append(result)
                say(
                    f"round {round_}: {variant} checkpoint {record.checkpoint_id} complete in "
                    f"{result.trigger_to_complete_s:.2f} s ({result.kind}, alignment {result.alignment_s:.2f} s, "
                    f"{result.in_flight_records} records in flight)"
                )
    finally:
        jobs.close()
        for runner in runners.values():
            runner.close()
    return comparison


class _SideBySide:
    """The jobs of a comparison: the same records into each, checkpoints
    triggered together, control topics polled in turn."""

    def __init__(self, runners: Mapping[str, object], bootstrap: str, deadline: float):
        from kafka import KafkaProducer

        self.runners = runners
        self.deadline = deadline
        self.produced = 0
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)

    def produce(self, per_partition: int) -> None:
        for i in range(self.produced, self.produced + per_partition):
            for partition in (0, 1):
                value = json.dumps({"id": partition * 10_000_000 + i, "key": f"k{i % 7}"}).encode()
                for runner in self.runners.values():
                    self._producer.send(runner.pipeline.ingress[0].topic, value=value, partition=partition)
        self._producer.flush()
        self.produced += per_partition

    def checkpoint(self, what: str, reverse: bool = False) -> dict[str, object]:
        """Trigger a checkpoint in every job and wait until each completed
        (one that fails ends the comparison, with its reason)."""
        order = list(self.runners.items())[:: -1 if reverse else 1]
        triggered = {variant: runner.coordinator.trigger() for variant, runner in order}
        if any(b is None for b in triggered.values()):
            raise SparkAbsError("a checkpoint is still pending from before; cannot trigger the next")
        records = {v: self.runners[v].coordinator.records[b.checkpoint_id] for v, b in triggered.items()}
        self.wait(lambda: all(r.status is not CheckpointStatus.PENDING for r in records.values()), what)
        for variant, record in records.items():
            if record.status is not CheckpointStatus.COMPLETED:
                raise SparkAbsError(f"{variant}: checkpoint {record.checkpoint_id} {record.status}: {record.reason}")
        return records

    def wait(self, done: Callable[[], bool], what: str) -> None:
        """Poll every job's control topic (briefly, so completion times stay
        sharp) until ``done``; a worker that dies ends the comparison."""
        while not done():
            if time.monotonic() > self.deadline:
                raise SparkAbsError(f"gave up waiting for {what}")
            for variant, runner in self.runners.items():
                dead = runner.supervisor.dead()
                if dead:
                    raise SparkAbsError(f"{variant}: worker {dead[0].name} exited (log: {dead[0].log_path})")
                runner.coordinator.poll(0.02)

    def close(self) -> None:
        self._producer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-abs compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--variants",
        default="aligned,unaligned",
        help=f"comma-separated, the first is the baseline of the ratios; any of "
        f"{', '.join(VARIANTS)} (default aligned,unaligned)",
    )
    parser.add_argument(
        "--backlogs",
        default="500,1000,2000",
        help="one round per count: records per partition produced in front of that round's "
        "barriers (default 500,1000,2000)",
    )
    parser.add_argument("--store", help="snapshot store URI (default file://<home>/compare-store)")
    parser.add_argument("--out", help="write every round as JSON here (default <home>/runs/compare-<time>.json)")
    args = parser.parse_args(argv)
    import os

    from streaming.api.config import Connection, default_home
    from streaming.local import LocalRuntime

    say = lambda line: print(f"[compare] {line}", flush=True)  # noqa: E731
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        backlogs = [int(b) for b in args.backlogs.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--backlogs {args.backlogs}: comma-separated whole numbers") from None
    check_arguments(variants, backlogs)
    connection = Connection.from_env(os.environ) or LocalRuntime(progress=say).up()
    store = args.store or f"file://{default_home() / 'compare-store'}"
    comparison = run_compare(connection, store_uri=store, variants=variants, backlogs=backlogs, say=say)
    out = Path(args.out) if args.out else default_home() / "runs" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(comparison.to_json())
    print()
    print(comparison.render())
    print(f"\nevery round: {out}")
    return 0

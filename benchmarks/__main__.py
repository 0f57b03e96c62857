"""spark-abs against plain Spark, measured side by side in one run.

    python -m benchmarks --quick     # about 5 minutes on a 2-core machine
    python -m benchmarks             # the full profile

The workload is a keyed count (count and sum per key over 100,000 keys, JSON
values, two partitions, every record already in the topic).  Variants:

- native-hdfs, native-rocksdb: the same query in plain Structured Streaming
  (groupBy().agg(), update mode, Spark's own checkpoint, each state store),
  reading the whole topic in one micro-batch; native-hdfs-batched: in
  micro-batches of at most the spark-abs job's ``max_records_per_batch``
  (``maxOffsetsPerTrigger``), as the spark-abs variants read it;
- abs-1stage: the spark-abs pipeline, checkpoints off (one checkpoint whose
  barriers follow the whole input commits the output);
- abs-1stage-ckpt1s (full profile: 0.5 s and 5 s too): unaligned checkpoints
  every second; abs-1stage-ckpt1s-incremental: the same with incremental
  checkpoints (each stores the keys changed since the previous one on a
  base stored every 10).  Unaligned, because the input is in the topic before the job
  starts: an aligned barrier appended then lands behind all of it, so the
  first aligned checkpoint could only complete at the end; an unaligned one
  snapshots at its announcement and keeps the unread input as channel state
  (offset ranges), so checkpoints are taken all through the run, as at
  steady state;
- abs-1stage-spark: the same pipeline with the records decoded by Spark on
  the executors (the stage's Spark code ``SELECT _position, k, v``): only
  the two columns cross to Python;
- abs-2stage: a stateless stage keyed by k in front of the count;
  abs-2stage-spark-after: the same with the count's stage Spark code (Spark
  reads the first stage's Arrow batches and computes the partial counts);
  abs-2stage-spark-first: with the first stage Spark code instead;
- flink-sql, quix: the peers a user would pick instead, on the same topic
  (``benchmarks.peers``): Flink SQL (PyFlink 2.2, a local mini-cluster of
  two slots, the Kafka SQL connector, ``GROUP BY k`` with mini-batches,
  checkpoints every second, updates to an upsert-kafka topic exactly once)
  and Quix Streams (exactly once, committing every second, state in
  RocksDB); their output is read back (read_committed) and checked, and
  their throughput runs from their first output to their last as the
  broker appended them (``make bench`` makes their environments; without
  them they are left out, with a warning).
- with ``--scaling``: scaling-1, scaling-2, scaling-4, the two stages with
  1, 2 and 4 tasks each over a topic of four partitions, all tasks in one
  Spark application on the connection's master (``local[2]`` on the local
  runtime; a standalone master when ``SPARK_ABS_SPARK_MASTER`` names one).

``--keys`` sets the key count (the state's size: 1,000,000 keys need at
least as many records, ``--records``); the table gives the state bytes each
checkpoint stored (median).

Each round runs every variant once, in an order that alternates between
rounds, on the same topic.  Throughput counts from the queries' start (all of
a spark-abs job's tasks ready, their queries started; the native query
started), so each pays its first micro-batch's offsets and planning, to
everything committed; start-up is reported apart.  Ratios are taken within
a round and their median reported.  ``--demo`` adds the demo's three stages
at steady state (transfers arriving at ``DEMO_RATE`` per second, checkpoints
every second: p50 and p99 trigger-to-complete, the first checkpoint left
out) and a restore's time to ready.  Every run goes to ``runs.json`` and the
table to ``results.md`` in ``--out``."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PROFILES", "main"]

# by name: `python -m benchmarks` runs this module as __main__
log = logging.getLogger("benchmarks.__main__")


@dataclass(frozen=True)
class Profile:
    records: int
    rounds: int
    intervals: tuple[float, ...]
    demo_seconds: float


PROFILES = {
    "quick": Profile(records=300_000, rounds=1, intervals=(1.0,), demo_seconds=60),
    "full": Profile(records=2_000_000, rounds=3, intervals=(0.5, 1.0, 5.0), demo_seconds=180),
}

# transfers per second into the demo while its checkpoints are timed
DEMO_RATE = 100

# what each ratio compares: (name, numerator variant, denominator variant, what a value above 1 means)
RATIOS = [
    ("spark-abs / native (HDFS state store)", "abs-1stage", "native-hdfs"),
    ("spark-abs / native (RocksDB state store)", "abs-1stage", "native-rocksdb"),
    ("spark-abs / Flink SQL", "abs-1stage", "flink-sql"),
    ("spark-abs / Quix Streams", "abs-1stage", "quix"),
    ("spark-abs, Spark decoding / native (HDFS state store)", "abs-1stage-spark", "native-hdfs"),
    ("spark-abs / native, both in batches of max_records_per_batch (HDFS)", "abs-1stage", "native-hdfs-batched"),
    (
        "spark-abs, Spark decoding / native, both in batches of max_records_per_batch (HDFS)",
        "abs-1stage-spark",
        "native-hdfs-batched",
    ),
    ("spark-abs, Spark decoding / Flink SQL", "abs-1stage-spark", "flink-sql"),
    ("Spark decoding / Python decoding", "abs-1stage-spark", "abs-1stage"),
    ("checkpoints every 0.5 s / off", "abs-1stage-ckpt0.5s", "abs-1stage"),
    ("checkpoints every 1 s / off", "abs-1stage-ckpt1s", "abs-1stage"),
    ("checkpoints every 5 s / off", "abs-1stage-ckpt5s", "abs-1stage"),
    ("incremental checkpoints every 1 s / off", "abs-1stage-ckpt1s-incremental", "abs-1stage"),
    ("incremental / full checkpoints every 1 s", "abs-1stage-ckpt1s-incremental", "abs-1stage-ckpt1s"),
    ("two stages / one stage", "abs-2stage", "abs-1stage"),
    ("two stages, Spark code after Python / one stage", "abs-2stage-spark-after", "abs-1stage"),
    ("two stages, Spark code then Python / one stage", "abs-2stage-spark-first", "abs-1stage"),
    ("2 tasks per stage / 1", "scaling-2", "scaling-1"),
    ("4 tasks per stage / 1", "scaling-4", "scaling-1"),
]

# tasks per stage of the scaling runs
SCALING = (1, 2, 4)


def _variants(profile: Profile, scaling: bool = False, peers: tuple[str, ...] = ()) -> list[str]:
    return (
        ["native-hdfs", "native-hdfs-batched", "native-rocksdb", *peers, "abs-1stage", "abs-1stage-spark"]
        + [f"abs-1stage-ckpt{i:g}s" for i in profile.intervals]
        + ["abs-1stage-ckpt1s-incremental", "abs-2stage", "abs-2stage-spark-after", "abs-2stage-spark-first"]
        + ([f"scaling-{n}" for n in SCALING] if scaling else [])
    )


def _run(variant: str, round_: int, context: dict):
    from benchmarks import runs
    from streaming.api.settings import Mode, StateSnapshots

    if variant in runs.PEERS:
        return runs.peer_run(
            variant,
            round_,
            kafka=context["connection"].kafka,
            topic=context["topic"],
            expected=context["expected"],
            cache_dir=context["cache_dir"],
        )
    profile_dir = context["out"] / "profiles" if context["profile"] else None
    if variant.startswith("native-"):
        batched = variant.endswith("-batched")
        return runs.native_run(
            variant,
            round_,
            topic=context["topic"],
            state_store=variant.split("-")[1],
            expected=context["expected"],
            profile_dir=profile_dir,
            max_offsets_per_trigger=context["max_records_per_batch"] if batched else None,
        )
    storage = runs.RunStorage(store=context["store"], log_dir=context["out"] / "logs", profile_dir=profile_dir)
    if variant.startswith("scaling-"):
        tasks = int(variant.split("-")[1])
        scaling = runs.AbsJob(
            pipeline="benchmarks.workloads:scaling",
            topic=context["scaling_topic"],
            expected=context["scaling_expected"],
            settings=context["settings"],
            parallelism={"pass": tasks, "count": tasks},
        )
        return runs.abs_run(context["connection"], variant, round_, scaling, storage)
    interval = float(variant.split("ckpt")[1].split("s")[0]) if "ckpt" in variant else None
    settings = dict(context["settings"])
    if interval is not None:  # see the module docstring
        settings["mode"] = Mode.UNALIGNED
    if variant.endswith("-incremental"):
        settings["state_snapshots"] = StateSnapshots.INCREMENTAL
    pipeline = {
        "abs-2stage": "benchmarks.workloads:two_stage",
        "abs-2stage-spark-after": "benchmarks.workloads:two_stage_spark_after",
        "abs-2stage-spark-first": "benchmarks.workloads:two_stage_spark_first",
        "abs-1stage-spark": "benchmarks.workloads:one_stage_spark",
    }.get(variant, "benchmarks.workloads:one_stage")
    job = runs.AbsJob(
        pipeline=pipeline, topic=context["topic"], expected=context["expected"], interval_s=interval, settings=settings
    )
    return runs.abs_run(context["connection"], variant, round_, job, storage)


def _ratios(all_runs: list, variants: list[str]) -> list[dict]:
    rows = []
    for name, top, bottom in RATIOS:
        if top not in variants or bottom not in variants:
            continue
        per_round = []
        for round_ in sorted({r.round for r in all_runs}):
            a = [r for r in all_runs if r.round == round_ and r.variant == top]
            b = [r for r in all_runs if r.round == round_ and r.variant == bottom]
            if a and b and a[0].records_per_s > 0 and b[0].records_per_s > 0:  # a failed run has no ratio
                per_round.append(a[0].records_per_s / b[0].records_per_s)
        if per_round:
            rows.append({"ratio": name, "median": statistics.median(per_round), "rounds": per_round})
    return rows


def _markdown(
    profile_name: str,
    profile: Profile,
    all_runs: list,
    ratios: list[dict],
    settings: dict,
    master: str = "",
    keys: int = 100_000,
) -> str:
    lines = [
        f"Profile `{profile_name}`: {profile.records:,} records over {keys:,} keys, {profile.rounds} round(s), "
        f"spark-abs settings {json.dumps(settings) if settings else 'default'}"
        + (f", Spark master `{master}`." if master else "."),
        "",
        "| variant | records/s (median) | start-up s (median) | checkpoints p50 s | state bytes per checkpoint p50 "
        "| bytes to Python per record | output verified |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for variant in dict.fromkeys(r.variant for r in all_runs):
        mine = [r for r in all_runs if r.variant == variant]
        if variant == "demo":
            continue
        checkpoints = [c for r in mine for c in r.checkpoints_s]
        p50 = f"{statistics.median(checkpoints):.2f}" if checkpoints else "-"
        handed = [r.detail["handed_bytes_per_record"] for r in mine if r.detail.get("handed_bytes_per_record")]
        stored = [b for r in mine for b in r.detail.get("state_bytes", [])]
        lines.append(
            f"| {variant} | {statistics.median(r.records_per_s for r in mine):,.0f} | "
            f"{statistics.median(r.startup_s for r in mine):.1f} | {p50} | "
            f"{f'{statistics.median(stored):,.0f}' if stored else '-'} | "
            f"{f'{statistics.median(handed):.1f}' if handed else '-'} | "
            f"{'yes' if all(r.verified for r in mine) else 'NO'} |"
        )
    lines += _spark_task_lines(all_runs)
    lines += ["", "| ratio (throughput) | median | per round |", "| --- | ---: | --- |"]
    for row in ratios:
        lines.append(f"| {row['ratio']} | {row['median']:.3f} | {', '.join(f'{x:.3f}' for x in row['rounds'])} |")
    demo = [r for r in all_runs if r.variant == "demo"]
    if demo:
        d = demo[-1].detail
        lines += [
            "",
            "| demo (3 stages, checkpoints every 1 s) | value |",
            "| --- | ---: |",
            f"| all tasks ready, s | {demo[-1].startup_s:.1f} |",
            f"| steady-state checkpoints | {d['checkpoints']} |",
            f"| trigger to complete p50, s | {d['p50_s']:.2f} |" if d["p50_s"] is not None else "| p50 | - |",
            f"| trigger to complete p99, s | {d['p99_s']:.2f} |" if d["p99_s"] is not None else "| p99 | - |",
            f"| restore after a killed worker: ready again, s | {d['restore_ready_s']:.1f} |",
        ]
    return "\n".join(lines) + "\n"


def _spark_task_lines(all_runs: list) -> list[str]:
    """Spark's task metrics per variant (medians over rounds; runs with ``--profile``)."""
    measured: dict[str, list[dict]] = {}
    for run in all_runs:
        if run.detail.get("spark_tasks"):
            measured.setdefault(run.variant, []).append(run.detail["spark_tasks"])
    if not measured:
        return []
    lines = [
        "",
        "| Spark's task metrics (event log, median of rounds) | tasks | executor run s | executor CPU s "
        "| records read | CPU µs per record read | task results to the driver, bytes per record read |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for variant, found in measured.items():

        def median(name: str, found=found) -> float:
            return statistics.median(m[name] for m in found)

        read = median("records_read")
        per_record = [m["executor_cpu_s"] * 1e6 / m["records_read"] for m in found if m["records_read"]]
        results = [m["result_bytes"] / m["records_read"] for m in found if m["records_read"]]
        lines.append(
            f"| {variant} | {median('tasks'):,.0f} | {median('executor_run_s'):.1f} | "
            f"{median('executor_cpu_s'):.1f} | {read:,.0f} | "
            f"{f'{statistics.median(per_record):.1f}' if per_record else '-'} | "
            f"{f'{statistics.median(results):.1f}' if results else '-'} |"
        )
    return lines


def _settings(pairs: list[str]) -> dict[str, object]:
    """``NAME=VALUE`` pairs as JobSettings fields (VALUE as JSON, else as text)."""
    settings: dict[str, object] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set {pair!r}: use NAME=VALUE")
        try:
            settings[name] = json.loads(value)
        except json.JSONDecodeError:
            settings[name] = value
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the short profile (default: the full one)")
    parser.add_argument("--records", type=int, help="records in the topic (default: the profile's)")
    parser.add_argument("--keys", type=int, help="distinct keys of the keyed count (default 100,000)")
    parser.add_argument("--rounds", type=int, help="rounds (default: the profile's)")
    parser.add_argument("--only", help="comma-separated variants to run (default: all of the profile)")
    parser.add_argument("--demo", action="store_true", help="also the demo at steady state and a restore")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="also two stages with 1, 2 and 4 tasks each (on the connection's Spark master: run it with "
        "a cluster's SPARK_ABS_* variables to measure the cluster)",
    )
    parser.add_argument(
        "--max-records-per-batch", type=int, help="spark-abs JobSettings.max_records_per_batch (default: its default)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other JobSettings field for every spark-abs run, the demo's too "
        "(e.g. --set 'trigger_interval=100 milliseconds'; VALUE is read as JSON when it can be)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample every spark-abs worker with py-spy, and keep Spark's event log of every spark-abs and "
        "native run, its task metrics tabled (profiles/ in --out)",
    )
    parser.add_argument("--out", help="results directory (default <home>/bench/<time>)")
    args = parser.parse_args(argv)

    from benchmarks import runs, workloads
    from streaming import console
    from streaming.adapters.kafka.admin import create_topic
    from streaming.api.config import Connection, LocalRuntimeSettings, default_home
    from streaming.api.settings import JobSettings
    from streaming.errors import SparkAbsError
    from streaming.local import LocalRuntime

    console.install("[bench] ")
    # the runs' jobs say nothing of themselves: what they measure is the output
    logging.getLogger("streaming.engine").setLevel(logging.WARNING)
    name = "quick" if args.quick else "full"
    base = PROFILES[name]
    profile = Profile(args.records or base.records, args.rounds or base.rounds, base.intervals, base.demo_seconds)
    from benchmarks.runs import PEERS, peer_available

    peers = tuple(p for p in PEERS if peer_available(p))
    missing = [p for p in PEERS if p not in peers]
    if missing:
        log.warning(f"no environment for {', '.join(missing)}: `make bench` makes them (.venv-flink, .venv-quix)")
    if args.profile and not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()):
        log.error("--profile samples the workers with py-spy, which is not installed: `make bench` installs it")
        return 2
    variants = _variants(profile, args.scaling, peers)
    if args.only:
        variants = [v for v in variants if v in set(args.only.split(","))]
    settings = _settings(args.set)
    if args.max_records_per_batch is not None:
        settings["max_records_per_batch"] = args.max_records_per_batch
    out = Path(args.out) if args.out else default_home() / "bench" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)

    import os

    connection = Connection.from_env(os.environ) or LocalRuntime(progress=log.info).up()
    topic = f"bench-events-{uuid.uuid4().hex[:6]}"
    create_topic(connection.kafka, topic, workloads.PARTITIONS)
    log.info(f"producing {profile.records:,} records to {topic}")
    began = time.monotonic()
    keys = args.keys or workloads.KEYS
    expected = workloads.produce(connection.kafka, topic, profile.records, keys=keys)
    log.info(f"produced in {time.monotonic() - began:.1f} s")
    scaling_topic, scaling_expected = None, None
    if any(v.startswith("scaling-") for v in variants):
        scaling_topic = f"bench-scaling-{uuid.uuid4().hex[:6]}"
        create_topic(connection.kafka, scaling_topic, workloads.SCALING_PARTITIONS)
        log.info(
            f"producing {profile.records:,} records to {scaling_topic} ({workloads.SCALING_PARTITIONS} partitions)"
        )
        scaling_expected = workloads.produce(
            connection.kafka, scaling_topic, profile.records, partitions=workloads.SCALING_PARTITIONS
        )
    context = {
        "connection": connection,
        "topic": topic,
        "expected": expected,
        "store": f"file://{out / 'store'}",
        "settings": settings,
        "out": out,
        "profile": args.profile,
        "scaling_topic": scaling_topic,
        "scaling_expected": scaling_expected,
        "cache_dir": LocalRuntimeSettings().cache_dir,
        # native-hdfs-batched reads in batches of this bound, as the jobs do
        "max_records_per_batch": int(
            settings.get("max_records_per_batch") or JobSettings.__dataclass_fields__["max_records_per_batch"].default
        ),
    }
    all_runs = []
    for round_ in range(1, profile.rounds + 1):
        order = variants if round_ % 2 else list(reversed(variants))
        for variant in order:
            log.info(f"round {round_}/{profile.rounds}: {variant}")
            try:
                run = _run(variant, round_, context)
            except SparkAbsError as exc:  # one failed run is reported, the others still count
                run = runs.Run(variant, round_, 0.0, detail={"error": str(exc)})
                log.warning(f"  {variant}: FAILED: {exc}")
                all_runs.append(run)
                continue
            all_runs.append(run)
            log.info(
                f"  {variant}: {run.records_per_s:,.0f} records/s over {run.seconds:.1f} s "
                f"(start-up {run.startup_s:.1f} s, {len(run.checkpoints_s)} checkpoints, "
                f"output {'verified' if run.verified else 'WRONG: ' + json.dumps(run.detail)})"
            )
            (out / "runs.json").write_text(json.dumps([r.to_dict() for r in all_runs], indent=2))
    if args.demo:
        log.info("demo at steady state, checkpoints every second")
        all_runs.append(
            runs.demo_run(
                connection,
                1,
                store=context["store"],
                seconds=profile.demo_seconds,
                rate=DEMO_RATE,
                settings=settings,
                log_dir=out / "logs",
            )
        )
    ratios = _ratios(all_runs, variants)
    table = _markdown(name, profile, all_runs, ratios, settings, connection.spark_master, keys)
    (out / "runs.json").write_text(json.dumps([r.to_dict() for r in all_runs], indent=2))
    (out / "ratios.json").write_text(json.dumps(ratios, indent=2))
    (out / "results.md").write_text(table)
    print()
    print(table)
    log.info(f"runs: {out / 'runs.json'}; table: {out / 'results.md'}")
    return 0 if all(r.verified for r in all_runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The benchmark's arithmetic and summaries (no services): percentiles,
ratios taken within a round, the Markdown table, py-spy stack summaries,
and the workload's key placement."""

from __future__ import annotations

import json

from benchmarks.__main__ import PROFILES, _markdown, _ratios, _variants
from benchmarks.profiles import summarise
from benchmarks.runs import Run, percentile, spark_task_metrics
from benchmarks.workloads import PARTITIONS, partition_of
from streaming.adapters.snapshots import UNSIGNED


def test_percentiles_by_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.99) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0


def test_ratios_are_taken_within_each_round_then_the_median():
    runs = [
        Run("abs-1stage", 1, 10.0, seconds=10.0, records=1000),  # 100/s
        Run("native-hdfs", 1, 8.0, seconds=5.0, records=1000),  # 200/s
        Run("abs-1stage", 2, 10.0, seconds=4.0, records=1000),  # 250/s
        Run("native-hdfs", 2, 8.0, seconds=4.0, records=1000),  # 250/s
        Run("abs-1stage", 3, 10.0, seconds=2.0, records=1000),  # 500/s
        Run("native-hdfs", 3, 8.0, seconds=1.0, records=1000),  # 1000/s
    ]
    (row,) = _ratios(runs, ["abs-1stage", "native-hdfs"])
    assert row["ratio"] == "spark-abs / native (HDFS state store)"
    assert row["rounds"] == [0.5, 1.0, 0.5] and row["median"] == 0.5


def test_the_table_names_every_variant_and_says_whether_its_output_verified():
    runs = [
        Run(
            "abs-1stage",
            1,
            12.0,
            seconds=10.0,
            records=1000,
            checkpoints_s=[1.0, 3.0],
            verified=True,
            detail={"handed_bytes_per_record": 92.25, "state_bytes": [1000, 3000, 2000]},
        ),
        Run("native-hdfs", 1, 8.0, seconds=5.0, records=1000, verified=False),
    ]
    table = _markdown(
        "quick", PROFILES["quick"], runs, _ratios(runs, ["abs-1stage", "native-hdfs"]), {}, keys=1_000_000
    )
    assert "300,000 records over 1,000,000 keys" in table
    assert "| abs-1stage | 100 | 12.0 | 2.00 | 2,000 | 92.2 | yes |" in table
    assert "| native-hdfs | 200 | 8.0 | - | - | - | NO |" in table
    assert "| spark-abs / native (HDFS state store) | 0.500 | 0.500 |" in table


def test_profiles_list_their_variants():
    assert _variants(PROFILES["quick"]) == [
        "native-hdfs",
        "native-hdfs-batched",
        "native-rocksdb",
        "abs-1stage",
        "abs-1stage-spark",
        "abs-1stage-ckpt1s",
        "abs-1stage-ckpt1s-incremental",
        "abs-2stage",
        "abs-2stage-spark-after",
        "abs-2stage-spark-first",
    ]
    assert "abs-1stage-ckpt0.5s" in _variants(PROFILES["full"]) and "abs-1stage-ckpt5s" in _variants(PROFILES["full"])


def test_a_stack_summary_counts_own_and_inclusive_samples(tmp_path):
    stacks = tmp_path / "w.stacks"
    stacks.write_text(
        "main (streaming/engine/worker/worker.py:1);process (streaming/engine/task/stage_task.py:9);loads (json/__init__.py:3) 30\n"
        "main (streaming/engine/worker/worker.py:1);process (streaming/engine/task/stage_task.py:9) 10\n"
        "main (streaming/engine/worker/worker.py:1);sleep (time:0) 60\n"
    )
    text = summarise(stacks)
    assert text.startswith("w.stacks: 100 samples")
    assert " 60.0   sleep (time:0)" in text and " 30.0   loads (json/__init__.py:3)" in text
    assert " 40.0   process (streaming/engine/task/stage_task.py:9)" in text.split("incl %")[1]


def test_every_key_has_one_partition():
    assert {partition_of(f"key-{i}") for i in range(1000)} == set(range(PARTITIONS))
    assert all(partition_of("key-7") == partition_of("key-7") for _ in range(3))


def test_a_run_is_done_when_a_committed_checkpoint_shows_its_input_read(tmp_path):
    from types import SimpleNamespace

    from benchmarks.runs import _Processed
    from streaming.adapters.objects import open_store
    from streaming.adapters.snapshots import SnapshotStore, TaskParts

    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), "bench", key=UNSIGNED)
    # (checkpoint, in-flight range on events:0 when the task took its snapshot); 2 is not committed
    for cid, (start, end) in ((1, (40, 101)), (2, (100, 102)), (3, (100, 103))):
        snap = store.write_task(
            cid, 0, "count-0", TaskParts(positions={"events:0": end + 1}, in_flight={"events:0": (start, end)})
        )
        store.write_manifest(cid, 0, {"count-0": snap})
    records = [SimpleNamespace(checkpoint_id=c, committed={"count-0"} if c != 2 else set()) for c in (1, 2, 3)]
    coordinator = SimpleNamespace(sink_tasks={"count-0"}, completed=lambda: records[:shown])
    runner = SimpleNamespace(coordinator=coordinator, store=store)
    processed = _Processed(runner, {"events:0": 100})
    shown = 1
    assert not processed()  # read up to 40 only: 60 input records still in flight
    shown = 2
    assert not processed()  # read to 100, but its output is not committed yet
    shown = 3
    assert processed()  # read to 100 and committed: only barrier records were in flight
    store.close()


def test_the_bytes_handed_to_python_per_record_come_from_the_workers_logs(tmp_path):
    from benchmarks.runs import handed_per_record
    from streaming.engine.worker.worker import HANDED_PER_RECORD

    assert handed_per_record(tmp_path) is None
    (tmp_path / "worker-all-g0.log").write_text(
        f"[worker] job-count-g0: 300 records read, 10.0 {HANDED_PER_RECORD}\n"
        f"[worker] job-other-g0: 100 records read, 50.0 {HANDED_PER_RECORD}\n"
    )
    assert handed_per_record(tmp_path) == 20.0  # weighted by the records each query read


def test_spark_task_metrics_are_summed_from_the_event_log_and_tabled(tmp_path):
    end = {
        "Event": "SparkListenerTaskEnd",
        "Task Metrics": {
            "Executor Run Time": 1500,
            "Executor CPU Time": 1_000_000_000,
            "Result Size": 4000,
            "Input Metrics": {"Records Read": 100},
        },
    }
    lines = [{"Event": "SparkListenerApplicationStart"}, end, {**end, "Task Metrics": {"Executor Run Time": 500}}]
    (tmp_path / "app-1").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    totals = spark_task_metrics(tmp_path)
    assert totals == {
        "tasks": 2,
        "executor_run_s": 2.0,
        "executor_cpu_s": 1.0,
        "records_read": 100,
        "result_bytes": 4000,
    }
    assert spark_task_metrics(tmp_path / "none") is None
    run = Run("abs-1stage-spark", 1, 5.0, seconds=1.0, records=100, verified=True, detail={"spark_tasks": totals})
    table = _markdown("quick", PROFILES["quick"], [run], [], {})
    assert "| abs-1stage-spark | 2 | 2.0 | 1.0 | 100 | 10000.0 | 40.0 |" in table

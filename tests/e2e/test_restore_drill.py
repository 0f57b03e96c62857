"""A restore drill on the real runtime: the money pipeline takes a few
checkpoints, `spark-abs checkpoints` lists them (each verified, the restore
pick marked), and the job is rolled back to its oldest checkpoint by name.
The output committed after that checkpoint is taken back, the replay writes
it again, and the committed output equals a run without failures.  The
workers restore in place (their Spark stays up), as after a declined or
failed checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest

from spark_abs_examples import money
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.api.settings import JobSettings
from streaming.engine.job.operations import run_until_caught_up
from streaming.engine.job.runner import JobRunner
from streaming.tools import cli
from streaming.tools.checkpoints.inspection import Checkpoints, to_spark

pytestmark = pytest.mark.integration


def _look_inside(spark, capsys, store: str, job: str, newest: int, oldest: int) -> None:
    """What a person runs before a restore: show, state, verify, restore --dry-run;
    and a state table queried with Spark SQL."""
    where = ["--store", store, "--job", job]
    assert cli.main(["checkpoints", "show", str(newest), *where]) == 0
    shown = capsys.readouterr().out
    assert f"checkpoint {newest} of job {job}: generation 0" in shown and "verifies" in shown, shown
    assert all(f"{stage}-0" in shown for stage in ("legs", "accounts", "windows")), shown
    assert cli.main(["state", str(newest), *where, "--task", "accounts-0"]) == 0
    assert re.search(r"table state: \d+ rows", capsys.readouterr().out)
    assert cli.main(["checkpoints", "diff", str(oldest), str(newest), *where]) == 0
    assert re.search(r"accounts-0\s+state\s+account\s+\d+", capsys.readouterr().out)
    assert cli.main(["checkpoints", "verify", *where]) == 0
    assert "checkpoint(s) verify" in capsys.readouterr().out
    assert cli.main(["restore", str(oldest), *where, "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert f"a restore picks checkpoint {oldest} and starts generation 1" in planned, planned

    with Checkpoints.open(store, job) as checkpoints:
        balances = checkpoints.state(newest, table="state")["state"]
    to_spark(spark, balances, view="balances")
    row = spark.sql(
        "SELECT count(*) AS accounts, sum(balance) AS total FROM balances WHERE task LIKE 'accounts-%'"
    ).first()
    # an aligned checkpoint holds no money in flight: the balances alone sum to zero
    assert row["accounts"] == balances.num_rows > 0 and row["total"] == 0, row


def test_roll_back_to_a_named_checkpoint(connection, spark, capsys, tmp_path, unique_name, lines):
    job, store = f"drill-{unique_name[-8:]}", f"file://{tmp_path}/store"
    data = money.make_transfers(400)
    runner = JobRunner(
        "spark_abs_examples.money:pipeline",
        JobSettings(store=store, interval_s=1, retain=20),
        connection,
        job=job,
    )
    runner.prepare()
    ingress = runner.pipeline.ingress[0]
    money.produce_transfers(connection.kafka, ingress.topic, data, ingress.partitions, end=True)
    try:
        runner.start()
        deadline = time.monotonic() + 240
        while sum(r.status == "completed" for r in runner.checkpoints()) < 3:
            assert time.monotonic() < deadline, "\n".join(lines[-20:])
            runner.step()

        listing = subprocess.run(
            [sys.executable, "-m", "streaming.tools.cli", "checkpoints", "--store", store, "--job", job],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **connection.as_env()},
        )
        assert listing.returncode == 0, listing.stderr
        usable = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+0 .* yes\b", listing.stdout, re.M)]
        assert len(usable) >= 3, listing.stdout
        assert re.search(rf"^\s+{usable[-1]}\s.*<- a restore picks this one", listing.stdout, re.M), listing.stdout
        oldest = usable[0]
        _look_inside(spark, capsys, store, job, usable[-1], oldest)

        sink = sink_location(runner.settings, job, connection)
        committed_after = [
            int(i.base_name.split("-")[1])
            for i in sink.filesystem.get_file_info(pafs.FileSelector(sink.path("output"), allow_not_found=True))
            if int(i.base_name.split("-")[1]) > oldest
        ]

        runner.restore("drill", checkpoint_id=oldest)
        run_until_caught_up(runner, 240)
    finally:
        runner.close()
    assert f"restoring generation 1 from checkpoint {oldest} (drill)" in lines
    assert runner.restores[0].checkpoint_id == oldest
    if committed_after:
        # output committed after the checkpoint was taken back, not left to be duplicated
        log_text = "".join(p.read_text() for p in runner.log_dir.glob("worker-*-g*.log"))
        assert re.search(rf"retracted \[{min(committed_after)}\b", log_text), log_text[-2000:]
    output = money.normalise(read_committed_output(sink))
    assert output == money.expected_output(data)

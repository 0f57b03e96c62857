"""``spark-abs ui`` on a local store written here, through Flask's test
client: the checkpoint history and its chart, one checkpoint's per-task
detail, operator and channel state, generations, the drill and compare
reports, what the control topic says (a topic of events handed in), the
pages an unknown job, a missing store or checkpoint get, and that nothing
but GET is served and nothing is written.  The browser test, on a running
job, is in tests/e2e/test_kafka_sink.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from datetime import datetime
from html import unescape
from pathlib import Path

import pyarrow as pa
import pytest

from barriers.failures import CheckpointFailure
from operators.state import KeyedState
from streaming.adapters.kafka.control.events import Abort, Ack, Complete, Decline, Progress, Ready, Trigger
from streaming.adapters.objects import open_store
from streaming.adapters.serde.records import RECORD_SCHEMA
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskParts
from streaming.api.job_key import JobKey
from streaming.api.topics import control_topic
from streaming.tools.ui.app import JobSource, create_app
from streaming.tools.ui.live import ControlWatch
from streaming.tools.ui.liveness import STALLED_S

JOB = "ledger"
CHANNEL = "legs:0"
SCALE = {"parallelism": {"accounts": 2}, "topics": {}}


def _balances(values: dict[str, int]) -> pa.Table:
    state = KeyedState(["account"], ["balance"])
    state.upsert(pa.table({"account": list(values), "balance": list(values.values())}))
    return state.snapshot()


def _copied() -> pa.Table:
    return pa.table(
        {
            "topic": ["legs"] * 2,
            "partition": [0] * 2,
            "offset": [101, 102],
            "key": [None] * 2,
            "value": [b'{"account": "a", "amount": 5}', b'{"account": "b", "amount": 7}'],
            "headers": [[{"key": "abs.gen", "value": b"1"}]] * 2,
            "timestamp": [datetime(2026, 1, 1)] * 2,
        },
        schema=RECORD_SCHEMA,
    )


def _checkpoint(store: SnapshotStore, cid: int, generation: int, balances: dict[str, int], seconds: float) -> None:
    snapshots = {
        "accounts-0": store.write_task(
            cid,
            generation,
            "accounts-0",
            TaskParts(
                state={"balances": _balances(balances)},
                positions={CHANNEL: 110},
                in_flight={CHANNEL: (101, 103)},
                channel_records={CHANNEL: _copied()},
                metadata={
                    "kind": "timed_out_to_unaligned",
                    "switch": "late_barrier",
                    "switched_after_ms": 210.0,
                    "first_barrier_s": 0.25,
                    "appended_s": 0.01,
                    "batch_began_s": 0.12,
                    "handed_s": 0.24,
                    "forwarded_s": 0.26,
                    "alignment_s": 0.0,
                    "sync_snapshot_s": 0.002,
                },
            ),
        ),
        "accounts-1": store.write_task(
            cid, generation, "accounts-1", TaskParts(state={"balances": _balances({"z": 1})}, positions={"legs:1": 40})
        ),
    }
    store.write_manifest(
        cid,
        generation,
        snapshots,
        options={"alignment": "aligned", "in_flight": "records", "alignment_timeout_ms": 200},
        metrics={
            "trigger_to_complete_s": seconds,
            "kinds": ["aligned", "timed_out_to_unaligned"],
            "tasks": {"accounts-0": {"async_snapshot_s": 0.1, "acked_s": 0.4}},
        },
    )


@pytest.fixture
def store_dir(tmp_path) -> Path:
    """Job ledger: generation 0 took checkpoint 1, generation 1 (restored
    from it) took 2 and left 3 without a manifest."""
    store = SnapshotStore(open_store(f"file://{tmp_path}/store"), JOB, key=UNSIGNED)
    store.first_generation(scale=SCALE)
    _checkpoint(store, 1, 0, {"a": 10, "b": -10}, 0.8)
    store.next_generation(1, scale=SCALE, cause="worker_died")
    _checkpoint(store, 2, 1, {"a": 12, "b": -10, "d": 3}, 1.3)
    store.write_task(3, 1, "accounts-0", TaskParts(positions={CHANNEL: 120}))
    store.close()
    return tmp_path / "store"


@pytest.fixture
def home(tmp_path) -> Path:
    """A home with two drills (of this job and of another, newer) and a compare run."""
    for name, job, passed in (("20260101-100000", JOB, True), ("20260101-110000", "other", False)):
        drill = tmp_path / "home" / "drills" / name
        drill.mkdir(parents=True)
        summary = {"job": job, "passed": passed, "verdict": f"verdict of {job}"}
        (drill / "report.json").write_text(json.dumps(summary))
        (drill / "report.md").write_text(f"# Drill of {job}\n\n| kind | restored from |\n")
    compare = tmp_path / "home" / "runs" / "compare-20260101-120000"
    compare.mkdir(parents=True)
    (compare / "timeline.png").write_bytes(b"\x89PNG timeline")
    (compare / "tables.txt").write_text("aligned vs unaligned")
    return tmp_path / "home"


@pytest.fixture
def client(store_dir, home):
    return create_app(JobSource(f"file://{store_dir}", JOB, home=home), refresh_s=3).test_client()


def _text(html: str) -> str:
    """The page's text, tags out, whitespace collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", re.sub(r"(?s)<(script|style).*?</\1>", "", html))).split())


def _rows(html: str, section: str) -> list[list[str]]:
    """The body rows of the table of the section whose id or title starts with ``section``."""
    for block in re.findall(r'(?s)<section class="table"(.*?)</section>', html):
        head = re.search(r'^ id="([^"]*)"', block)
        title = re.search(r"<h3>(.*?)</h3>", block)
        if (head and head.group(1) == section) or (title and unescape(title.group(1)).startswith(section)):
            body = block.split("<tbody>", 1)[1]
            return [
                [_text(cell) for cell in re.findall(r"(?s)<td[^>]*>(.*?)</td>", row)]
                for row in re.findall(r"(?s)<tr>(.*?)</tr>", body)
            ]
    raise AssertionError(f"no table {section!r} in the page")


def test_the_history_lists_every_checkpoint_links_each_and_charts_them(client):
    page = client.get("/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    rows = _rows(html, "history")
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[1] for r in rows] == ["0", "1", "-"]  # generations
    assert [r[3] for r in rows] == ["0.80", "1.30", "-"]  # seconds, trigger to complete
    assert rows[0][6] == "aligned, aligned, unaligned after the alignment timeout"
    assert (
        rows[1][7] == "yes <- a restore picks this one"
        and rows[2][7] == "NO: no manifest: in progress, or never completed"
    )
    assert '<a href="/checkpoints/2">2</a>' in html
    assert '<script src="/assets/plotly.min.js">' in html and 'id="history-chart"' in html
    assert '<meta http-equiv="refresh" content="3">' in html
    text = _text(html)
    assert "generation 1 · 2 complete checkpoint(s), 1 without a manifest · a restore picks checkpoint 2" in text
    assert "From the store alone" in text
    ((level, said),) = _liveness(html)  # from the store alone: no count of failed checkpoints
    assert level == "ok" and re.fullmatch(r"the newest checkpoint completed \d+ s ago", said), said


def _liveness(html: str) -> list[tuple[str, str]]:
    """The parts of the overview's liveness line: (how it looks, what it says)."""
    line = re.search(r'(?s)<p id="liveness">(.*?)</p>', html)
    assert line, "no liveness line in the page"
    return [(level, _text(said)) for level, said in re.findall(r'(?s)<span class="(\w+)">(.*?)</span>', line.group(1))]


@pytest.mark.parametrize(
    ("after", "level", "said"),
    [
        (STALLED_S - 10, "ok", "the newest checkpoint completed 5 min ago"),
        (
            STALLED_S + 90,
            "problem",
            "no checkpoint completed for 6 min (the newest: 2): if the job runs, it is stalled; see the runner's log",
        ),
        (3 * 3600, "problem", "no checkpoint completed for 3.0 h (the newest: 2)"),
    ],
)
def test_a_job_without_a_checkpoint_for_longer_than_the_alert_bound_is_called_stalled(
    store_dir, home, after, level, said
):
    with SnapshotStore(open_store(f"file://{store_dir}"), JOB, key=UNSIGNED) as store:
        completed = datetime.fromisoformat(store.read_manifest(2).created_at).timestamp()
    app = create_app(JobSource(f"file://{store_dir}", JOB, home=home), clock=lambda: completed + after)
    ((shown_level, shown),) = _liveness(app.test_client().get("/").get_data(as_text=True))
    assert shown_level == level and shown.startswith(said), shown


def test_plotly_js_comes_from_the_app(client):
    js = client.get("/assets/plotly.min.js")
    assert js.status_code == 200 and js.mimetype == "application/javascript"
    assert b"plotly.js v" in js.data[:1000] and js.cache_control.max_age == 86400


def test_a_checkpoint_shows_each_task_its_barrier_path_and_why_it_turned_unaligned(client):
    page = client.get("/checkpoints/2")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    tasks = _rows(html, "tasks")
    assert [(t[0], t[1]) for t in tasks] == [
        ("accounts-0", "aligned, unaligned after the alignment timeout"),
        ("accounts-1", "-"),
    ]
    path = {row[0]: row[1:] for row in _rows(html, "barrier path")}
    assert path["accounts-0"] == ["0.010", "0.120", "0.240", "0.250", "0.260", "0.400"]
    assert path["accounts-1"] == ["-"] * 6
    channels = _rows(html, "channels")
    assert ["accounts-0", CHANNEL, "110", "[101, 103)", "2", "-"] in channels
    text = _text(html)
    assert "checkpoint 2 of job ledger: generation 1" in text and "verifies" in text
    assert "accounts-0 turned unaligned 210 ms after the trigger: its first barrier came after" in text


def test_the_state_browser_shows_the_tables_of_spark_abs_state(client):
    html = client.get("/checkpoints/2/state?table=balances&rows=2").get_data(as_text=True)
    assert "table balances: 4 rows (first 2)" in _text(html)
    assert len(_rows(html, "table balances")) == 2
    one = client.get("/checkpoints/2/state?task=accounts-1").get_data(as_text=True)
    assert _rows(one, "table balances") == [["accounts-1", "z", "1"]]
    missing = client.get("/checkpoints/2/state?table=windows")
    assert missing.status_code == 404 and "no state table &#39;windows&#39;" in missing.get_data(as_text=True)
    channels = client.get("/checkpoints/2/channels").get_data(as_text=True)
    assert "channel state: 2 records, 2 rows" in _text(channels)
    assert _rows(channels, "channel state") == [["accounts-0", CHANNEL, "copied", "2", "0", "2"]]


def test_generations_say_where_each_started(client):
    page = client.get("/generations")
    assert page.status_code == 200
    rows = _rows(page.get_data(as_text=True), "generations")
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        ("0", "fresh start", "accounts=2", "-"),
        ("1", "restored from checkpoint 1", "accounts=2", "a worker process died"),
    ]


def test_reports_show_the_jobs_latest_drill_and_the_latest_compare_charts(client):
    text = _text(client.get("/reports").get_data(as_text=True))
    assert "passed verdict of ledger" in text and "# Drill of ledger" in text
    assert "other" not in text  # a newer drill, of another job
    assert "aligned vs unaligned" in text
    chart = client.get("/reports/compare/timeline.png")
    assert chart.status_code == 200 and chart.mimetype == "image/png" and chart.data == b"\x89PNG timeline"
    assert client.get("/reports/compare/bytes.png").status_code == 404  # not in that run
    assert client.get("/reports/compare/tables.txt").status_code == 404  # in that run, but not a chart


def test_an_unknown_job_a_missing_store_and_a_missing_checkpoint_are_pages(store_dir, home, client):
    unknown = create_app(JobSource(f"file://{store_dir}", "nope", home=home)).test_client()
    page = unknown.get("/")
    assert page.status_code == 404 and "holds no job named nope" in _text(page.get_data(as_text=True))
    assert unknown.get("/generations").status_code == 404
    gone = create_app(JobSource(f"file://{store_dir}-gone", JOB, home=home)).test_client().get("/")
    assert gone.status_code == 503 and "no such directory" in _text(gone.get_data(as_text=True))
    assert not Path(f"{store_dir}-gone").exists()
    pending = client.get("/checkpoints/3")
    assert pending.status_code == 404 and "checkpoint 3 has no manifest" in _text(pending.get_data(as_text=True))
    assert "checkpoint 9 is not in the store" in _text(client.get("/checkpoints/9/state").get_data(as_text=True))


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_only_get_is_served_and_nothing_is_written(client, store_dir, home):
    before = _tree(store_dir.parent)
    pages = ["/", "/checkpoints/2", "/checkpoints/2/state", "/checkpoints/2/channels", "/generations", "/reports"]
    for url in pages:
        assert client.get(url).status_code == 200, url
        for method in ("post", "put", "delete", "patch"):
            assert getattr(client, method)(url).status_code == 405, (method, url)
    assert _tree(store_dir.parent) == before


class _Topic:
    """A control topic that hands out events, a batch per poll, and has
    rejected ``rejected`` records (by reason)."""

    def __init__(self, *batches, rejected=None):
        self.batches = list(batches)
        self.rejected = dict(rejected or {})

    def poll(self, timeout_s: float = 0.0):
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        pass


def _watching(topic: _Topic, monkeypatch) -> ControlWatch:
    watch = ControlWatch("127.0.0.1:1", JOB, JobKey.derive("s" * 32, JOB, cluster="test-cluster"))
    monkeypatch.setattr(watch, "_open", lambda: (topic, 0))
    return watch


def test_the_key_asked_of_a_kafka_that_is_down_leaves_the_page_up_and_says_why(store_dir, home, monkeypatch):
    """The control topic's key binds Kafka's cluster id: asked on the first
    look, not before the page is served, so a page over the store alone
    still comes up while Kafka is down, saying why there is no live view."""
    from streaming.errors import KafkaUnavailableError
    from streaming.tools.ui import live

    class _Admin:
        def list_topics(self):
            return [control_topic(JOB)]

        def close(self):
            pass

    def no_cluster_id():
        raise KafkaUnavailableError("no Kafka broker answers at 127.0.0.1:1")

    monkeypatch.setattr(live, "admin_client", lambda kafka, timeout_s: _Admin())
    monkeypatch.setattr(live, "end_offsets", lambda kafka, topic, partitions: [0])
    watch = ControlWatch("127.0.0.1:1", JOB, no_cluster_id)
    app = create_app(JobSource(f"file://{store_dir}", JOB, home=home), watch=watch)
    page = app.test_client().get("/")
    assert page.status_code == 200
    assert "no Kafka broker answers at 127.0.0.1:1" in unescape(page.get_data(as_text=True))


def test_the_control_topic_shows_checkpoints_in_progress_and_aborted(store_dir, home, monkeypatch):
    topic = _Topic(
        [
            Ready("accounts-0", 1),
            Ready("accounts-1", 1),
            Trigger(2, 1),
            Ack(2, "accounts-0", 1),
            Ack(2, "accounts-1", 1),
            Complete(2, 1),
            Trigger(4, 1),
            Decline(4, "accounts-1", 1, CheckpointFailure.STORE_FAILURE, "disk full"),
            Abort(4, 1, CheckpointFailure.STORE_FAILURE, "accounts-1 declined", "accounts-1", 1, 3),
        ],
        [Trigger(5, 1), Ack(5, "accounts-0", 1)],
    )
    app = create_app(JobSource(f"file://{store_dir}", JOB, home=home), watch=_watching(topic, monkeypatch))
    html = app.test_client().get("/").get_data(as_text=True)
    assert _rows(html, "live") == [
        ["4", "1", "aborted", "0 of 2", "the snapshot store failed (accounts-1 declined), by accounts-1"],
        ["5", "1", "in progress", "1 of 2: accounts-0", "-"],
    ]
    assert "live: the store and the control topic" in html
    assert _liveness(html)[1] == ("warn", "1 checkpoint(s) failed in a row (the job restores past 3)")


@pytest.mark.parametrize(
    ("events", "said"),
    [
        # a generation starts at 0; a complete resets the count; an abort says it, counted or not
        ([Trigger(6, 1)], ("ok", "0 checkpoint(s) failed in a row")),
        (
            [Abort(6, 1, CheckpointFailure.TIMEOUT, "", "", 1, 3), Complete(7, 1)],
            ("ok", "0 checkpoint(s) failed in a row (the job restores past 3)"),
        ),
        (
            [
                Abort(6, 1, CheckpointFailure.TIMEOUT, "", "", 2, 3),
                Abort(7, 1, CheckpointFailure.SUBSUMED, "", "", 2, 3),
            ],
            ("warn", "2 checkpoint(s) failed in a row (the job restores past 3)"),
        ),
        (
            [Abort(6, 1, CheckpointFailure.TIMEOUT, "", "", 5, 3)],
            (
                "problem",
                "5 checkpoint(s) failed in a row, more than the 3 the job tolerates: its runner should have "
                "restored it; see the runner's log",
            ),
        ),
        # the failures of an earlier generation are not the current one's
        (
            [Abort(6, 1, CheckpointFailure.TIMEOUT, "", "", 4, 3), Ready("accounts-0", 2)],
            ("ok", "0 checkpoint(s) failed in a row (the job restores past 3)"),
        ),
        # an older runner's aborts do not say the count: nothing is claimed
        ([Abort(6, 1, CheckpointFailure.TIMEOUT)], None),
    ],
)
def test_the_checkpoints_failed_in_a_row_are_the_coordinators_count(store_dir, home, monkeypatch, events, said):
    app = create_app(JobSource(f"file://{store_dir}", JOB, home=home), watch=_watching(_Topic(events), monkeypatch))
    parts = _liveness(app.test_client().get("/").get_data(as_text=True))
    assert parts[1:] == ([said] if said else [])


def test_records_the_jobs_key_does_not_vouch_for_are_a_problem_on_the_page(store_dir, home, monkeypatch):
    topic = _Topic([Trigger(6, 1)], rejected={"unsigned": 2, "signature": 1})
    app = create_app(JobSource(f"file://{store_dir}", JOB, home=home), watch=_watching(topic, monkeypatch))
    parts = _liveness(app.test_client().get("/").get_data(as_text=True))
    assert parts[-1] == (
        "problem",
        "3 record(s) on the control topic not signed with the job's key (1 signature, 2 unsigned), ignored: "
        "someone else writes to the job's topics; see the runner's log",
    )


def test_records_the_stages_code_raised_on_are_a_warning_on_the_page_by_the_tasks_latest_progress(
    store_dir, home, monkeypatch
):
    topic = _Topic(
        [
            Progress("accounts-0", 1, records=90, set_aside=1),
            Progress("accounts-1", 1, records=80, set_aside=2),
            Progress("accounts-0", 1, records=120, set_aside=3),  # the latest of a task counts
            Progress("legs-0", 0, set_aside=7),  # an older generation's: not the current one's
        ]
    )
    app = create_app(JobSource(f"file://{store_dir}", JOB, home=home), watch=_watching(topic, monkeypatch))
    parts = _liveness(app.test_client().get("/").get_data(as_text=True))
    assert parts[-1] == (
        "warn",
        "5 record(s) the stages' code raised on set aside to the dead letters in this generation (the job goes on "
        "without them); see the dead-letter topic",
    )


def test_a_job_without_a_control_topic_says_so():
    class _NoTopic(ControlWatch):
        def _open(self):
            return None

    view = _NoTopic("127.0.0.1:1", JOB, JobKey.derive("s" * 32, JOB, cluster="test-cluster")).look()
    assert view.problem == f"Kafka has no topic spark-abs.{JOB}.control" and view.in_progress == ()


def _ui(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streaming.tools.cli", "ui", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env} if env else None,
    )


def test_the_command_serves_warns_off_loopback_and_fails_clearly_on_a_taken_port(store_dir):
    """Off loopback with a token (tests/streaming/tools/ui/test_access.py: what it asks of requests)."""
    where = ("--store", f"file://{store_dir}", "--job", JOB, "--store-only")
    served = _ui(*where, "--host", "0.0.0.0", "--port", "0", env={"SPARK_ABS_UI_TOKEN": "a-token"})
    try:
        said = [served.stdout.readline() for _ in range(2)]
    finally:
        served.terminate()
        served.wait(30)
    assert any("not loopback: every request must carry the token" in line for line in said), said
    url = next(line for line in said if "http://" in line)
    assert "read-only" in url and re.search(r"http://0\.0\.0\.0:[1-9]\d*/", url), url
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = _ui(*where, "--port", str(port))
        out, _ = busy.communicate(timeout=60)
    assert busy.returncode == 1 and f"Port {port} is in use by another program" in out, out  # werkzeug's words
    assert "Traceback" not in out

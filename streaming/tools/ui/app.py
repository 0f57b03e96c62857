"""``spark-abs ui``: a read-only web page for one job, a Flask app.

Every page reads the job's store afresh, through what the command line
reads it with (``streaming.tools.checkpoints.inspection``) and as the same rows
(``streaming.tools.tables``):

- ``/``: the checkpoint history (``checkpoints list``: status, duration,
  size and kinds, the one a restore picks), whether the job still
  completes checkpoints (``liveness``: since when, and, live, how many
  failed in a row against how many it tolerates), a plotly chart of each
  checkpoint's duration and state size, and, live, what the job's control
  topic says of checkpoints in progress and aborted (``live``); it
  reloads itself every ``refresh_s`` seconds;
- ``/checkpoints/<n>``: one checkpoint's per-task detail (``checkpoints
  show``: the barrier's path through each task, alignment, why a task
  turned unaligned, state tables, channels, lineage);
- ``/checkpoints/<n>/state`` and ``/checkpoints/<n>/channels``: its
  operator and channel state as tables (``spark-abs state``);
- ``/generations``: the job's generations and the restores that started
  them (``_JOB.json``);
- ``/reports``: the latest ``spark-abs drill`` report of the job and the
  charts of the latest ``spark-abs compare`` run (files under the home).

Only GET routes: nothing here writes to the store, Kafka or the home.  An
unknown job, a store that does not answer or a checkpoint that is not
there is a page that says so.  Every request is checked first
(``streaming.tools.ui.access``): the ``Host`` it names and, when the page is
exposed, its token."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import plotly.graph_objects as go
import plotly.offline
from flask import Flask, Response, abort, render_template, request, send_file, url_for
from jinja2 import DictLoader
from plotly.subplots import make_subplots
from werkzeug.serving import BaseWSGIServer, make_server

from streaming.api.config import Connection, default_home
from streaming.errors import KafkaUnavailableError, SnapshotMissingError, SparkAbsError, StoreError
from streaming.tools.checkpoints.inspection import CheckpointRow, Checkpoints
from streaming.tools.compare.report import CHARTS
from streaming.tools.tables import (
    channel_parts,
    checkpoint_table,
    detail_parts,
    generation_table,
    restore_pick,
    state_parts,
)
from streaming.tools.ui.access import Access, RedactingRequestHandler, guard
from streaming.tools.ui.live import ControlWatch, live_table
from streaming.tools.ui.liveness import JobLiveness
from streaming.tools.ui.templates import TEMPLATES

__all__ = ["JobSource", "DrillSummary", "CompareRun", "create_app", "serve", "latest_drill", "latest_compare"]

log = logging.getLogger(__name__)

# rows a state page shows per table unless asked for more (and at most)
ROWS = 20
MAX_ROWS = 1000


@dataclass(frozen=True)
class JobSource:
    """Where the pages read: job ``job`` in the store ``store`` (``file://``
    or ``s3://``), through ``connection`` (S3, and Kafka for channel state
    kept as ranges); the drill and compare reports under ``home``."""

    store: str
    job: str
    connection: Connection | None = None
    home: Path = field(default_factory=default_home)

    @contextmanager
    def checkpoints(self) -> Iterator[Checkpoints]:
        """The job's checkpoints, opened for one request.  A local store that
        does not exist is an error, not a directory made for it."""
        parsed = urlparse(self.store)
        if parsed.scheme in ("", "file") and not Path(parsed.path if parsed.scheme else self.store).is_dir():
            raise StoreError(f"store {self.store}: no such directory")
        with Checkpoints.open(self.store, self.job, self.connection) as checkpoints:
            yield checkpoints


@dataclass(frozen=True)
class DrillSummary:
    """A ``spark-abs drill`` report directory: its verdict and ``report.md``."""

    directory: Path
    passed: bool
    verdict: str
    text: str


@dataclass(frozen=True)
class CompareRun:
    """A ``spark-abs compare`` output directory: its tables and the charts it holds."""

    directory: Path
    charts: tuple[str, ...]
    text: str


def latest_drill(home: Path, job: str) -> DrillSummary | None:
    """The newest drill report of ``job`` under ``<home>/drills`` (its
    directories are named by their start time)."""
    for directory in sorted((home / "drills").glob("*"), reverse=True):
        try:
            summary = json.loads((directory / "report.json").read_text())
            text = (directory / "report.md").read_text()
        except (OSError, ValueError):
            continue
        if summary.get("job") == job or job in summary.get("jobs", ()):  # a drill of several modes: a job each
            return DrillSummary(directory, bool(summary.get("passed")), str(summary.get("verdict", "")), text)
    return None


def latest_compare(home: Path) -> CompareRun | None:
    """The newest compare run with charts under ``<home>/runs``."""
    for directory in sorted((home / "runs").glob("compare-*"), reverse=True):
        charts = tuple(name for name in CHARTS if (directory / name).is_file())
        if charts:
            tables = directory / "tables.txt"
            return CompareRun(directory, charts, tables.read_text() if tables.is_file() else "")
    return None


def history_chart(rows: list[CheckpointRow]) -> str | None:
    """Each complete checkpoint's trigger-to-complete time and state size, a
    plotly chart (HTML to embed; plotly.js comes from the app); None without
    a complete checkpoint."""
    done = [r for r in rows if r.complete]
    if not done:
        return None
    ids = [r.checkpoint_id for r in done]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=("trigger to complete (seconds)", "state size (bytes)"),
    )
    seconds = [r.trigger_to_complete_s for r in done]
    fig.add_trace(go.Scatter(x=ids, y=seconds, mode="lines+markers", name="seconds", line_color="#2f5fb3"), 1, 1)
    fig.add_trace(go.Bar(x=ids, y=[r.state_bytes for r in done], name="state bytes", marker_color="#8fb0e6"), 2, 1)
    fig.update_layout(height=380, margin=dict(l=50, r=20, t=30, b=30), showlegend=False, template="plotly_white")
    fig.update_annotations(font_size=13)
    fig.update_xaxes(type="category")  # checkpoint ids, not a continuous scale
    fig.update_xaxes(title_text="checkpoint", row=2, col=1)
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id="history-chart", config={"displaylogo": False})


@functools.cache
def _plotly_js() -> str:
    return plotly.offline.get_plotlyjs()


def create_app(
    source: JobSource,
    *,
    refresh_s: float = 5.0,
    watch: ControlWatch | None = None,
    clock: Callable[[], float] = time.time,
    access: Access | None = None,
) -> Flask:
    """The web app of ``source``'s job; ``watch`` follows its control topic
    (None: from the store alone); the history page reloads itself every
    ``refresh_s`` seconds (0: never); ``clock`` is the Unix time the
    overview tells the age of the newest checkpoint by; ``access`` the hosts
    a request may name and the token it must carry (default: loopback's
    names, no token)."""
    app = Flask(__name__, static_folder=None)
    guard(app, access or Access())
    app.jinja_loader = DictLoader(TEMPLATES)
    mode = "live: the store and the control topic" if watch is not None else "from the store"
    refresh = f"{refresh_s:g}" if refresh_s > 0 else None

    def page(template: str, **values) -> str:
        return render_template(template, job=source.job, store=source.store, mode=mode, **values)

    def rows_asked() -> int:
        return max(1, min(MAX_ROWS, request.args.get("rows", ROWS, type=int) or ROWS))

    @app.get("/")
    def overview():
        with source.checkpoints() as checkpoints:
            generation = checkpoints.generation()
            rows = checkpoints.rows(checksums=False) if generation is not None else []
        if generation is None:
            return page("overview.html", title=source.job, page="checkpoints", unknown=True, refresh=refresh), 404
        history, below = checkpoint_table(source.job, rows, generation)
        view = watch.look() if watch is not None else None
        return page(
            "overview.html",
            title=source.job,
            page="checkpoints",
            refresh=refresh,
            generation=generation,
            complete=sum(r.complete for r in rows),
            incomplete=sum(not r.complete for r in rows),
            pick=restore_pick(rows),
            history=history,
            below=below,
            liveness=JobLiveness.of(rows, view, clock()),
            live=view,
            live_rows=live_table(view) if view is not None else None,
            chart=history_chart(rows),
            link=lambda n: url_for("checkpoint", checkpoint_id=n),
        )

    @app.get("/checkpoints/<int:checkpoint_id>")
    def checkpoint(checkpoint_id: int):
        with source.checkpoints() as checkpoints:
            _require_complete(checkpoints, checkpoint_id)
            detail = checkpoints.detail(checkpoint_id)
        return page(
            "checkpoint.html",
            title=f"checkpoint {checkpoint_id}",
            page="checkpoints",
            checkpoint_id=checkpoint_id,
            items=detail_parts(detail),
        )

    @app.get("/checkpoints/<int:checkpoint_id>/state")
    def state(checkpoint_id: int):
        task, table, rows = request.args.get("task") or None, request.args.get("table") or None, rows_asked()
        with source.checkpoints() as checkpoints:
            _require_complete(checkpoints, checkpoint_id)
            manifest = checkpoints.store.read_manifest(checkpoint_id)
            tables = checkpoints.state(checkpoint_id, task=task, table=table)
        names = sorted({p.name for t in manifest.tasks.values() for p in t.state_parts} | _chained(manifest))
        return page(
            "state.html",
            title=f"state of checkpoint {checkpoint_id}",
            page="checkpoints",
            heading=f"Operator state of checkpoint {checkpoint_id}",
            what="each state table, the rows of every task with the task as a column (spark-abs state)",
            checkpoint_id=checkpoint_id,
            tasks=sorted(manifest.tasks),
            tables=names,
            task=task,
            table=table,
            rows=rows,
            items=state_parts(tables, rows),
        )

    @app.get("/checkpoints/<int:checkpoint_id>/channels")
    def channels(checkpoint_id: int):
        task, rows = request.args.get("task") or None, rows_asked()
        with source.checkpoints() as checkpoints:
            _require_complete(checkpoints, checkpoint_id)
            tasks = sorted(checkpoints.store.read_manifest(checkpoint_id).tasks)
            held = checkpoints.channel_state(checkpoint_id, task=task)
        return page(
            "state.html",
            title=f"channel state of checkpoint {checkpoint_id}",
            page="checkpoints",
            heading=f"Channel state of checkpoint {checkpoint_id}",
            what="unaligned channel state, one row per Kafka record: copied into the checkpoint, or read back "
            "from Kafka by offset range (spark-abs state --channels)",
            checkpoint_id=checkpoint_id,
            tasks=tasks,
            tables=None,
            task=task,
            table=None,
            rows=rows,
            items=channel_parts(held.records, held.rows, held.problems, rows),
        )

    @app.get("/generations")
    def generations():
        with source.checkpoints() as checkpoints:
            meta = checkpoints.store.read_job()
            known = meta is not None or bool(checkpoints.store.checkpoints())
        if not known:
            return page("overview.html", title=source.job, page="generations", unknown=True), 404
        return page(
            "generations.html",
            title=f"generations of {source.job}",
            page="generations",
            refresh=refresh,
            generations=generation_table(meta),
            drill=latest_drill(source.home, source.job),
        )

    @app.get("/reports")
    def reports():
        return page(
            "reports.html",
            title="reports",
            page="reports",
            home=source.home,
            drill=latest_drill(source.home, source.job),
            compare=latest_compare(source.home),
        )

    @app.get("/reports/compare/<name>")
    def compare_chart(name: str):
        run = latest_compare(source.home)
        if run is None or name not in run.charts:
            abort(404)
        return send_file(run.directory / name, mimetype="image/png", max_age=0)

    @app.get("/assets/plotly.min.js")
    def plotly_js():
        response = Response(_plotly_js(), mimetype="application/javascript")
        response.cache_control.public = True
        response.cache_control.max_age = 86400
        return response

    @app.errorhandler(SparkAbsError)
    def failed(exc: SparkAbsError):
        if isinstance(exc, SnapshotMissingError):
            title, status = "Not in the store", 404
        elif isinstance(exc, StoreError | KafkaUnavailableError):
            title, status = "The store does not answer", 503
        else:
            title, status = "Cannot show this", 500
        log.debug("ui: %s: %s", request.path, exc)
        return page("error.html", title=title, page="", message=str(exc)), status

    return app


def _require_complete(checkpoints: Checkpoints, checkpoint_id: int) -> None:
    """A ``SnapshotMissingError`` for a checkpoint the store does not hold whole."""
    if checkpoint_id not in checkpoints.store.completed():
        there = checkpoint_id in checkpoints.store.checkpoints()
        raise SnapshotMissingError(
            f"job {checkpoints.job}: checkpoint {checkpoint_id} "
            + ("has no manifest: it is in progress, or never completed" if there else "is not in the store")
        )


def _chained(manifest) -> set[str]:
    """The tables an incremental checkpoint holds as chains."""
    return {name for t in manifest.tasks.values() for name in t.state_chains}


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8050) -> BaseWSGIServer:
    """A threaded HTTP server of ``app`` on ``host:port`` (port 0: a free
    one, ``server.server_port``), not started: ``serve_forever`` it.  Its
    request log never shows a ``?token=``."""
    return make_server(host, port, app, threaded=True, request_handler=RedactingRequestHandler)

"""What ``spark-abs drill`` shows and writes, for a whole run
(``DrillRun``: one phase per mode drilled): per phase a table of the
failures (kind, when, the checkpoint each restore picked, time to recover,
input records replayed) and a table of the expectations (suite, what it
checks, pass or fail, what GX observed); for the run the recovery times'
percentiles per kind and mode (``recovery_rows``), the input records
replayed, and the verdict.  ``write`` puts in one directory ``report.md``
(the same, for a person), ``report.json`` (for a script),
``recoveries.png`` (each recovery's time through the run, by kind),
``gx-<suite>.json`` (great-expectations' own validation results) and
``<suite>.csv`` (the tables the suites ran on), under ``<mode>/`` when the
run drilled more than one mode."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import cast

from streaming.tools.drill.plan import LIVENESS_KINDS, FailureOutcome, percentile
from streaming.tools.views import as_text, titled_table

__all__ = [
    "RECOVERY_COLUMNS",
    "chart",
    "expectation_rows",
    "failure_rows",
    "markdown",
    "recovery_rows",
    "render",
    "verdict",
    "write",
]

FAILURE_COLUMNS = ("#", "kind", "what", "at s", "restored from", "restore s", "recovered s", "replayed", "note")
EXPECTATION_COLUMNS = ("suite", "expectation", "column", "result", "observed")
RECOVERY_COLUMNS = (
    "failures",
    "n",
    "p50 s",
    "p90 s",
    "p99 s",
    "max s",
    "restore p50 s",
    "restores",
    "replayed",
    "not recovered",
)


def _restored(outcome) -> str:
    return ", then ".join(outcome.restores()) or "-"


def failure_rows(report) -> list[tuple]:
    rows = []
    for o in report.outcomes:
        note = o.note
        if o.orphans_gone_s is not None:
            note = "; ".join(filter(None, [f"processes gone {o.orphans_gone_s:.1f} s after the runner", note]))
        rows.append(
            (
                o.failure.index + 1,
                o.failure.kind.value,
                o.failure.describe(),
                f"{o.at_s:.1f}",
                _restored(o),
                _seconds(o.restore_s),
                "NOT RECOVERED" if o.recovered_s is None else f"{o.recovered_s:.1f}",
                "-" if o.replayed is None else o.replayed,
                note or "-",
            )
        )
    return rows


def expectation_rows(report) -> list[tuple]:
    return [
        (o.suite, o.expectation, o.column or "-", "pass" if o.success else "FAIL", o.observed or "-")
        for suite in report.checks
        for o in suite.outcomes
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _recovery_row(name: str, outcomes: Sequence[FailureOutcome]) -> tuple:
    times = [o.recovered_s for o in outcomes if o.recovered_s is not None]
    return (
        name,
        len(outcomes),
        *(_seconds(percentile(times, q)) for q in (50, 90, 99)),
        _seconds(max(times) if times else None),
        _seconds(percentile([o.restore_s for o in outcomes if o.restore_s is not None], 50)),
        sum(len(o.restored_from) for o in outcomes),
        sum(o.replayed or 0 for o in outcomes),
        len(outcomes) - len(times),
    )


def recovery_rows(phases: Sequence[tuple[str, Sequence[FailureOutcome]]]) -> list[tuple]:
    """Recovery times (failure to the next completed checkpoint) as
    percentiles, with the restores, the input records replayed and the
    failures not recovered: every failure, then per mode (when there are
    several) and per kind.  ``phases``: (mode, its outcomes)."""
    every = [o for _, outcomes in phases for o in outcomes]
    rows = [_recovery_row("all", every)]
    if len(phases) > 1:
        rows += [_recovery_row(f"mode {mode}", outcomes) for mode, outcomes in phases]
    kinds = sorted({o.failure.kind.value for o in every})
    rows += [_recovery_row(kind, [o for o in every if o.failure.kind.value == kind]) for kind in kinds]
    return rows


def _phases(run) -> list[tuple[str, Sequence[FailureOutcome]]]:
    return [(str(p.mode), p.outcomes) for p in run.phases]


def _phase_verdict(report) -> str:
    failed = [o for suite in report.checks for o in suite.outcomes if not o.success]
    kinds = sorted({o.failure.kind.value for o in report.outcomes})
    if report.passed:
        return (
            f"PASSED: {len(report.outcomes)} failures ({', '.join(kinds) or 'none'}), every one recovered, "
            f"every expectation met ({report.checkpoints} checkpoints, {report.produced} records in)"
        )
    reasons = [f"{o.suite}: {o.expectation} (observed {o.observed})" for o in failed] + list(report.problems)
    if not report.checks:
        reasons.append("the output was not checked")
    return "FAILED: " + "; ".join(reasons)


def verdict(run) -> str:
    """The run's verdict: PASSED with what it took, or FAILED with every reason (per mode when several)."""
    several = len(run.phases) > 1
    if run.passed:
        kinds = sorted({o.failure.kind.value for o in run.outcomes})
        modes = ", ".join(str(p.mode) for p in run.phases)
        return (
            f"PASSED: {len(run.outcomes)} failures ({', '.join(kinds) or 'none'}; {modes}), every one recovered, "
            f"every expectation met ({sum(p.checkpoints for p in run.phases)} checkpoints, "
            f"{sum(p.produced for p in run.phases)} records in, {run.seconds / 60:.1f} min)"
        )
    if not run.phases:
        return "FAILED: no phase ran"
    reasons = [
        (f"{p.mode}: " if several else "") + _phase_verdict(p).removeprefix("FAILED: ")
        for p in run.phases
        if not p.passed
    ]
    return "FAILED: " + "; ".join(reasons)


def _stopped(run) -> list[str]:
    return [(f"{p.mode}: " if len(run.phases) > 1 else "") + p.stopped for p in run.phases if p.stopped]


def render(run) -> str:
    """The run as text tables (what the command prints)."""
    parts = []
    for p in run.phases:
        parts.append(
            titled_table(
                f"drill {p.job}: {p.mode}, failures (seed {p.seed})", FAILURE_COLUMNS, failure_rows(p), right=("#",)
            )
        )
        parts.append(
            titled_table(f"{p.mode}: expectations (great-expectations)", EXPECTATION_COLUMNS, expectation_rows(p))
        )
    parts.append(
        titled_table(
            "recoveries (failure to the next completed checkpoint)",
            RECOVERY_COLUMNS,
            recovery_rows(_phases(run)),
            right=RECOVERY_COLUMNS[1:],
        )
    )
    stopped = "".join(f"\n{line}" for line in _stopped(run))
    bounds = "".join(f"\n{line}" for p in run.phases[:1] for line in _bounds_lines(p) if line)
    return as_text(*parts) + f"\n{stopped}{bounds}\n\n{verdict(run)}"


def _md_table(columns, rows) -> str:
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _summary_line(run) -> str:
    requested = "as many failures as the duration allows" if run.requested is None else f"{run.requested} failures"
    duration = "" if run.budget.duration_s is None else f", a duration of {run.budget.duration_s / 60:.0f} min"
    return (
        f"Pipeline `{run.pipeline}`, seed {run.seed}, {requested}{duration}, recovery limit "
        f"{run.budget.recovery_limit_s:.0f} s; {len(run.outcomes)} failures in {run.seconds / 60:.1f} min."
    )


def markdown(run) -> str:
    lines = [
        f"# Restore drill of `{run.pipeline}`",
        "",
        _summary_line(run),
        "",
        f"**{verdict(run)}**",
        "",
        "## Recoveries",
        "",
        "From each failure to the next completed checkpoint; *restore p50 s*: from the failure to the start "
        "of the restore it caused (the runner noticed and chose a checkpoint; the rest of a recovery is the "
        "restore itself and the next checkpoint); *restores*: restores the failures caused; "
        "*replayed*: input records processed again (how far the job had read, less where each restore's "
        "checkpoint resumes). `recoveries.png` shows each one through the run.",
        "",
        _md_table(RECOVERY_COLUMNS, recovery_rows(_phases(run))),
    ]
    lines += [f"\n{line}" for line in _stopped(run)]
    for p in run.phases:
        lines += [
            "",
            f"## {p.mode}: job {p.job}",
            "",
            f"{p.mode} checkpoints, seed {p.seed}, {p.seconds:.0f} s, {p.produced} input records "
            f"({p.malformed} malformed on purpose), {p.checkpoints} checkpoints completed.",
            *_bounds_lines(p),
            "",
            f"**{_phase_verdict(p)}**",
            "",
            "### Failures",
            "",
            "*at s*: seconds into the phase; *restored from*: the checkpoint each restore it caused picked "
            "(start: the beginning) and why (the cause the store records); *restore s*: from the failure to "
            "the first of those restores starting; "
            "*recovered s*: from the failure to the next completed checkpoint; "
            "*replayed*: input records processed again.",
            "",
            _md_table(FAILURE_COLUMNS, failure_rows(p)),
            "",
            "### Expectations",
            "",
            "Run with great-expectations on the committed output joined with the reference Spark computed in "
            "batch from the input topics (`output`), on every checkpoint a coordinator reported complete "
            "(`checkpoints`), and on the records made malformed (`dead_letters`). GX's own results are in "
            "`gx-<suite>.json`, the tables they ran on in `<suite>.csv`.",
            "",
            _md_table(EXPECTATION_COLUMNS, expectation_rows(p)),
        ]
        if p.problems:
            lines += ["", "### Problems", ""] + [f"- {problem}" for problem in p.problems]
    return "\n".join(lines) + "\n"


def _bounds_lines(report) -> list[str]:
    """What the liveness kinds outlast, when the phase drilled one or ran with a shortened delivery timeout."""
    if not report.bounds.shortened and not any(f.kind in LIVENESS_KINDS for f in report.plan):
        return []
    return ["", f"The job's bounds: {report.bounds.describe()}."]


def chart(run, path: Path) -> Path | None:
    """Each recovery's time through the run (x: seconds into its phase,
    phases one after the other), one colour per kind, the p50 and p90 as
    lines; None when no failure recovered."""
    points = []
    offset = 0.0
    for p in run.phases:
        points += [(offset + o.at_s, o.recovered_s, o.failure.kind.value) for o in p.outcomes if o.recovered]
        offset += p.seconds
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # headless: files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    for kind in sorted({k for _, _, k in points}):
        xs = [x for x, _, k in points if k == kind]
        ax.scatter(xs, [y for _, y, k in points if k == kind], s=18, label=kind)
    times = [y for _, y, _ in points]
    for q, style in ((50, "--"), (90, ":")):
        # times is not empty (there are points), so it has percentiles
        ax.axhline(cast(float, percentile(times, q)), linestyle=style, color="grey", linewidth=1, label=f"p{q}")
    ax.set_xlabel("seconds into the drill")
    ax.set_ylabel("recovered, s")
    ax.set_title(f"spark-abs drill {run.pipeline}: {len(points)} recoveries")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _phase_json(report) -> dict:
    return {
        "job": report.job,
        "seed": report.seed,
        "mode": report.mode,
        "passed": report.passed,
        "verdict": _phase_verdict(report),
        "seconds": report.seconds,
        "produced": report.produced,
        "malformed": report.malformed,
        "checkpoints": report.checkpoints,
        "stopped": report.stopped,
        "problems": report.problems,
        "bounds": asdict(report.bounds),
        "failures": [
            {**asdict(o), "failure": {**asdict(o.failure), "kind": o.failure.kind.value}} for o in report.outcomes
        ],
        "expectations": [asdict(o) for suite in report.checks for o in suite.outcomes],
    }


def write(run, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for p in run.phases:
        where = directory if len(run.phases) == 1 else directory / str(p.mode)
        where.mkdir(parents=True, exist_ok=True)
        for suite in p.checks:
            path = where / f"gx-{suite.name}.json"
            path.write_text(json.dumps(suite.gx_json, indent=2, default=str) + "\n")
            written.append(path)
        for name, frame in p.frames.items():
            path = where / f"{name}.csv"
            frame.to_csv(path, index=False)
            written.append(path)
    recoveries = [dict(zip(RECOVERY_COLUMNS, row)) for row in recovery_rows(_phases(run))]
    summary = {
        "jobs": [p.job for p in run.phases],  # a job per mode drilled
        "job": run.phases[0].job if len(run.phases) == 1 else None,  # as a drill of one mode wrote it before
        "pipeline": run.pipeline,
        "seed": run.seed,
        "passed": run.passed,
        "verdict": verdict(run),
        "seconds": run.seconds,
        "requested": run.requested,
        "duration_s": run.budget.duration_s,
        "recovery_limit_s": run.budget.recovery_limit_s,
        "recoveries": recoveries,
        "phases": [_phase_json(p) for p in run.phases],
    }
    path = directory / "report.json"
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    written.append(path)
    path = directory / "report.md"
    path.write_text(markdown(run))
    written.append(path)
    drawn = chart(run, directory / "recoveries.png")
    if drawn is not None:
        written.append(drawn)
    return written

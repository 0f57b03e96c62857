"""What ``spark-abs drill`` shows and writes: a table of the failures (kind,
when, the checkpoint each restore picked, time to recover, input records
replayed), a table of the expectations (suite, what it checks, pass or
fail, what GX observed) and the verdict.  ``write`` puts in one directory
``report.md`` (the same, for a person), ``report.json`` (for a script),
``gx-<suite>.json`` (great-expectations' own validation results) and
``<suite>.csv`` (the tables the suites ran on)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from streaming.tools.views import as_text, titled_table

__all__ = ["failure_rows", "expectation_rows", "render", "markdown", "verdict", "write"]

FAILURE_COLUMNS = ("#", "kind", "what", "at s", "restored from", "recovered s", "replayed", "note")
EXPECTATION_COLUMNS = ("suite", "expectation", "column", "result", "observed")


def _restored(outcome) -> str:
    if not outcome.restored_from:
        return "-"
    return ", then ".join("start" if c is None else str(c) for c in outcome.restored_from)


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


def verdict(report) -> str:
    failed = [o for suite in report.checks for o in suite.outcomes if not o.success]
    kinds = sorted({o.failure.kind.value for o in report.outcomes})
    if report.passed:
        return (
            f"PASSED: {len(report.outcomes)} failures ({', '.join(kinds) or 'none'}), every one recovered, "
            f"every expectation met ({report.checkpoints} checkpoints, {report.produced} records in)"
        )
    reasons = [f"{o.suite}: {o.expectation} (observed {o.observed})" for o in failed] + list(report.problems)
    return "FAILED: " + "; ".join(reasons)


def render(report) -> str:
    """The report as text tables (what the command prints)."""
    return (
        as_text(
            titled_table(
                f"drill {report.job}: failures (seed {report.seed})",
                FAILURE_COLUMNS,
                failure_rows(report),
                right=("#",),
            ),
            titled_table("expectations (great-expectations)", EXPECTATION_COLUMNS, expectation_rows(report)),
        )
        + f"\n\n{verdict(report)}"
    )


def _md_table(columns, rows) -> str:
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report) -> str:
    lines = [
        f"# Restore drill {report.job}",
        "",
        f"Pipeline `{report.pipeline}`, {report.mode} checkpoints, seed {report.seed} "
        f"(`spark-abs drill --seed {report.seed}` draws the same failures), {report.seconds:.0f} s, "
        f"{report.produced} input records ({report.malformed} malformed on purpose), "
        f"{report.checkpoints} checkpoints completed.",
        "",
        f"**{verdict(report)}**",
        "",
        "## Failures",
        "",
        "*at s*: seconds into the drill; *restored from*: the checkpoint each restore it caused picked "
        "(start: the beginning); *recovered s*: from the failure to the next completed checkpoint; "
        "*replayed*: input records processed again (how far the job had read, less where the checkpoint resumes).",
        "",
        _md_table(FAILURE_COLUMNS, failure_rows(report)),
        "",
        "## Expectations",
        "",
        "Run with great-expectations on the committed output joined with the reference Spark computed in "
        "batch from the input topic (`output`), on every checkpoint a coordinator reported complete "
        "(`checkpoints`), and on the records made malformed (`dead_letters`). GX's own results are in "
        "`gx-<suite>.json`, the tables they ran on in `<suite>.csv`.",
        "",
        _md_table(EXPECTATION_COLUMNS, expectation_rows(report)),
    ]
    if report.problems:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in report.problems]
    return "\n".join(lines) + "\n"


def write(report, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for suite in report.checks:
        path = directory / f"gx-{suite.name}.json"
        path.write_text(json.dumps(suite.gx_json, indent=2, default=str) + "\n")
        written.append(path)
    for name, frame in report.frames.items():
        path = directory / f"{name}.csv"
        frame.to_csv(path, index=False)
        written.append(path)
    summary = {
        "job": report.job,
        "seed": report.seed,
        "mode": report.mode,
        "pipeline": report.pipeline,
        "passed": report.passed,
        "verdict": verdict(report),
        "seconds": report.seconds,
        "produced": report.produced,
        "malformed": report.malformed,
        "checkpoints": report.checkpoints,
        "problems": report.problems,
        "failures": [
            {**asdict(o), "failure": {**asdict(o.failure), "kind": o.failure.kind.value}} for o in report.outcomes
        ],
        "expectations": [asdict(o) for suite in report.checks for o in suite.outcomes],
    }
    path = directory / "report.json"
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    written.append(path)
    path = directory / "report.md"
    path.write_text(markdown(report))
    written.append(path)
    return written

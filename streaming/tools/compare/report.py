"""What ``spark-abs compare`` shows: two rich tables (checkpoint times with
their ratios; what the checkpoints stored, throughput and the restore), the
ratios in words, and three PNG charts, each with a legend under it that
says how to read it.  ``write`` puts all of it, with the JSON of every
checkpoint, in one directory."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from barriers.coordinator import CheckpointStatus
from streaming.tools.compare.model import Comparison, Run
from streaming.tools.views import as_text, byte_size, titled_table

__all__ = ["render_tables", "print_tables", "summary", "chart", "write", "CHARTS"]

CHARTS = ("checkpoint-times.png", "timeline.png", "bytes.png")
_LEGENDS = {
    "checkpoint-times.png": (
        "Checkpoint time (trigger to complete), log scale: the dot is the median, the bar reaches the 90th "
        "and the tick the 99th percentile. Checkpoints still running when the run ended count at how long "
        "they had run (a lower bound)."
    ),
    "timeline.png": (
        "Each checkpoint's time (log scale) against when it was triggered. A growing line is a growing "
        "backlog in front of the barriers; hollow markers ran past the end of the run (lower bounds), "
        "crosses were aborted."
    ),
    "bytes.png": (
        "Medians per checkpoint, log scale (a missing bar is zero): operator state written, channel state "
        "kept as offset ranges (records × mean record size) and copied into the snapshot, and the most "
        "bytes held while aligning."
    ),
}


def _n(value: float | None, digits: int = 2) -> str | None:
    return None if value is None else f"{value:.{digits}f}"


def _size(value: float | None) -> str | None:
    return None if value is None else byte_size(value)


def _ratio(value: float | None) -> str | None:
    return None if value is None else f"{value:.3g}"


def _point(comparison: Comparison, run: Run) -> str:
    return comparison.workload.label(run.point)


def render_tables(comparison: Comparison) -> str:
    base = comparison.variants[0]
    times = titled_table(
        f"checkpoint time, trigger to complete (seconds; ÷ {base}: median over {base}'s median, same run)",
        ("point", "variant", "done", "pending", "aborted", "p50", "p90", "p99", f"÷ {base}", "first barrier", "align"),
        (
            (
                _point(comparison, r),
                r.variant,
                r.count(CheckpointStatus.COMPLETED),
                r.count(CheckpointStatus.PENDING),
                r.count(CheckpointStatus.ABORTED),
                _n(r.percentile(50)),
                _n(r.percentile(90)),
                _n(r.percentile(99)),
                _ratio(comparison.ratio(r.variant, r.point)),
                _n(r.median("first_barrier_s")),
                _n(r.median("alignment_s")),
            )
            for r in comparison.runs
        ),
        right=("done", "pending", "aborted", "p50", "p90", "p99", f"÷ {base}", "first barrier", "align"),
    )
    stored = titled_table(
        "what the checkpoints kept (medians per checkpoint; held: the most), records read per second, "
        "and a restore from the latest checkpoint (seconds until running, until its channel state was replayed)",
        (
            "point",
            "variant",
            "state",
            "in flight",
            "≈ bytes",
            "copied",
            "held max",
            "rec/s",
            "restore",
            "replayed",
            "replay recs",
            "switched",
        ),
        (
            (
                _point(comparison, r),
                r.variant,
                byte_size(r.median("state_bytes") or 0) if r.median("state_bytes") is not None else None,
                None if r.median("in_flight_records") is None else f"{r.median('in_flight_records'):.0f}",
                None if r.in_flight_bytes_referenced is None else byte_size(r.in_flight_bytes_referenced),
                _size(r.median("in_flight_bytes_copied")),
                _size(r.most("held_bytes_max")),
                None if r.records_per_s is None else f"{r.records_per_s:.0f}",
                _n(r.restore.ready_s, 1) if r.restore else None,
                (_n(r.restore.replayed_s, 1) or "not in time") if r.restore else None,
                r.restore.replay_records if r.restore else None,
                "; ".join(f"{n}× {why}" for why, n in sorted(r.switch_reasons.items())) or None,
            )
            for r in comparison.runs
        ),
        right=("state", "in flight", "≈ bytes", "copied", "held max", "rec/s", "restore", "replayed", "replay recs"),
    )
    return as_text(times, stored, "\n".join(summary(comparison)))


def summary(comparison: Comparison) -> list[str]:
    """The ratios in words: each variant's median checkpoint time over the
    baseline's, and aligned-timeout's over unaligned's, per point."""
    lines = []
    base = comparison.variants[0]
    for point in comparison.points:
        where = comparison.workload.label(point)
        for variant in comparison.variants[1:]:
            ratio = comparison.ratio(variant, point)
            if ratio is not None:
                lines.append(f"{where}: {variant} took {ratio:.3g} × the time of {base} (p50)")
        if {"aligned-timeout", "unaligned"} <= set(comparison.variants):
            ratio = comparison.ratio_to("aligned-timeout", "unaligned", point)
            if ratio is not None:
                lines.append(f"{where}: aligned-timeout took {ratio:.3g} × the time of unaligned (p50)")
        if {"aligned", "unaligned"} <= set(comparison.variants) and base != "aligned":
            ratio = comparison.ratio_to("aligned", "unaligned", point)
            if ratio is not None:
                lines.append(f"{where}: aligned took {ratio:.3g} × the time of unaligned (p50)")
    return lines


def print_tables(comparison: Comparison) -> None:
    print(render_tables(comparison))


# --------------------------------------------------------------------------
# charts


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: files only
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, name: str, out: Path) -> Path:
    fig.text(0.01, 0.01, _LEGENDS[name], wrap=True, fontsize=8, va="bottom", ha="left")
    fig.subplots_adjust(bottom=min(0.26, 1.35 / fig.get_figheight()))  # room for the x labels and the legend
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chart(comparison: Comparison, name: str, out: Path) -> Path:
    """Draw chart ``name`` (one of ``CHARTS``) into ``out``."""
    plt = _pyplot()
    title = f"spark-abs compare: {comparison.workload.kind}"
    draw = {
        "checkpoint-times.png": _checkpoint_times,
        "timeline.png": _timeline,
        "bytes.png": _bytes,
    }.get(name)
    if draw is None:
        raise ValueError(f"unknown chart {name!r} (known: {', '.join(CHARTS)})")
    return _finish(plt, draw(plt, comparison, title), name, out)


def _checkpoint_times(plt, comparison: Comparison, title: str):
    """Checkpoint time per variant: p50 to p90 as a bar, p99 as a dash; per workload point."""
    fig, ax = plt.subplots(figsize=(8, 5.2))
    points = comparison.points
    categorical = len(points) == 1
    for index, variant in enumerate(comparison.variants):
        runs = [r for r in (comparison.run(variant, p) for p in points) if r is not None and r.durations()]
        if not runs:
            continue
        xs = [index if categorical else r.point for r in runs]
        # every run here has checkpoint times, so it has percentiles
        p50 = [cast(float, r.percentile(50)) for r in runs]
        p90 = [cast(float, r.percentile(90)) for r in runs]
        p99 = [cast(float, r.percentile(99)) for r in runs]
        line = ax.errorbar(
            xs, p50, yerr=[[0] * len(runs), [b - a for a, b in zip(p50, p90)]], marker="o", capsize=0, label=variant
        )
        ax.scatter(xs, p99, marker="_", s=120, color=line[0].get_color())
    if categorical:
        ax.set_xticks(range(len(comparison.variants)), comparison.variants)
        ax.set_xlabel(comparison.workload.label(points[0]) if points else "")
    else:
        ax.set_xscale("log")
        ax.set_xticks(points, [f"{p:g}" for p in points])
        ax.set_xlabel(comparison.axis)
    ax.set_yscale("log")
    ax.set_ylabel("checkpoint time, s")
    ax.set_title(f"{title}: checkpoint time per variant")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def _timeline(plt, comparison: Comparison, title: str):
    """Every checkpoint's time against when it was triggered, one panel per workload point."""
    points = comparison.points if comparison.workload.continuous else [None]
    fig, axes = plt.subplots(len(points), 1, figsize=(8, 2.6 + 2.4 * len(points)), squeeze=False)
    for ax, point in zip(axes[:, 0], points):
        for variant in comparison.variants:
            runs = [r for r in comparison.runs if r.variant == variant and (point is None or r.point == point)]
            samples = sorted((s for r in runs for s in r.samples), key=lambda s: s.at_s)
            if not samples:
                continue
            done = [s for s in samples if s.status is CheckpointStatus.COMPLETED]
            (line,) = ax.plot([s.at_s for s in done], [s.duration_s for s in done], marker=".", label=variant)
            # still running at the end: hollow; aborted: a cross
            styles = {
                CheckpointStatus.PENDING: {"facecolors": "none", "edgecolors": line.get_color()},
                CheckpointStatus.ABORTED: {"marker": "x", "color": line.get_color()},
            }
            for status, style in styles.items():
                marked = [s for s in samples if s.status is status]
                ax.scatter([s.at_s for s in marked], [max(s.duration_s, 1e-3) for s in marked], **style)
        ax.set_yscale("log")
        ax.set_ylabel("checkpoint time, s")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(comparison.workload.label(point) if point is not None else "rounds", fontsize=9)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("triggered at, s after the measured run began")
    fig.suptitle(f"{title}: checkpoint times during the run")
    return fig


def _bytes(plt, comparison: Comparison, title: str):
    """What a checkpoint keeps, per run: state, in flight (referenced, copied), held while aligning."""
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(comparison.runs)), 5.2))
    series = (
        ("state", lambda r: r.median("state_bytes")),
        ("in flight (ranges)", lambda r: r.in_flight_bytes_referenced),
        ("in flight (copied)", lambda r: r.median("in_flight_bytes_copied")),
        ("held while aligning", lambda r: r.most("held_bytes_max")),
    )
    runs = [r for r in comparison.runs if r.samples]
    width = 0.8 / len(series)
    for index, (label, value) in enumerate(series):
        xs = [i + (index - (len(series) - 1) / 2) * width for i in range(len(runs))]
        ax.bar(xs, [value(r) or 0 for r in runs], width, label=label)
    ax.set_xticks(range(len(runs)), [f"{r.variant}\n{_point(comparison, r)}" for r in runs], fontsize=7, rotation=0)
    ax.set_yscale("log")
    ax.set_ylim(bottom=1)
    ax.set_ylabel("bytes")
    ax.set_title(f"{title}: what a checkpoint keeps, per variant")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def write(comparison: Comparison, out: Path) -> list[Path]:
    """The JSON of every checkpoint, the tables as text and the charts, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "comparison.json", out / "tables.txt"]
    written[0].write_text(comparison.to_json())
    written[1].write_text(render_tables(comparison) + "\n")
    written += [chart(comparison, name, out) for name in CHARTS]
    return written


def write_and_show(comparison: Comparison, out: Path) -> None:
    """The JSON, the tables and the charts into ``out``; the tables and what was written shown."""
    written = write(comparison, out)
    print()
    print_tables(comparison)
    print(f"\n{len(comparison.runs)} jobs, {comparison.seconds:.0f} s; written to {out}:")
    for path in written:
        print(f"  {path.name}")

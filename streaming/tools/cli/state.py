"""``spark-abs state``: a checkpoint's operator or channel state as tables, printed or exported."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streaming.tools.cli.options import add_store_options, open_checkpoints

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "state",
        help="a checkpoint's operator state and channel state as tables (print, or export)",
        description="Reads checkpoint N's operator state tables (or, with --channels, its "
        "unaligned channel state: copied records and ranges read back from Kafka while "
        "it holds them, stale older-generation records marked) and prints a sample of "
        "each, or writes them to --output (.parquet or .csv; with several tables, one "
        "file each, named after the table). From Python: streaming.tools.checkpoints.inspection."
        "Checkpoints (Arrow tables; to_spark for Spark DataFrames and SQL).",
    )
    parser.add_argument("checkpoint", type=int, metavar="N", help="checkpoint id")
    add_store_options(parser)
    parser.add_argument("--task", help="only this task")
    parser.add_argument("--table", help="only this state table")
    parser.add_argument("--channels", action="store_true", help="channel state instead of operator state")
    parser.add_argument("--rows", type=int, default=10, help="rows shown per table (default 10)")
    parser.add_argument("--output", help="write to this .parquet or .csv file instead of printing a sample")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.tools import views

    checkpoints, _ = open_checkpoints(args, kafka=args.channels)
    with checkpoints:
        if args.channels:
            channels = checkpoints.channel_state(args.checkpoint, task=args.task, progress=log.info)
            tables = {"records": channels.records, "rows": channels.rows}
            text = views.render_channels(channels.records, channels.rows, channels.problems, args.rows)
        else:
            tables = checkpoints.state(args.checkpoint, task=args.task, table=args.table)
            text = views.render_state(tables, args.rows)
    if args.output:
        for path in _export(tables, Path(args.output)):
            log.info(f"wrote {path}")
    else:
        print(text)
    return 0


def _export(tables: dict, output: Path) -> list[Path]:
    """Each table to ``output`` (one table) or ``<stem>-<name><suffix>`` (several)."""
    import json

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    import pyarrow.types as pat

    from streaming.errors import ConfigError

    if output.suffix not in (".parquet", ".csv"):
        raise ConfigError(f"--output must end in .parquet or .csv, got {output.name}")
    written = []
    for name, table in tables.items():
        path = output if len(tables) == 1 else output.with_name(f"{output.stem}-{name}{output.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        if output.suffix == ".parquet":
            pq.write_table(table, path)
        else:  # CSV takes flat columns: nested ones (record headers) go as JSON text
            columns = {
                c: pa.array([json.dumps(v, default=str) for v in table[c].to_pylist()], pa.string())
                if pat.is_nested(table.schema.field(c).type)
                else table[c]
                for c in table.column_names
            }
            pacsv.write_csv(pa.table(columns), path)
        written.append(path)
    return written

"""The ``spark-abs`` parser: the options every command takes (``--home``,
``-v``), then a sub-parser per command, each registered by its own module;
``main`` parses the command line once and runs the command.  Errors of the
project print as one clear line (exit 2); anything else is a bug and keeps
its traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from streaming import console
from streaming.errors import SparkAbsError
from streaming.tools.cli import (
    checkpoints,
    compare,
    dead_letters,
    demo,
    drill,
    local,
    restore,
    run,
    simulate,
    smoke,
    state,
    ui,
    worker,
)

__all__ = ["main", "build_parser", "COMMANDS"]

# every command's module, in the order --help lists them
COMMANDS = (
    local,
    smoke,
    demo,
    run,
    worker,
    checkpoints,
    state,
    restore,
    dead_letters,
    ui,
    compare,
    drill,
    simulate,
)

DESCRIPTION = """\
spark-abs: Asynchronous Barrier Snapshots (Chandy-Lamport) for pipelines of
PySpark Structured Streaming queries joined by Kafka topics.

Everything runs on loopback.  `spark-abs local up` starts a Kafka broker (KRaft)
and an S3 API server (versitygw) from artifacts it fetches once into the cache
($SPARK_ABS_HOME, default ~/.cache/spark-abs); the connection details go to
<home>/runtime/connection.json, which every other command reads.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-abs", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--home", help="cache and state directory (default: $SPARK_ABS_HOME or ~/.cache/spark-abs)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def _no_kafka_chatter(record: logging.LogRecord) -> bool:
    return not record.name.startswith("kafka") or record.levelno >= logging.CRITICAL


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    console.install("[spark-abs] ", verbose=args.verbose)
    if not args.verbose:
        # kafka-python logs every lost connection and retry of its own (a line every few ms while a
        # broker is down); spark-abs says itself what it waits for and fails with a clear error.  Kept
        # off the console, not silenced: streaming.adapters.kafka.clients reads Kafka's refusals there
        for handler in logging.getLogger().handlers:
            handler.addFilter(_no_kafka_chatter)
    try:
        return args.func(args)
    except SparkAbsError as exc:
        print(f"spark-abs: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spark-abs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

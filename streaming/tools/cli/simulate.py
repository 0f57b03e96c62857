"""``spark-abs simulate``: a simulated snapshot run told in words
(``barriers.simulation.narrate``, whose options it takes)."""

from __future__ import annotations

import argparse
import sys

from barriers.simulation import narrate

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate",
        help="narrate a simulated snapshot run",
        description=narrate.DESCRIPTION,
        epilog=narrate.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    narrate.add_arguments(parser)
    parser.set_defaults(func=lambda args: run(args, parser))


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    wrong = narrate.problem(args)
    if wrong:
        parser.error(wrong)
    return narrate.tell(args, sys.stdout)

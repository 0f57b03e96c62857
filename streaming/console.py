"""What a person running a command sees of the log.

Library code only logs: ``log.info`` for the lines a person should see,
``log.warning`` for problems, ``log.debug`` for the rest.  Each command's
entry point (``spark-abs``, the worker process, ``python -m benchmarks``)
calls ``install`` once, which shows the lines that spark-abs's own loggers
(``LOGGERS``) log at INFO and above as its output: the command's prefix and
the message, on stdout, flushed at once::

    [demo] checkpoint 3: balances -120, in flight +120 -> money conserved

Everything else logged (other libraries' warnings; with ``verbose``, every
DEBUG line) goes to stderr with its time, level and logger."""

from __future__ import annotations

import logging
import sys

__all__ = ["LOGGERS", "install"]

# the loggers whose lines (INFO and above) are a command's output
LOGGERS = ("streaming", "benchmarks")
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Console(logging.Handler):
    """``prefix`` and the message on stdout (whatever ``sys.stdout`` is at the
    time), flushed at once."""

    def __init__(self, prefix: str):
        super().__init__(logging.INFO)
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.prefix + self.format(record), file=sys.stdout, flush=True)
        except BrokenPipeError:  # output piped into `head`: the command ends as on a print
            raise
        except Exception:
            self.handleError(record)


def _on_console(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.INFO and record.name.partition(".")[0] in LOGGERS


def install(prefix: str = "", *, verbose: bool = False) -> None:
    """Show the INFO lines (warnings and errors too) of ``LOGGERS`` on stdout,
    each after ``prefix`` (``"[demo] "``; none by default); and, unless the
    root logger has a handler already, log everything else at WARNING and
    above (with ``verbose``: DEBUG) on stderr.  Idempotent: called again (a
    command that runs another's main), it changes the prefix only, and turns
    ``verbose`` on but never off."""
    root = logging.getLogger()
    if verbose:
        root.setLevel(logging.DEBUG)
    if not root.handlers:
        stderr = logging.StreamHandler()
        stderr.setFormatter(logging.Formatter(_LOG_FORMAT))
        stderr.addFilter(lambda record: not _on_console(record))
        root.addHandler(stderr)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        console = next((h for h in logger.handlers if isinstance(h, _Console)), None)
        if console is None:
            logger.addHandler(_Console(prefix))
        else:
            console.prefix = prefix
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)

"""The ``spark-abs`` command line: one parser (``main``), a module per
command that registers its options and runs it, and the options the
commands share (``options``).

- ``main``: ``build_parser`` and ``main``, the entry point;
- ``options``: options by concern (the home and runtime, the store, a job's
  checkpoints and how it runs, metrics) and what they make;
- ``local``: the embedded runtime, up, down, status;
- ``smoke``: the smoke pipeline;
- ``demo``: the money-in-transit demo;
- ``run``: a pipeline run with checkpoints;
- ``worker``: one remote worker group;
- ``checkpoints``: a job's checkpoints listed, shown, compared, verified, collected;
- ``state``: a checkpoint's state as tables;
- ``restore``: a restore, or what one would do;
- ``dead_letters``: a job's dead letters, each once;
- ``ui``: the web page of a job;
- ``compare``: aligned vs unaligned side by side;
- ``drill``: a restore drill;
- ``simulate``: a simulated snapshot told in words.

``python -m streaming.tools.cli`` runs it as ``spark-abs`` does (``__main__``)."""

from streaming.tools.cli.main import build_parser, main

__all__ = ["main", "build_parser"]

"""``spark-abs smoke`` (its command: ``streaming.tools.cli.smoke``):

- ``run``: the smoke pipeline, one pass through every real part the engine stands on;
- ``report``: what it reports (``SmokeReport``)."""

"""``spark-abs demo`` (its command: ``streaming.tools.cli.demo``):

- ``run``: the money-in-transit pipeline run, a worker killed and the job restored, every checkpoint's money checked;
- ``report``: what it reports (``DemoReport``)."""

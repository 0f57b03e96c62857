"""Restore drills (``spark-abs drill``): a job run on a workload, failures
injected at moments drawn from a seed, its output checked at the end.

- ``run``: ``Drill`` and ``run_drill``, the drill from start to report;
- ``settings``: ``DrillSettings``, what a drill does;
- ``plan``: the failure kinds and the schedule drawn from the seed;
- ``workload``: what a pipeline is fed and what its checks expect;
- ``feed``: the workload produced while the job runs, and its progress;
- ``job``: the drilled job's ``spark-abs run`` process and its workers;
- ``failures``: injecting each failure kind;
- ``poison``: the records no schema expected that the poison kind appends;
- ``cluster``: the failure kinds of the local cluster;
- ``verify``: the checks once the job drained;
- ``checks``: the output and dead letters checked with great-expectations;
- ``report``: the drill's report, tables and chart."""
